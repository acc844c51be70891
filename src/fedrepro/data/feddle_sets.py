"""Feddle's data sets beyond the vision tables: CIFAR-100 under its 20 superclasses, FEMNIST and CelebA.

``cifar100_coarse``: CIFAR-100 from the same official archive as ``cifar100``, labelled with its 20
superclasses (``coarse_labels``). Feddle partitions it "with respect to the 100 fine classes": the fine
labels are stored as the extra array ``partition_labels_train`` (and ``_test``), which the partition step
draws label-skew partitions over, while the clients learn the coarse labels.

``femnist``: LEAF's FEMNIST, NIST Special Database 19 grouped by writer. ``by_write.zip`` holds every
writer's forms as ``by_write/hsf_<k>/<writer>/<form type>/<image>.png`` with no class in the names;
``by_class.zip`` holds the same PNGs as ``by_class/<hex ASCII code>/hsf_<k>/<image>.png``. As LEAF does, a
by_write image gets its class from the by_class image with the same bytes (md5 of the file); the
``train_<code>`` folders of by_class duplicate the hsf ones and are not read. Classes follow LEAF's order
(0-9, A-Z, a-z = 0..61) and Feddle keeps "the first 40 classes": the digits 0-9, the upper-case A-Z and
the lower-case a, b, c, d. Images are 128x128 binary scans, converted to 8-bit grey and resized to 28x28
with Lanczos filtering (LEAF's thumbnail), polarity kept (dark strokes on white, as LEAF).

``celeba_smiling``: CelebA (Liu et al. 2015) from the files a person downloads by hand (Google Drive,
non-commercial research licence): the aligned-and-cropped 178x218 JPEGs ``img_align_celeba.zip``,
``list_attr_celeba.txt`` and ``identity_CelebA.txt``. Label: the ``Smiling`` attribute (1 -> 1, -1 -> 0).
Images are resized whole (aspect not kept) to 32x32 colour, the side of Feddle's CNN; LEAF resizes to
84x84 the same way, and the ResNet/ViT settings upsample anyway. ``list_eval_partition.txt`` is not
needed: LEAF splits each person's images, not CelebA's identity-disjoint official split.

Both LEAF sets, as LEAF builds them: writers / people with at least ``FEMNIST_MIN_SAMPLES`` (LEAF keeps
users with >= 2 to split them) / ``CELEBA_MIN_SAMPLES`` images (LEAF's threshold of 5) are eligible; Feddle
"randomly sample[s] 1000 clients", so ``CLIENTS`` = 1000 of them are drawn with a fixed seed (``select=
"largest"`` keeps the 1000 with the most samples instead); each one's samples are split 90/10 at random
into train and test (LEAF's per-user sample split, ``--tf 0.9``). Train and test are stored writer by
writer (writers in name order) with the writer's index in ``meta["writers"]`` as the extra arrays
``groups_train`` / ``groups_test``; the partition kind ``writer`` makes each writer one client. The
fixed seeds are part of each data set's definition, never a run's seed.
"""

from __future__ import annotations

import hashlib
import string
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from fedrepro.data.download import DownloadError, check_placed, fetch
from fedrepro.data.images import decode_image
from fedrepro.data.vision import SOURCES, prepare_cifar100, raw_file

# Arrays plus the extra per-sample arrays (fedrepro.data.format.EXTRA_ARRAYS)
ArraysWithExtras = tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, dict[str, Any], dict[str, np.ndarray]]

CLIENTS = 1000
TRAIN_FRACTION = 0.9
SELECT_SEED = 1000  # which writers / people are kept
SPLIT_SEED = 90  # each one's train/test split

# ---------------------------------------------------------------- CIFAR-100, 20 superclasses

CIFAR100_FILE = "cifar-100-python.tar.gz"


def prepare_cifar100_coarse(raw_dir: Path) -> ArraysWithExtras:
    """CIFAR-100 labelled by its 20 superclasses, its 100 fine labels kept to partition over."""
    x_tr, fine_tr, x_te, fine_te, fine_meta = prepare_cifar100(raw_dir)
    to_coarse = np.asarray(fine_meta["fine_to_coarse"], dtype=np.int64)
    if np.any(to_coarse < 0):
        raise ValueError(f"{Path(raw_dir) / CIFAR100_FILE}: fine classes {np.flatnonzero(to_coarse < 0).tolist()} "
                         "have no sample, so their superclass is unknown")
    meta = {"name": "cifar100_coarse", "num_classes": len(fine_meta["coarse_classes"]),
            "classes": fine_meta["coarse_classes"], "shape": fine_meta["shape"],
            "partition_classes": fine_meta["classes"], "fine_to_coarse": fine_meta["fine_to_coarse"],
            "partition_labels": "the 100 fine labels (partition_labels_train); y is their superclass",
            "source": fine_meta["source"], "license": fine_meta["license"]}
    extras = {"partition_labels_train": fine_tr, "partition_labels_test": fine_te}
    return x_tr, to_coarse[fine_tr], x_te, to_coarse[fine_te], meta, extras


