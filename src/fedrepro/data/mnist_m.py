"""MNIST-M (Ganin & Lempitsky 2015; Ganin et al., JMLR 2016), built from MNIST and BSDS500 by its recipe.

Each MNIST digit is binarised (pixel > 0 -> 255), turned to RGB, and difference-blended with a 28x28 patch
cropped at a uniformly random position from a randomly chosen BSDS500 *train* photograph (the 200 images
under BSR/BSDS500/data/images/train/ of BSR_bsds500.tgz): out = |patch - digit| per channel. This is the
published construction (the create_mnistm.py script that circulates with DANN re-implementations does
exactly this). MNIST's 60,000 train and 10,000 test digits give MNIST-M's train and test splits with
MNIST's labels; the original release kept 59,001 / 9,001 of them, a selection that is not documented, so
all are kept here. Random choices come from one generator with a fixed seed (part of the data set's
definition): the recipe is reproduced, the original bytes cannot be.

Raw files: MNIST's four idx files (URLs and md5 as for ``mnist``) and BSR_bsds500.tgz from Berkeley, which
prints no checksum: it is checked against the sha256 public loaders pin for it (``BSDS_SHA256``).
"""

from __future__ import annotations

import io
import tarfile
from pathlib import Path

import numpy as np

from fedrepro.data.download import DownloadError, fetch
from fedrepro.data.vision import DIGIT_CLASSES, IDX_FILES, SOURCES, Arrays, raw_file, read_idx

BSDS_FILE = "BSR_bsds500.tgz"
BSDS_URLS = ("http://www.eecs.berkeley.edu/Research/Projects/CS/vision/grouping/BSR/BSR_bsds500.tgz",
             "https://www2.eecs.berkeley.edu/Research/Projects/CS/vision/grouping/BSR/BSR_bsds500.tgz")
# Berkeley prints no checksum: this is the sha256 independent public BSDS500 fetchers pin for the archive
# (the same value in each one we found). tensorpack pins its size, 70,763,455 bytes, but no checksum
# (tensorpack/tensorpack, tensorpack/dataflow/dataset/bsds500.py)
BSDS_SHA256 = "97e49d31764f3912f0c4122707d53062ac9e783ba0f095e447a4d53c1a41af8e"
BSDS_TRAIN = "BSR/BSDS500/data/images/train/"
BLEND_SEED = 42  # the create_mnistm.py script's RandomState(42); fixed, part of the data set
FILES = (*IDX_FILES, BSDS_FILE)
LICENSE = ("MNIST: Y. LeCun, C. Cortes, C. J. C. Burges (CC BY-SA 3.0); BSDS500: Arbelaez, Maire, Fowlkes & "
           "Malik 2011, research use; MNIST-M construction: Ganin & Lempitsky 2015")


def download(raw_dir: Path, mirror: str | None = None, checksums: dict[str, str] | None = None) -> list[Path]:
    """MNIST's idx files and BSR_bsds500.tgz into raw_dir (``mirror``: one base URL serving all five)."""
    checksums = checksums or {}
    paths = []
    for fname in FILES:
        if fname == BSDS_FILE:
            checksum = checksums.get(fname, BSDS_SHA256)
            urls = [mirror.rstrip("/") + "/" + fname] if mirror else list(BSDS_URLS)
        else:
            checksum = checksums.get(fname, SOURCES["mnist"].files[fname])
            bases = (mirror,) if mirror else SOURCES["mnist"].mirrors
            urls = [b.rstrip("/") + "/" + fname for b in bases]
        errors = []
        for url in urls:
            try:
                paths.append(fetch(url, Path(raw_dir) / fname, checksum))
                break
            except DownloadError as e:
                errors.append(str(e))
        else:
            raise DownloadError(f"mnist_m: no host served {fname}:\n  " + "\n  ".join(errors))
    return paths


def manual_instructions() -> str:
    lines = ["Without network access, put these files into the raw directory of mnist_m "
             "(<data_dir>/mnist_m/raw); the download step then only checks them:"]
    lines += [f"  {SOURCES['mnist'].mirrors[0]}{f}  md5 {SOURCES['mnist'].files[f]}" for f in IDX_FILES]
    lines.append(f"  {BSDS_URLS[0]}  sha256 {BSDS_SHA256}")
    return "\n".join(lines)


def load_backgrounds(tgz: Path) -> list[np.ndarray]:
    """The BSDS500 train photographs as uint8 [H, W, 3], in file-name order (the archive order is not
    guaranteed, and the draw below must not depend on it)."""
    from PIL import Image

    out = []
    with tarfile.open(tgz, "r:gz") as tar:
        members = sorted((m for m in tar.getmembers()
                          if m.isfile() and m.name.startswith(BSDS_TRAIN) and m.name.lower().endswith(".jpg")),
                         key=lambda m: m.name)
        for m in members:
            with Image.open(io.BytesIO(tar.extractfile(m).read())) as img:
                out.append(np.asarray(img.convert("RGB"), dtype=np.uint8))
    if not out:
        raise ValueError(f"{tgz}: no JPEG images under {BSDS_TRAIN}; is this BSR_bsds500.tgz?")
    return out


def blend(digits: np.ndarray, backgrounds: list[np.ndarray], rng: np.random.Generator) -> np.ndarray:
    """MNIST-M images of grey ``digits`` [N, 28, 28]: |random background patch - binarised digit|."""
    n, h, w = digits.shape
    out = np.empty((n, h, w, 3), dtype=np.uint8)
    for i in range(n):
        bg = backgrounds[rng.integers(len(backgrounds))]
        top = rng.integers(0, bg.shape[0] - h)  # np.random.randint(0, H - h), as the recipe draws it
        left = rng.integers(0, bg.shape[1] - w)
        patch = bg[top : top + h, left : left + w].astype(np.int16)
        digit = np.where(digits[i] > 0, 255, 0).astype(np.int16)[..., None]
        out[i] = np.abs(patch - digit).astype(np.uint8)
    return out


def prepare_mnist_m(raw_dir: Path) -> Arrays:
    """MNIST-M from the raw MNIST files and BSR_bsds500.tgz (read in place)."""
    x_tr, y_tr, x_te, y_te = (read_idx(raw_file(raw_dir, f)) for f in IDX_FILES)
    backgrounds = load_backgrounds(raw_file(raw_dir, BSDS_FILE))
    rng = np.random.default_rng(BLEND_SEED)
    train, test = blend(x_tr, backgrounds, rng), blend(x_te, backgrounds, rng)
    meta = {"name": "mnist_m", "num_classes": 10, "classes": DIGIT_CLASSES, "shape": [28, 28, 3],
            "source": f"MNIST ({SOURCES['mnist'].mirrors[0]}) + {BSDS_URLS[0]}", "license": LICENSE,
            "backgrounds": len(backgrounds)}
    return train, y_tr.astype(np.int64), test, y_te.astype(np.int64), meta
