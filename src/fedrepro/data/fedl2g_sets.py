"""FedL2G's two data sets beyond CIFAR: Oxford Flowers102 and Tiny-ImageNet, downloaded and prepared.

``flowers102`` (Nilsback & Zisserman 2008): the three files of the Oxford VGG page, as torchvision fetches
them (same names, URLs and md5): ``102flowers.tgz`` (8,189 JPEGs ``jpg/image_00001.jpg`` ...),
``imagelabels.mat`` (``labels``: the class 1..102 of image k at position k-1) and ``setid.mat`` (``trnid``,
``valid``, ``tstid``: image ids of the official 1,020 / 1,020 / 6,149 split). Labels are stored as the
official label minus one (0..101); ``classes`` are the official label numbers as strings. The prepared
*train* split is trnid + valid (2,040 images, in that order), *test* is tstid (6,149), each in the order
setid lists them. FedL2G (through PFLlib's generator) pools all 8,189 images, partitions the pool and
splits every client's share 75/25; the heterogeneous engine does that pooling (x_train + x_test), so the
official split here only matters to studies that use a fixed test set.

``tiny_imagenet`` (the CS231n release of Chrabaszcz et al.'s down-sampled ImageNet subset):
``tiny-imagenet-200.zip`` from cs231n.stanford.edu. Classes are the 200 WordNet ids in ``wnids.txt``
order (``words.txt``, when present, gives ``class_names``). Train: ``train/<wnid>/images/*.JPEG``
(500 per class), class by class in wnids order and by file name within a class. Test: the labelled
validation set, ``val/images/*.JPEG`` in the order of ``val/val_annotations.txt`` (10,000 images); the
release's ``test/`` folder has no labels and is not used. Again, FedL2G pools train and test.

Resolution: the paper does not say. PFLlib's generator resizes Flowers102 to 64x64 and keeps
Tiny-ImageNet at its native 64x64, but HtFLlib's model groups (the 4-layer CNN with a 1,600-d flatten,
ViTs built with image_size 32) are set up for 32x32 inputs, as are FedL2G's CIFAR runs. Both data sets
are therefore prepared at ``SIDE`` = 32 by default; ``side`` is a parameter of the prepare functions (64
reproduces PFLlib's generator). Every image is converted to RGB (Tiny-ImageNet has greyscale JPEGs) and
resized to side x side with Pillow's antialiased bilinear filter, the aspect ratio not kept (as
torchvision's ``Resize((64, 64))`` in PFLlib). Archives are read in place; nothing is extracted.
"""

from __future__ import annotations

import tarfile
import zipfile
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any

import numpy as np

from fedrepro.data.download import DownloadError, fetch
from fedrepro.data.images import decode_image
from fedrepro.data.vision import Arrays, raw_file

SIDE = 32


@dataclass(frozen=True)
class Remote:
    """One host (base URL + file name) serving a data set's raw files, and file name -> md5."""

    base: str
    files: dict[str, str]
    homepage: str
    license: str


REMOTES: dict[str, Remote] = {
    "flowers102": Remote(
        "https://www.robots.ox.ac.uk/~vgg/data/flowers/102/",
        {"102flowers.tgz": "52808999861908f626f3c1f4e79d11fa",
         "imagelabels.mat": "e0620be6f572b9609742df49c70aed4d",
         "setid.mat": "a5357ecc9cb78c4bef273ce3793fc85c"},
        "https://www.robots.ox.ac.uk/~vgg/data/flowers/102/",
        "Nilsback & Zisserman 2008, Automated flower classification over a large number of classes (ICVGIP); "
        "research use"),
    "tiny_imagenet": Remote(
        "http://cs231n.stanford.edu/",
        {"tiny-imagenet-200.zip": "90528d7ca1a48142e341f4ef8d21d0de"},
        "http://cs231n.stanford.edu/",
        "Stanford CS231n; images from ImageNet (Deng et al. 2009), ImageNet terms of access (non-commercial "
        "research)"),
}

