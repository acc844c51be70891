"""FedDisco's other data sets: CINIC-10 and AG News (downloaded) and HAM10000 (placed by hand).

- ``cinic10``: the CINIC-10 archive from Edinburgh DataShare (train/valid/test/<class>/*.png, 32x32),
  read in place from the tar.gz. Train is the ``train`` split only (as FedDisco's code trains on
  ``train/``); ``include_valid`` adds ``valid``. Test is the ``test`` split, optionally cut to a
  uniform seeded subset per class (FedDisco tests on an undocumented "sampled test" folder).
- ``ham10000``: the Harvard Dataverse files (two image zips + metadata CSV) that the user downloads;
  each JPEG is resized to ``image_size`` (56, as FedDisco's ``transforms.Resize((56, 56))``, bilinear)
  and 30 images per class are held out as a uniform test set (the paper's choice) with a fixed seed.
- ``ag_news``: the AG News CSVs as torchtext downloads them. Title and description are joined,
  cleaned, lower-cased and split by a regex; the vocabulary is the ``vocab_size`` most frequent train
  tokens (ids 2..; 0 = <pad>, 1 = <unk>); sequences are cut or padded at the end to ``max_len``.
  x is uint16 [N, max_len] (int32 for vocabularies beyond 65,536 ids) and meta has ``kind: text``.

Only numpy, PIL and the standard library are used (PIL is imported where images are decoded).
"""

from __future__ import annotations

import csv
import hashlib
import html
import re
import tarfile
import zipfile
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any

import numpy as np

from fedrepro.data.download import DownloadError, check_placed, fetch
from fedrepro.data.images import decode_image
from fedrepro.data.vision import Arrays


@dataclass(frozen=True)
class Remote:
    """Where raw files come from: base URLs (base + file name) tried in order, then per-file full URLs."""

    files: dict[str, str]  # file name -> md5
    mirrors: tuple[str, ...]
    license: str
    homepage: str
    urls: dict[str, tuple[str, ...]] = field(default_factory=dict)

    def candidates(self, fname: str, mirror: str | None = None) -> list[str]:
        """URLs to try for `fname`: only `mirror` when given, else the mirrors then the extra URLs."""
        if mirror:
            return [mirror.rstrip("/") + "/" + fname]
        return [b.rstrip("/") + "/" + fname for b in self.mirrors] + list(self.urls.get(fname, ()))


CINIC_CLASSES = ["airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck"]
AG_NEWS_CLASSES = ["World", "Sports", "Business", "Sci/Tech"]
HAM_CLASSES = ["akiec", "bcc", "bkl", "df", "mel", "nv", "vasc"]  # dx codes, sorted as ImageFolder sorts
HAM_CLASS_NAMES = ["actinic keratoses and intraepithelial carcinoma", "basal cell carcinoma",
                   "benign keratosis-like lesions", "dermatofibroma", "melanoma", "melanocytic nevi",
                   "vascular lesions"]
# md5 of the Dataverse files (dataset version 4.0) as loaders that check them pin them, e.g. sit-start/core
# (python/sitstart/ml/data/datasets/ham10k.py); the metadata's is that of the original CSV, not of the .tab
# copy Dataverse exports by default
HAM_MD5 = {"HAM10000_images_part_1.zip": "4639bfa73ab251610530a97c898e6e46",
           "HAM10000_images_part_2.zip": "da43d6cc50f6613013be07e8986b384b",
           "HAM10000_metadata.csv": "8f85fb1aa29d80a2797247e434deb79d"}
HAM_FILES = tuple(HAM_MD5)
HAM_DOI = "https://doi.org/10.7910/DVN/DBW86T"
HAM_LICENSE = "Tschandl, Rosendahl & Kittler 2018 (Sci. Data 5:180161); CC BY-NC 4.0"

# Fixed seeds: they are part of each prepared data set's definition, never a run's seed.
HAM_SPLIT_SEED = 10015
CINIC_TEST_SEED = 270000

