"""Pretrained model weights (Feddle's ImageNet ResNet18 and ViT-B/16): which model needs which file, and its
checksummed download.

torchvision publishes no md5 for its weight files; each file's name carries the first hex digits of its
sha256 (``resnet18-f37072fd.pth``), and torchvision checks a download against that prefix. We do the same:
the bytes arrive through the project's ``fetch`` (retries, truncation check, atomic rename, mirror) and are
then checked against the prefix in their name; a mismatch is quarantined as ``<file>.corrupt``.
Standard library only: the Snakefile imports this module to know which train jobs need which file.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

from fedrepro.data.download import ChecksumError, fetch, file_digest

OFFICIAL_BASE = "https://download.pytorch.org/models/"
# weights name (torchvision's file name without .pth) -> what it is; names carry their sha256 prefix
WEIGHTS = {
    "resnet18-f37072fd": "torchvision resnet18 IMAGENET1K_V1",
    "vit_b_16-c867db91": "torchvision vit_b_16 IMAGENET1K_V1",
}
# model (fedrepro.models.MODELS) -> the weights it loads at paper scale
MODEL_WEIGHTS = {
    "resnet18_imagenet": "resnet18-f37072fd",
    "vit_b16_lora": "vit_b_16-c867db91",
}


def weights_of(model: str) -> str | None:
    """The weights name model ``model`` loads, or None for models trained from scratch."""
    return MODEL_WEIGHTS.get(model)


def sha256_prefix(name: str) -> str:
    """The sha256 prefix a weights name carries after its last '-' (torchvision's convention)."""
    prefix = name.rsplit("-", 1)[-1]
    if "-" not in name or len(prefix) < 6 or any(c not in "0123456789abcdef" for c in prefix):
        raise ValueError(f"weights name {name!r} carries no sha256 prefix ('<name>-<hex digits>')")
    return prefix


def sha256sum(path: Path) -> str:
    return file_digest(path, "sha256")


def _verified(path: Path, prefix: str) -> bool:
    return sha256sum(path).startswith(prefix)


def download_weights(name: str, dest: Path, mirror: str | None = None, *, retries: int = 2) -> Path:
    """Download weights ``name`` to ``dest`` (from ``mirror``, a base URL serving ``<name>.pth``, else
    download.pytorch.org) unless ``dest`` already holds them; verify the sha256 prefix in the name."""
    if name not in WEIGHTS:
        raise ValueError(f"unknown weights {name!r}; known: {', '.join(sorted(WEIGHTS))}")
    return fetch_verified(name, Path(dest), (mirror or OFFICIAL_BASE).rstrip("/") + f"/{name}.pth", retries=retries)


def fetch_verified(name: str, dest: Path, url: str, *, retries: int = 2) -> Path:
    """``fetch`` ``url`` to ``dest`` and check its sha256 against the prefix that ``name`` carries; a stale or
    corrupt copy is moved to ``<dest>.corrupt`` (a later call downloads it again) and raises ChecksumError."""
    prefix = sha256_prefix(name)
    bad = dest.with_name(dest.name + ".corrupt")
    if dest.exists() and not _verified(dest, prefix):
        os.replace(dest, bad)  # a damaged copy from an earlier run: keep it for inspection, fetch anew
    # no full checksum to pin (the name carries a prefix): length-checked only, the prefix check follows
    fetch(url, dest, None, retries=retries, unpinned_ok=True)
    actual = sha256sum(dest)
    if not actual.startswith(prefix):
        os.replace(dest, bad)
        raise ChecksumError(f"sha256 mismatch for {dest.name} downloaded from {url}: expected a sha256 starting "
                            f"{prefix} (the prefix in the name {name!r}), actual {actual}; quarantined as {bad}")
    return dest


def download_step(name: str, out: Path, mirror: str | None, log: Callable[[str], None]) -> None:
    """The download_weights rule's step: fetch, verify, log what arrived."""
    path = download_weights(name, Path(out), mirror)
    log(f"{name} ({WEIGHTS[name]}): {path} ({path.stat().st_size} bytes, sha256 {sha256sum(path)})")