FLOWERS_CLASSES = 102
FLOWERS_TGZ, FLOWERS_LABELS, FLOWERS_SETID = REMOTES["flowers102"].files
TINY_ZIP = "tiny-imagenet-200.zip"
TINY_ROOT = "tiny-imagenet-200/"


def download(name: str, raw_dir: Path, mirror: str | None = None,
             checksums: dict[str, str] | None = None) -> list[Path]:
    """Fetch the raw files of ``name`` (flowers102, tiny_imagenet) into raw_dir; return their paths.

    ``mirror``: a base URL serving the files by name, replacing the official host; ``checksums``
    overrides md5 sums by file name. A file with the wrong md5 is quarantined as .corrupt (ChecksumError).
    """
    remote = REMOTES[name]
    paths = []
    for fname, md5 in remote.files.items():
        url = (mirror or remote.base).rstrip("/") + "/" + fname
        try:
            paths.append(fetch(url, Path(raw_dir) / fname, (checksums or {}).get(fname, md5)))
        except DownloadError as e:
            raise DownloadError(f"{name}: {e}") from e
    return paths


def manual_instructions(name: str) -> str:
    """How to put the raw files of ``name`` in place by hand (no network on the machine)."""
    remote = REMOTES[name]
    lines = [f"Without network access, download these files (see {remote.homepage}) into <data_dir>/{name}/raw; "
             "the download step then only checks their md5:"]
    lines += [f"  {remote.base}{fname}  md5 {md5}" for fname, md5 in remote.files.items()]
    return "\n".join(lines)


# ---------------------------------------------------------------- Flowers102


def _mat_vector(path: Path, key: str) -> np.ndarray:
    """Variable ``key`` of a .mat file as a flat int64 vector; errors name the file and the key."""
    from scipy.io import loadmat

    try:
        mat = loadmat(path)
    except Exception as e:  # scipy raises ValueError, TypeError or its own MatReadError on junk bytes
        raise ValueError(f"{path}: not a MATLAB .mat file scipy can read ({type(e).__name__}: {e})") from None
    if key not in mat:
        found = sorted(k for k in mat if not k.startswith("__"))
        raise ValueError(f"{path}: no variable {key!r} (found {found})")
    values = np.asarray(mat[key])
    if values.size and (not np.issubdtype(values.dtype, np.number) or np.any(values != np.round(values))):
        raise ValueError(f"{path}: {key!r} must hold integers, got dtype {values.dtype}")
    return values.ravel().astype(np.int64)


def _flowers_ids(raw_dir: Path, n_images: int) -> dict[str, np.ndarray]:
    path = raw_file(raw_dir, FLOWERS_SETID)
    ids = {k: _mat_vector(path, k) for k in ("trnid", "valid", "tstid")}
    seen: dict[int, str] = {}
    for key, v in ids.items():
        bad = v[(v < 1) | (v > n_images)]
        if len(bad):
            raise ValueError(f"{path}: {key} lists image id {bad[0]}, outside 1..{n_images} "
                             f"({FLOWERS_LABELS} labels {n_images} images)")
        for i in v.tolist():
            if i in seen:
                raise ValueError(f"{path}: image id {i} is in both {seen[i]} and {key}")
            seen[i] = key
    return ids


def _flowers_images(tgz: Path, wanted: set[int], side: int) -> dict[int, np.ndarray]:
    """The images ``jpg/image_<id>.jpg`` whose ids are wanted, decoded and resized; read in archive order
    (a gzip stream seeks backwards only by decompressing again)."""
    out: dict[int, np.ndarray] = {}
    try:
        with tarfile.open(tgz, "r:gz") as tar:
            for m in tar:
                p = PurePosixPath(m.name)
                if not (m.isfile() and len(p.parts) == 2 and p.parts[0] == "jpg" and p.stem.startswith("image_")
                        and p.suffix.lower() == ".jpg" and p.stem[6:].isdigit()):
                    continue
                image_id = int(p.stem[6:])
                if image_id in wanted:
                    out[image_id] = decode_image(tar.extractfile(m).read(), f"{tgz} member {m.name}", side, draft=True)
    except (tarfile.TarError, EOFError, OSError) as e:
        raise ValueError(f"{tgz}: not a readable .tgz archive ({type(e).__name__}: {e})") from None
    missing = sorted(wanted - set(out))
    if missing:
        raise ValueError(f"{tgz}: lacks {len(missing)} image(s) listed in {FLOWERS_SETID}, e.g. "
                         f"jpg/image_{missing[0]:05d}.jpg")
    return out