# ---------------------------------------------------------------- FEMNIST (NIST SD19)

NIST_BASE = "https://s3.amazonaws.com/nist-srd/SD19/"
BY_CLASS, BY_WRITE = "by_class.zip", "by_write.zip"
# NIST prints no checksum; these md5 sums are the ones LEAF-style loaders pin and check their NIST downloads
# against, e.g. vaseline555/Federated-Learning-in-PyTorch (src/datasets/leaf/leaf_utils.py)
FEMNIST_MD5 = {BY_CLASS: "79572b1694a8506f2b722c7be54130c4", BY_WRITE: "a29f21babf83db0bb28a2f77b2b456cb"}
FEMNIST_FILES = tuple(FEMNIST_MD5)
NIST_LICENSE = ("NIST Special Database 19 (Grother & Hanaoka 2016), public domain (U.S. Government work); "
                "FEMNIST grouping: LEAF (Caldas et al. 2018)")
LEAF_CLASSES = string.digits + string.ascii_uppercase + string.ascii_lowercase  # LEAF's class ids 0..61
FEMNIST_CLASSES = 40  # Feddle's "first 40 classes": 0-9, A-Z, a-d
FEMNIST_SIDE = 28
FEMNIST_MIN_SAMPLES = 2


def download_femnist(raw_dir: Path, mirror: str | None = None,
                     checksums: dict[str, str] | None = None) -> list[Path]:
    """by_class.zip and by_write.zip from NIST into raw_dir, checked against FEMNIST_MD5 (``checksums``
    overrides them by name). ``mirror``: a base URL serving both files by name."""
    checksums = checksums or {}
    base = (mirror or NIST_BASE).rstrip("/") + "/"
    try:
        return [fetch(base + f, Path(raw_dir) / f, checksums.get(f, md5)) for f, md5 in FEMNIST_MD5.items()]
    except DownloadError as e:
        raise DownloadError(f"femnist: {e}") from e


def leaf_class(code: str, where: str) -> int:
    """LEAF's class id of a by_class folder name, a hex ASCII code ('30' -> 0, '41' -> 10, '61' -> 36)."""
    try:
        char = chr(int(code, 16))
    except ValueError:
        raise ValueError(f"{where}: class folder {code!r} is not a hex character code") from None
    if char not in LEAF_CLASSES:
        raise ValueError(f"{where}: class folder {code!r} is {char!r}, not a digit or a letter")
    return LEAF_CLASSES.index(char)


def _open_zip(path: Path) -> zipfile.ZipFile:
    try:
        return zipfile.ZipFile(path)
    except (zipfile.BadZipFile, OSError) as e:
        raise ValueError(f"{path}: not a readable zip ({e})") from None


def _pngs(zf: zipfile.ZipFile, root: str, depth: int) -> Iterator[tuple[str, list[str]]]:
    """(member name, its path parts) of every .png ``depth`` folders below ``root``."""
    for info in zf.infolist():
        parts = info.filename.split("/")
        if not info.is_dir() and len(parts) == depth + 2 and parts[0] == root and parts[-1].lower().endswith(".png"):
            yield info.filename, parts


def _digest(data: bytes) -> bytes:
    return hashlib.md5(data, usedforsecurity=False).digest()


def femnist_classes_by_hash(by_class: Path) -> dict[bytes, int]:
    """md5 digest of each by_class/<code>/hsf_<k>/ image -> LEAF class id (-1: the same bytes under two
    classes, which labels nothing)."""
    classes: dict[bytes, int] = {}
    with _open_zip(by_class) as zf:
        for name, parts in _pngs(zf, "by_class", 2):
            if not parts[2].startswith("hsf_"):
                continue  # train_<code>/ repeats the hsf_<k>/ images
            label = leaf_class(parts[1], f"{by_class} member {name}")
            key = _digest(zf.read(name))
            classes[key] = label if classes.get(key, label) == label else -1
    if not classes:
        raise ValueError(f"{by_class}: no images under by_class/<code>/hsf_<k>/; is this NIST SD19 by_class.zip?")
    return classes


