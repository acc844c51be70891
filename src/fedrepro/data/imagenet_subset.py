"""Feddle's out-of-domain server data at paper scale: a 250K-image subset of ImageNet-1k (ILSVRC 2012 train).

ImageNet's licence forbids redistribution, so the archive is downloaded by hand (``manual_instructions``); the
"download" step checks that it is in place and has the md5 the instructions print. ``prepare`` streams the
archive once: per class (its n*.tar member, classes labelled 0..999 in sorted WordNet-id order), the first 250
JPEGs in archive order go to the train split and the next 10 to the test split, each resized to ``SIDE`` x
``SIDE`` (bilinear, after a centre crop to a square). The paper says only "a subset of ImageNet with 250K data
points": the per-class balance, the archive order and the 32x32 size (Feddle's CNN input) are our choices.
"""

from __future__ import annotations

import tarfile
from pathlib import Path
from typing import Any

import numpy as np

from fedrepro.data.download import check_placed
from fedrepro.data.images import decode_image

ARCHIVE = "ILSVRC2012_img_train.tar"
ARCHIVE_MD5 = "1d675b47d978889d74fa0da5fadfb00e"  # as torchvision's ImageNet pins it (ARCHIVE_META)
FILES = (ARCHIVE,)
TRAIN_PER_CLASS, TEST_PER_CLASS, NUM_CLASSES = 250, 10, 1000
SIDE = 32
SOURCE = "https://image-net.org/download-images.php"


def manual_instructions(raw_dir: str = "<data_dir>/imagenet_subset/raw/ (data_dir defaults to resources/data)") -> str:
    return (f"ImageNet is downloaded by hand (its licence forbids redistribution). Log in at {SOURCE}, accept the "
            f"terms of access, download the ILSVRC 2012 training images ({ARCHIVE}, 138 GB, md5 "
            f"{ARCHIVE_MD5}) and place it, unextracted, in {raw_dir}.")


def check(raw_dir: Path, mirror: str | None = None, checksums: dict[str, str] | None = None) -> list[Path]:
    """The 'download' step: the hand-placed archive must be there with ARCHIVE_MD5 (``checksums`` overrides
    it); hashing its 138 GB takes minutes, once per download step."""
    if mirror:
        raise ValueError("imagenet_subset has no mirror download: ImageNet's licence requires a manual download")
    md5 = (checksums or {}).get(ARCHIVE, ARCHIVE_MD5)
    return [check_placed(_archive(raw_dir), md5, f"Download it again from {SOURCE} (see the instructions of "
                                                 f"imagenet_subset) into {Path(raw_dir).resolve()}/")]


def _archive(raw_dir: Path) -> Path:
    """The archive's path; FileNotFoundError with the instructions when it is not there."""
    path = Path(raw_dir) / ARCHIVE
    if not path.is_file():
        raise FileNotFoundError(f"imagenet_subset: {path.resolve()} is missing.\n"
                                + manual_instructions(f"{Path(raw_dir).resolve()}/"))
    return path


def prepare(raw_dir: Path) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, dict[str, Any]]:
    """(x_train, y_train, x_test, y_test, meta) from the archive, streamed once (the download step checked
    its md5; it is not hashed again here)."""
    path = _archive(raw_dir)
    per_class: dict[str, list[np.ndarray]] = {}
    with tarfile.open(path, mode="r|") as outer:
        for member in outer:
            if not member.name.endswith(".tar"):
                continue
            wnid = Path(member.name).stem
            images = per_class.setdefault(wnid, [])
            with tarfile.open(fileobj=outer.extractfile(member), mode="r|") as inner:
                for jpeg in inner:
                    if len(images) == TRAIN_PER_CLASS + TEST_PER_CLASS:  # the rest of the class is skipped
                        break
                    if jpeg.isfile():
                        images.append(decode_image(inner.extractfile(jpeg).read(), f"{path}:{jpeg.name}", SIDE,
                                                   center_crop=True))
    need = TRAIN_PER_CLASS + TEST_PER_CLASS
    short = sorted(w for w, ims in per_class.items() if len(ims) < need)
    if len(per_class) != NUM_CLASSES or short:
        raise ValueError(f"{path}: expected {NUM_CLASSES} class archives with >= {need} images each, "
                         f"got {len(per_class)} classes ({len(short)} short, e.g. {short[:3]})")
    wnids = sorted(per_class)
    x_train = np.stack([im for w in wnids for im in per_class[w][:TRAIN_PER_CLASS]])
    x_test = np.stack([im for w in wnids for im in per_class[w][TRAIN_PER_CLASS:]])
    y_train = np.repeat(np.arange(len(wnids), dtype=np.int64), TRAIN_PER_CLASS)
    y_test = np.repeat(np.arange(len(wnids), dtype=np.int64), TEST_PER_CLASS)
    meta = {"name": "imagenet_subset", "num_classes": len(wnids), "classes": wnids, "shape": [SIDE, SIDE, 3],
            "source": SOURCE, "license": "ImageNet terms of access (non-commercial research)"}
    return x_train, y_train, x_test, y_test, meta