REMOTES: dict[str, Remote] = {
    # md5: not printed on the DataShare page we could read; this value is the one used by many
    # independent loaders of this exact file (687,544,992 bytes). Override it with the config key
    # `checksums` if the archive you get differs and you trust it.
    "cinic10": Remote(
        {"CINIC-10.tar.gz": "6ee4d0c996905fe93221de577967a372"},
        ("https://datashare.ed.ac.uk/bitstream/handle/10283/3192/",
         "https://datashare.is.ed.ac.uk/bitstream/handle/10283/3192/"),
        "Darlow, Crowley, Antoniou & Storkey 2018 (arXiv:1810.03505); CC BY 4.0 (Edinburgh DataShare)",
        "https://doi.org/10.7488/ds/2448",
        {"CINIC-10.tar.gz": ("https://datashare.ed.ac.uk/server/api/core/bitstreams/"
                             "e8e186cc-2688-48f1-aa5a-3fda1a43f8b6/content",)},
    ),
    # URLs and md5 sums as in torchtext.datasets.AG_NEWS (torchtext >= 0.9).
    "ag_news": Remote(
        {"train.csv": "b1a00f826fdfbd249f79597b59e1dc12", "test.csv": "d52ea96a97a2d943681189a97654912d"},
        ("https://raw.githubusercontent.com/mhjabreel/CharCnn_Keras/master/data/ag_news_csv/",),
        "Zhang, Zhao & LeCun 2015 (from A. Gulli's AG corpus); non-commercial research use",
        "http://groups.di.unipi.it/~gulli/AG_corpus_of_news_articles.html",
    ),
}


# ---------------------------------------------------------------- downloads


def download(name: str, raw_dir: Path, mirror: str | None = None,
             checksums: dict[str, str] | None = None) -> list[Path]:
    """Fetch every raw file of `name` (cinic10, ag_news) into raw_dir; return their paths.

    `mirror` (a base URL) replaces the official hosts; `checksums` overrides md5 sums by file name.
    An unreachable host falls back to the next one; a checksum error does not (it is loud).
    """
    remote = REMOTES[name]
    paths = []
    for fname, md5 in remote.files.items():
        md5 = (checksums or {}).get(fname, md5)
        errors = []
        for url in remote.candidates(fname, mirror):
            try:
                paths.append(fetch(url, Path(raw_dir) / fname, md5))
                break
            except DownloadError as e:
                errors.append(str(e))
        else:
            raise DownloadError(f"{name}: no host served {fname}:\n  " + "\n  ".join(errors))
    return paths


def manual_instructions(name: str) -> str:
    """How to fetch the raw files of `name` by hand (no network on the machine, or a manual data set)."""
    if name == "ham10000":
        return ham10000_instructions("<data_dir>/ham10000/raw/ (data_dir defaults to resources/data)")
    remote = REMOTES[name]
    lines = [f"Without network access, download these files into the raw directory of {name} "
             f"(<data_dir>/{name}/raw); the download step then only checks their md5:"]
    for fname, md5 in remote.files.items():
        lines.append(f"  {remote.candidates(fname)[0]}  md5 {md5}")
    return "\n".join(lines)


def ham10000_instructions(raw_dir: Path | str) -> str:
    """The manual download steps for HAM10000, naming the folder the files go to."""
    return (
        f"HAM10000 is downloaded by hand. From {HAM_DOI} (Harvard Dataverse, licence CC BY-NC 4.0; accept its "
        f"terms of use) download these files, whose md5 the download step checks,\n"
        + "".join(f"  {f}  md5 {md5}\n" for f, md5 in HAM_MD5.items())
        + f"into the folder {raw_dir}. Keep the names exactly as above and the zips unextracted; for the "
        f"metadata choose the original CSV format if Dataverse offers a .tab copy."
    )