def prepare_flowers102(raw_dir: Path, side: int = SIDE) -> Arrays:
    """Flowers102 from its three official files: train = trnid + valid, test = tstid, labels 0..101."""
    labels_path = raw_file(raw_dir, FLOWERS_LABELS)
    labels = _mat_vector(labels_path, "labels")
    if len(labels) == 0 or labels.min() < 1 or labels.max() > FLOWERS_CLASSES:
        raise ValueError(f"{labels_path}: 'labels' must lie in 1..{FLOWERS_CLASSES}, got "
                         f"{labels.min() if len(labels) else 'none'}..{labels.max() if len(labels) else ''}")
    ids = _flowers_ids(raw_dir, len(labels))
    split_ids = {"train": np.concatenate([ids["trnid"], ids["valid"]]), "test": ids["tstid"]}
    images = _flowers_images(raw_file(raw_dir, FLOWERS_TGZ), set(np.concatenate(list(split_ids.values())).tolist()),
                             side)
    arrays: list[np.ndarray] = []
    for split in ("train", "test"):
        order = split_ids[split].tolist()
        x = np.stack([images[i] for i in order]) if order else np.empty((0, side, side, 3), np.uint8)
        arrays += [x, labels[np.asarray(order, dtype=np.int64) - 1] - 1]
    remote = REMOTES["flowers102"]
    meta: dict[str, Any] = {
        "name": "flowers102", "num_classes": FLOWERS_CLASSES, "kind": "image",
        "classes": [str(k) for k in range(1, FLOWERS_CLASSES + 1)], "shape": [side, side, 3],
        "split": "train = setid trnid + valid, test = tstid; label = official label - 1",
        "split_sizes": {k: len(v) for k, v in ids.items()},
        "source": remote.base + FLOWERS_TGZ, "license": remote.license}
    return (*arrays, meta)


# ---------------------------------------------------------------- Tiny-ImageNet


def _zip_text(zf: zipfile.ZipFile, member: str, zpath: Path) -> str:
    try:
        return zf.read(TINY_ROOT + member).decode("utf-8")
    except KeyError:
        raise ValueError(f"{zpath}: lacks {TINY_ROOT}{member}; is this tiny-imagenet-200.zip?") from None


def _tiny_wnids(zf: zipfile.ZipFile, zpath: Path) -> list[str]:
    wnids = [w.strip() for w in _zip_text(zf, "wnids.txt", zpath).splitlines() if w.strip()]
    if not wnids or len(set(wnids)) != len(wnids):
        raise ValueError(f"{zpath}: {TINY_ROOT}wnids.txt is empty or repeats a WordNet id")
    return wnids


def _tiny_words(zf: zipfile.ZipFile, wnids: list[str]) -> list[str] | None:
    """Human-readable names from words.txt (optional: prepare does not need them)."""
    if TINY_ROOT + "words.txt" not in zf.namelist():
        return None
    words = dict(line.split("\t", 1) for line in zf.read(TINY_ROOT + "words.txt").decode("utf-8").splitlines()
                 if "\t" in line)
    return [words.get(w, w).strip() for w in wnids]


def _tiny_val_annotations(zf: zipfile.ZipFile, zpath: Path, index: dict[str, int]) -> list[tuple[str, int]]:
    member = "val/val_annotations.txt"
    out = []
    for lineno, line in enumerate(_zip_text(zf, member, zpath).splitlines(), 1):
        if not line.strip():
            continue
        parts = line.split("\t")
        if len(parts) < 2:
            raise ValueError(f"{zpath}: {TINY_ROOT}{member}:{lineno}: expected '<file>\\t<wnid>\\t...', got {line!r}")
        if parts[1] not in index:
            raise ValueError(f"{zpath}: {TINY_ROOT}{member}:{lineno}: WordNet id {parts[1]!r} is not in wnids.txt")
        out.append((parts[0], index[parts[1]]))
    return out