def prepare_femnist(raw_dir: Path, clients: int = CLIENTS, select: str = "random") -> ArraysWithExtras:
    """FEMNIST's first 40 classes, ``clients`` writers (see the module docstring), 28x28 grey."""
    raw_dir = Path(raw_dir)
    by_class, by_write = raw_file(raw_dir, BY_CLASS), raw_file(raw_dir, BY_WRITE)
    classes = femnist_classes_by_hash(by_class)
    samples: dict[str, list[tuple[str, int]]] = {}
    counts = {"unmatched": 0, "ambiguous": 0, "other_classes": 0}
    with _open_zip(by_write) as zf:
        for name, parts in _pngs(zf, "by_write", 3):
            label = classes.get(_digest(zf.read(name)))
            if label is None or label < 0:
                counts["unmatched" if label is None else "ambiguous"] += 1
            elif label >= FEMNIST_CLASSES:
                counts["other_classes"] += 1
            else:
                samples.setdefault(parts[2], []).append((name, label))
        if not samples:
            raise ValueError(f"{by_write}: no image under by_write/hsf_<k>/<writer>/<type>/ matches an image of the "
                             f"first {FEMNIST_CLASSES} classes in {BY_CLASS} ({counts}); are these NIST SD19's zips?")
        chosen, split = select_and_split(samples, clients, FEMNIST_MIN_SAMPLES, select, f"{by_write}")
        images = {part: _stack([decode_image(zf.read(n), f"{by_write} member {n}", FEMNIST_SIDE, grey=True,
                                             resample="lanczos")[..., None]
                                for n, _, _ in items], (FEMNIST_SIDE, FEMNIST_SIDE, 1))
                  for part, items in split.items()}
    meta = {"name": "femnist", "num_classes": FEMNIST_CLASSES, "classes": list(LEAF_CLASSES[:FEMNIST_CLASSES]),
            "shape": [FEMNIST_SIDE, FEMNIST_SIDE, 1], "writers": chosen, "writer_selection": select,
            "eligible_writers": sum(len(v) >= FEMNIST_MIN_SAMPLES for v in samples.values()),
            "skipped_images": counts, "source": NIST_BASE + BY_WRITE, "license": NIST_LICENSE}
    return _with_groups(images, split, meta)


# ---------------------------------------------------------------- writers / people: selection and split


def select_and_split(samples: dict[str, list[tuple[str, int]]], clients: int, min_samples: int, select: str,
                     where: str) -> tuple[list[str], dict[str, list[tuple[str, int, int]]]]:
    """Keep ``clients`` of the writers with >= ``min_samples`` samples (all of them when fewer are
    eligible), drawn at random (``select="random"``, seed SELECT_SEED) or those with the most samples
    (``"largest"``, ties by name); split each one's samples TRAIN_FRACTION / rest at random (SPLIT_SEED).

    Returns the kept writers in name order and, per split, (item, label, writer index) writer by writer,
    each writer's items in name order.
    """
    if select not in ("random", "largest"):
        raise ValueError(f"{where}: select must be 'random' or 'largest', got {select!r}")
    eligible = sorted(w for w, items in samples.items() if len(items) >= min_samples)
    if not eligible:
        raise ValueError(f"{where}: no writer has >= {min_samples} usable samples")
    if len(eligible) <= clients:
        chosen = eligible
    elif select == "random":
        rng = np.random.default_rng(SELECT_SEED)
        chosen = sorted(eligible[i] for i in rng.choice(len(eligible), clients, replace=False))
    else:
        chosen = sorted(sorted(eligible, key=lambda w: (-len(samples[w]), w))[:clients])
    rng = np.random.default_rng(SPLIT_SEED)
    split: dict[str, list[tuple[str, int, int]]] = {"train": [], "test": []}
    for index, writer in enumerate(chosen):
        items = sorted(samples[writer])
        n_train = max(1, int(TRAIN_FRACTION * len(items)))  # >= 1 test sample too, as len(items) >= 2
        in_train = np.zeros(len(items), dtype=bool)
        in_train[rng.permutation(len(items))[:n_train]] = True
        for (item, label), train in zip(items, in_train, strict=True):
            split["train" if train else "test"].append((item, label, index))
    return chosen, split