def check_ham10000(raw_dir: Path, mirror: str | None = None,
                   checksums: dict[str, str] | None = None) -> list[Path]:
    """The 'download' step of HAM10000: check the hand-placed files against HAM_MD5 (``checksums``
    overrides them by name).

    With `mirror` (e.g. a lab copy) the files are fetched from there instead. Missing files raise
    FileNotFoundError with the manual instructions; a file with another md5 raises ChecksumError naming it.
    """
    raw_dir = Path(raw_dir)
    md5s = {**HAM_MD5, **(checksums or {})}
    if mirror:
        return [fetch(mirror.rstrip("/") + "/" + f, raw_dir / f, md5s[f]) for f in HAM_FILES]
    return [check_placed(p, md5s[p.name], f"Download it again from {HAM_DOI} (for the metadata, the original "
                                          f"CSV, not Dataverse's .tab export) into {Path(raw_dir).resolve()}/")
            for p in _ham_paths(raw_dir)]


def _ham_paths(raw_dir: Path) -> list[Path]:
    paths = [Path(raw_dir) / f for f in HAM_FILES]
    missing = [p.name for p in paths if not p.is_file()]
    if missing:
        raise FileNotFoundError(f"ham10000: {', '.join(missing)} missing in {Path(raw_dir).resolve()}/.\n"
                                + ham10000_instructions(f"{Path(raw_dir).resolve()}/"))
    return paths


def raw_file(raw_dir: Path, fname: str) -> Path:
    path = Path(raw_dir) / fname
    if not path.is_file():
        raise FileNotFoundError(f"{path} is missing: run the data set's download step first, or place the "
                                f"official file there by hand")
    return path


# ---------------------------------------------------------------- images


def _per_class_subset(y: np.ndarray, per_class: int, num_classes: int, seed: int, what: str) -> np.ndarray:
    """Sorted indices of `per_class` samples drawn uniformly without replacement from every class."""
    rng = np.random.default_rng(seed)
    picked = []
    for c in range(num_classes):
        idx = np.flatnonzero(y == c)
        if len(idx) < per_class:
            raise ValueError(f"{what}: class {c} has {len(idx)} samples, fewer than the {per_class} asked")
        picked.append(rng.choice(idx, per_class, replace=False))
    return np.sort(np.concatenate(picked))


def prepare_cinic10(raw_dir: Path, include_valid: bool = False, test_per_class: int | None = None) -> Arrays:
    """CINIC-10 from CINIC-10.tar.gz, read in place; images sorted by split, class, then file name.

    Train is ``train`` (+ ``valid`` with include_valid); test is ``test``, or `test_per_class` images
    per class drawn from it with a fixed seed.
    """
    path = raw_file(raw_dir, "CINIC-10.tar.gz")
    splits = ("train", "valid", "test") if include_valid else ("train", "test")
    found: dict[tuple[int, int, str], np.ndarray] = {}
    with tarfile.open(path, "r:gz") as tar:
        for member in tar:  # sequential: one pass over the gzip stream
            parts = PurePosixPath(member.name).parts
            if not member.isfile() or len(parts) < 3 or not parts[-1].lower().endswith(".png"):
                continue
            split, cls = parts[-3], parts[-2]
            if split not in splits or cls not in CINIC_CLASSES:
                continue
            f = tar.extractfile(member)
            assert f is not None  # a regular file always has a body
            x = decode_image(f.read(), f"{path}:{member.name}")
            if x.shape != (32, 32, 3):
                raise ValueError(f"{path}:{member.name}: image is {x.shape[1]}x{x.shape[0]}, expected 32x32")
            found[(splits.index(split), CINIC_CLASSES.index(cls), member.name)] = x
    for i, split in enumerate(splits):
        if not any(k[0] == i for k in found):
            raise ValueError(f"{path}: no {split}/<class>/*.png images in the archive; is it CINIC-10?")
    keys = sorted(found)
    is_test = np.array([splits[k[0]] == "test" for k in keys])
    x = np.stack([found[k] for k in keys])
    y = np.array([k[1] for k in keys], dtype=np.int64)
    x_tr, y_tr, x_te, y_te = x[~is_test], y[~is_test], x[is_test], y[is_test]
    if test_per_class is not None:
        keep = _per_class_subset(y_te, test_per_class, len(CINIC_CLASSES), CINIC_TEST_SEED, "CINIC-10 test")
        x_te, y_te = x_te[keep], y_te[keep]
    remote = REMOTES["cinic10"]
    meta = {"name": "cinic10", "num_classes": 10, "classes": CINIC_CLASSES, "shape": [32, 32, 3],
            "kind": "image", "train_splits": [s for s in splits if s != "test"],
            "test_per_class": test_per_class,
            "source": remote.mirrors[0] + "CINIC-10.tar.gz", "license": remote.license}
    return x_tr, y_tr, x_te, y_te, meta