def prepare_tiny_imagenet(raw_dir: Path, side: int = SIDE) -> Arrays:
    """Tiny-ImageNet from tiny-imagenet-200.zip (read in place): train from train/, test from val/."""
    zpath = raw_file(raw_dir, TINY_ZIP)
    try:
        zf = zipfile.ZipFile(zpath)
    except (zipfile.BadZipFile, OSError) as e:
        raise ValueError(f"{zpath}: not a readable zip archive ({e})") from None
    with zf:
        names = zf.namelist()
        wnids = _tiny_wnids(zf, zpath)
        index = {w: i for i, w in enumerate(wnids)}
        # train/<wnid>/images/<file>.JPEG
        train: list[tuple[str, int]] = []
        per_class: dict[str, list[str]] = {w: [] for w in wnids}
        for n in names:
            p = PurePosixPath(n)
            if (len(p.parts) == 5 and p.parts[:2] == ("tiny-imagenet-200", "train") and p.parts[3] == "images"
                    and p.suffix.upper() == ".JPEG"):
                if p.parts[2] not in index:
                    raise ValueError(f"{zpath}: {n} is under a class folder not listed in wnids.txt")
                per_class[p.parts[2]].append(n)
        empty = [w for w, members in per_class.items() if not members]
        if empty:
            raise ValueError(f"{zpath}: no training images under {TINY_ROOT}train/{empty[0]}/images/ "
                             f"({len(empty)} of {len(wnids)} classes have none)")
        for w in wnids:
            train += [(n, index[w]) for n in sorted(per_class[w])]
        # val/images/<file>.JPEG, labelled by val_annotations.txt
        val_images = {PurePosixPath(n).name for n in names
                      if n.startswith(TINY_ROOT + "val/images/") and PurePosixPath(n).suffix.upper() == ".JPEG"}
        annotations = _tiny_val_annotations(zf, zpath, index)
        listed = {f for f, _ in annotations}
        if len(listed) != len(annotations):
            raise ValueError(f"{zpath}: {TINY_ROOT}val/val_annotations.txt lists an image twice")
        if listed - val_images:
            raise ValueError(f"{zpath}: val_annotations.txt lists {sorted(listed - val_images)[0]}, which "
                             f"{TINY_ROOT}val/images/ lacks")
        if val_images - listed:
            raise ValueError(f"{zpath}: {TINY_ROOT}val/images/{sorted(val_images - listed)[0]} has no line in "
                             "val_annotations.txt")
        test = [(f"{TINY_ROOT}val/images/{f}", label) for f, label in annotations]
        arrays: list[np.ndarray] = []
        for members in (train, test):
            x = np.empty((len(members), side, side, 3), dtype=np.uint8)
            for i, (member, _) in enumerate(members):
                try:
                    data = zf.read(member)
                except (zipfile.BadZipFile, KeyError) as e:  # a damaged member (CRC), or one the index lacks
                    raise ValueError(f"{zpath}: cannot read {member} ({e})") from None
                x[i] = decode_image(data, f"{zpath} member {member}", side, draft=True)
            arrays += [x, np.array([label for _, label in members], dtype=np.int64)]
        class_names = _tiny_words(zf, wnids)
    remote = REMOTES["tiny_imagenet"]
    meta: dict[str, Any] = {
        "name": "tiny_imagenet", "num_classes": len(wnids), "classes": wnids, "kind": "image",
        "shape": [side, side, 3], "split": "train = train/, test = val/ (labelled by val_annotations.txt)",
        "source": remote.base + TINY_ZIP, "license": remote.license}
    if class_names is not None:
        meta["class_names"] = class_names
    return (*arrays, meta)