def _stack(images: list[np.ndarray], shape: tuple[int, ...]) -> np.ndarray:
    return np.stack(images) if images else np.zeros((0, *shape), np.uint8)


def _with_groups(images: dict[str, np.ndarray], split: dict[str, list[tuple[str, int, int]]],
                 meta: dict[str, Any]) -> ArraysWithExtras:
    y = {part: np.array([label for _, label, _ in items], dtype=np.int64) for part, items in split.items()}
    groups = {f"groups_{part}": np.array([w for _, _, w in items], dtype=np.int64) for part, items in split.items()}
    return images["train"], y["train"], images["test"], y["test"], meta, groups


# ---------------------------------------------------------------- CelebA, Smiling

CELEBA_ZIP, CELEBA_ATTR, CELEBA_IDENTITY = "img_align_celeba.zip", "list_attr_celeba.txt", "identity_CelebA.txt"
# md5 of the official Google Drive files, as torchvision's CelebA pins them
CELEBA_MD5 = {CELEBA_ZIP: "00d2c5bc6d35e252742224ab0c1e8fcb", CELEBA_ATTR: "75e246fa4810816ffd6ee81facbd244c",
              CELEBA_IDENTITY: "32bd1bd63d3c78cd57e08160ec5ed1e2"}
CELEBA_FILES = tuple(CELEBA_MD5)
CELEBA_HOME = "https://mmlab.ie.cuhk.edu.hk/projects/CelebA.html"
CELEBA_LICENSE = "Liu, Luo, Wang & Tang 2015 (CelebA); non-commercial research purposes only"
CELEBA_IMAGES = "img_align_celeba/"
CELEBA_ATTRIBUTE = "Smiling"
CELEBA_SIDE = 32
CELEBA_MIN_SAMPLES = 5


def celeba_instructions(raw_dir: Path | str = "<data_dir>/celeba_smiling/raw") -> str:
    """How to put CelebA's files in place by hand (its licence allows no automatic download here)."""
    lines = [f"CelebA must be downloaded by hand (non-commercial research licence): from {CELEBA_HOME} "
             "(Google Drive: 'Img/img_align_celeba.zip', 'Anno/list_attr_celeba.txt', 'Anno/identity_CelebA.txt') "
             f"put these files, unextracted and named exactly so, into {raw_dir}:"]
    lines += [f"  {f}  md5 {md5}" for f, md5 in CELEBA_MD5.items()]
    lines.append("(list_eval_partition.txt is not needed: each person's images are split 90/10, as LEAF does.)")
    return "\n".join(lines)


def check_celeba(raw_dir: Path, mirror: str | None = None, checksums: dict[str, str] | None = None) -> list[Path]:
    """The 'download' step of celeba_smiling: check the hand-placed files and their md5 (``checksums``
    overrides them by name); with ``mirror`` (e.g. a lab copy) the files are fetched from there instead.
    Missing files raise FileNotFoundError with the instructions."""
    raw_dir = Path(raw_dir)
    md5s = {**CELEBA_MD5, **(checksums or {})}
    if mirror:
        return [fetch(mirror.rstrip("/") + "/" + f, raw_dir / f, md5s[f]) for f in CELEBA_FILES]
    paths = [raw_dir / f for f in CELEBA_FILES]
    missing = [p.name for p in paths if not p.is_file()]
    if missing:
        raise FileNotFoundError(f"celeba_smiling: {', '.join(missing)} missing from {raw_dir}.\n"
                                + celeba_instructions(raw_dir))
    return [check_placed(p, md5s[p.name], f"Download it again from {CELEBA_HOME} (see the instructions of "
                                          f"celeba_smiling) and put it in {raw_dir}") for p in paths]


def read_celeba_attribute(path: Path, attribute: str = CELEBA_ATTRIBUTE) -> dict[str, int]:
    """Image file name -> 1 / 0 for ``attribute`` from list_attr_celeba.txt (a count line, a line of the
    40 attribute names, then one line per image: its name and a 1 or -1 per attribute)."""
    lines = [line.split() for line in Path(path).read_text().splitlines() if line.strip()]
    if len(lines) < 2 or not lines[0][0].isdigit():
        raise ValueError(f"{path}: expected an image count, then the attribute names, then one row per image")
    names = lines[1]
    if attribute not in names:
        raise ValueError(f"{path}: no attribute {attribute!r} among {names}")
    col = names.index(attribute) + 1
    values: dict[str, int] = {}
    for i, row in enumerate(lines[2:], start=3):
        if len(row) != len(names) + 1 or not all(v in ("1", "-1") for v in row[1:]):
            raise ValueError(f"{path} line {i}: expected an image name and {len(names)} values of 1 or -1, got {row}")
        values[row[0]] = int(row[col] == "1")
    if len(values) != int(lines[0][0]):
        raise ValueError(f"{path}: header says {lines[0][0]} images, the file lists {len(values)}")
    return values