def _read_ham_metadata(path: Path) -> tuple[list[str], np.ndarray]:
    with open(path, newline="", encoding="utf-8-sig") as f:
        reader = csv.DictReader(f)
        missing = {"image_id", "dx"} - set(reader.fieldnames or ())
        if missing:
            raise ValueError(f"{path}: no column(s) {sorted(missing)}; header is {reader.fieldnames}")
        rows = [(r["image_id"].strip(), r["dx"].strip()) for r in reader]
    unknown = sorted({dx for _, dx in rows} - set(HAM_CLASSES))
    if unknown:
        raise ValueError(f"{path}: unknown dx value(s) {unknown}; expected {HAM_CLASSES}")
    ids = [i for i, _ in rows]
    if len(set(ids)) != len(ids):
        raise ValueError(f"{path}: image_id values repeat")
    return ids, np.array([HAM_CLASSES.index(dx) for _, dx in rows], dtype=np.int64)


def prepare_ham10000(raw_dir: Path, image_size: int = 56, test_per_class: int = 30) -> Arrays:
    """HAM10000 from the two image zips and the metadata CSV; images ordered by image_id.

    Every image is resized to image_size x image_size (bilinear); `test_per_class` images of every
    class, drawn with a fixed seed, form the test set and the rest the train set.
    """
    *zip_paths, meta_path = _ham_paths(Path(raw_dir))  # HAM_FILES: the two zips, then the CSV
    ids, labels = _read_ham_metadata(meta_path)
    order = np.argsort(ids, kind="stable")
    ids, labels = [ids[i] for i in order], labels[order]
    want = set(ids)
    images: dict[str, np.ndarray] = {}
    for zpath in zip_paths:
        with zipfile.ZipFile(zpath) as zf:
            for info in zf.infolist():
                stem = PurePosixPath(info.filename).stem
                if info.is_dir() or not info.filename.lower().endswith(".jpg") or stem not in want:
                    continue
                if stem in images:
                    raise ValueError(f"{zpath}: {info.filename} appears twice in the HAM10000 zips")
                images[stem] = decode_image(zf.read(info), f"{zpath}:{info.filename}", image_size)
    absent = [i for i in ids if i not in images]
    if absent:
        raise ValueError(f"{len(absent)} image(s) of {meta_path.name} are in neither zip, e.g. "
                         f"{', '.join(absent[:5])}; are the zips complete?")
    x = np.stack([images[i] for i in ids])
    test = _per_class_subset(labels, test_per_class, len(HAM_CLASSES), HAM_SPLIT_SEED, "HAM10000")
    is_test = np.zeros(len(ids), dtype=bool)
    is_test[test] = True
    meta = {"name": "ham10000", "num_classes": len(HAM_CLASSES), "classes": HAM_CLASSES,
            "class_names": HAM_CLASS_NAMES, "shape": [image_size, image_size, 3], "kind": "image",
            "test_per_class": test_per_class, "split_seed": HAM_SPLIT_SEED,
            "test_image_ids": [ids[i] for i in test], "source": HAM_DOI, "license": HAM_LICENSE}
    return x[~is_test], labels[~is_test], x[is_test], labels[is_test], meta


# ---------------------------------------------------------------- text

TOKEN_RE = re.compile(r"[a-z0-9]+(?:'[a-z0-9]+)*")
PAD, UNK = "<pad>", "<unk>"
# Vocabularies up to this many tokens are stored in meta; larger ones only by their sha256.
VOCAB_IN_META_MAX = 2000


def tokenize(text: str) -> list[str]:
    """AG News text -> tokens: HTML entities decoded (also the corpus's bare '#39;'), tags and backslash
    line breaks removed, lower-cased, then runs of letters/digits (inner apostrophes kept); punctuation
    is dropped.
    """
    text = re.sub(r"(?<!&)#(\d+);", r"&#\1;", text)  # "it#39;s" -> "it&#39;s" -> "it's"
    text = html.unescape(html.unescape(text))  # the corpus also has double-escaped "&amp;lt;b&amp;gt;"
    text = re.sub(r"<[^>]*>", " ", text).replace("\\", " ").lower()
    return TOKEN_RE.findall(text)


def _read_ag_news(path: Path) -> tuple[list[list[str]], np.ndarray]:
    texts, labels = [], []
    with open(path, newline="", encoding="utf-8") as f:
        for line, row in enumerate(csv.reader(f), 1):
            if len(row) < 2 or not row[0].strip().isdigit() or not 1 <= int(row[0]) <= 4:
                raise ValueError(f"{path}:{line}: expected class index 1..4, title, description; "
                                 f"got {row[:3]}")
            labels.append(int(row[0]) - 1)
            texts.append(tokenize(" ".join(row[1:])))
    return texts, np.array(labels, dtype=np.int64)


def build_vocab(texts: Iterable[list[str]], vocab_size: int) -> list[str]:
    """<pad>, <unk>, then the `vocab_size` most frequent tokens (ties by token): index = token id."""
    counts = Counter(t for toks in texts for t in toks)
    top = sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))[:vocab_size]
    return [PAD, UNK] + [t for t, _ in top]


def encode(texts: list[list[str]], vocab: list[str], max_len: int) -> np.ndarray:
    """Token ids [N, max_len]: unknown tokens -> 1, cut after max_len tokens, padded with 0 at the end."""
    ids = {t: i for i, t in enumerate(vocab)}
    dtype = np.uint16 if len(vocab) <= 1 << 16 else np.int32
    x = np.zeros((len(texts), max_len), dtype=dtype)
    for row, toks in zip(x, texts, strict=True):
        seq = [ids.get(t, 1) for t in toks[:max_len]]
        row[: len(seq)] = seq
    return x


def prepare_ag_news(raw_dir: Path, vocab_size: int = 20000, max_len: int = 64) -> Arrays:
    """AG News token ids from train.csv and test.csv; the vocabulary comes from train only.

    meta["vocab_size"] counts every id, <pad> and <unk> included (the embedding's row count).
    """
    tr_texts, y_tr = _read_ag_news(raw_file(raw_dir, "train.csv"))
    te_texts, y_te = _read_ag_news(raw_file(raw_dir, "test.csv"))
    vocab = build_vocab(tr_texts, vocab_size)
    x_tr, x_te = encode(tr_texts, vocab, max_len), encode(te_texts, vocab, max_len)
    remote = REMOTES["ag_news"]
    meta: dict[str, Any] = {
        "name": "ag_news", "num_classes": 4, "classes": AG_NEWS_CLASSES, "shape": [max_len], "kind": "text",
        "vocab_size": len(vocab), "max_len": max_len, "pad_id": 0, "unk_id": 1,
        "tokenizer": f"html-unescape, lower-case, regex {TOKEN_RE.pattern}",
        "vocab_sha256": hashlib.sha256("\n".join(vocab).encode()).hexdigest(),
        "truncated_train_fraction": float(np.mean([len(t) > max_len for t in tr_texts])),
        "source": remote.mirrors[0], "license": remote.license,
    }
    if len(vocab) <= VOCAB_IN_META_MAX:
        meta["vocab"] = vocab
    return x_tr, y_tr, x_te, y_te, meta