def read_celeba_identities(path: Path) -> dict[str, str]:
    """Image file name -> person id from identity_CelebA.txt (one 'image id' line per image)."""
    people: dict[str, str] = {}
    for i, line in enumerate(Path(path).read_text().splitlines(), start=1):
        row = line.split()
        if not row:
            continue
        if len(row) != 2 or not row[1].isdigit():
            raise ValueError(f"{path} line {i}: expected an image name and a person id, got {line!r}")
        people[row[0]] = row[1]
    return people


def prepare_celeba_smiling(raw_dir: Path, clients: int = CLIENTS, select: str = "random") -> ArraysWithExtras:
    """CelebA's Smiling attribute, ``clients`` people (see the module docstring), 32x32 colour."""
    raw_dir = Path(raw_dir)
    attr_path, id_path = raw_file(raw_dir, CELEBA_ATTR), raw_file(raw_dir, CELEBA_IDENTITY)
    smiling, people = read_celeba_attribute(attr_path), read_celeba_identities(id_path)
    unlabelled = sorted(set(people) - set(smiling))
    if unlabelled:
        raise ValueError(f"{attr_path}: no {CELEBA_ATTRIBUTE} value for {len(unlabelled)} image(s) of {id_path}, "
                         f"e.g. {unlabelled[0]}")
    samples: dict[str, list[tuple[str, int]]] = {}
    for image, person in people.items():
        samples.setdefault(person, []).append((image, smiling[image]))
    zip_path = raw_file(raw_dir, CELEBA_ZIP)
    chosen, split = select_and_split(samples, clients, CELEBA_MIN_SAMPLES, select, str(id_path))
    with _open_zip(zip_path) as zf:
        present = set(zf.namelist())
        images = {}
        for part, items in split.items():
            absent = [image for image, _, _ in items if CELEBA_IMAGES + image not in present]
            if absent:
                raise ValueError(f"{zip_path}: lacks {len(absent)} image(s) listed in {id_path}, e.g. "
                                 f"{CELEBA_IMAGES}{absent[0]}")
            images[part] = _stack([decode_image(zf.read(CELEBA_IMAGES + image),
                                                f"{zip_path} member {CELEBA_IMAGES}{image}", CELEBA_SIDE, draft=True)
                                   for image, _, _ in items], (CELEBA_SIDE, CELEBA_SIDE, 3))
    meta = {"name": "celeba_smiling", "num_classes": 2, "classes": ["not smiling", "smiling"],
            "shape": [CELEBA_SIDE, CELEBA_SIDE, 3], "writers": chosen, "writer_selection": select,
            "eligible_writers": sum(len(v) >= CELEBA_MIN_SAMPLES for v in samples.values()),
            "attribute": CELEBA_ATTRIBUTE, "source": CELEBA_HOME, "license": CELEBA_LICENSE}
    return _with_groups(images, split, meta)


# ---------------------------------------------------------------- manual instructions


def manual_instructions(name: str) -> str:
    """How to put the raw files of ``name`` in place by hand."""
    if name == "celeba_smiling":
        return celeba_instructions()
    if name == "femnist":
        return ("Without network access, download these files into <data_dir>/femnist/raw; the download step "
                "then only checks their md5:\n"
                + "\n".join(f"  {NIST_BASE}{f}  md5 {md5}" for f, md5 in FEMNIST_MD5.items()))
    if name == "cifar100_coarse":
        return (f"Without network access, put the CIFAR-100 archive (the one cifar100 uses) into "
                f"<data_dir>/cifar100_coarse/raw; the download step then only checks its md5:\n"
                f"  {SOURCES['cifar100'].mirrors[0]}{CIFAR100_FILE}  md5 {SOURCES['cifar100'].files[CIFAR100_FILE]}")
    raise ValueError(f"no manual instructions for {name!r}")
