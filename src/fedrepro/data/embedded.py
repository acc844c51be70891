"""Embedded data sets built from real data that ships inside scikit-learn (no download, no torch).

``digits``: scikit-learn's 1797 handwritten 8x8 digits (UCI optdigits), scaled to 0..255 and upscaled to
MNIST's 28x28. ``digits_m``: an MNIST-M-style colour domain of the same digits, built as MNIST-M is
(Ganin & Lempitsky 2015): each digit is blended with a random 28x28 patch of a natural photograph as
``|patch - digit|`` per channel; the photographs are scikit-learn's two sample images. Both share one
fixed stratified 75/25 train/test split: the data sets are fixed, run seeds never change them.
``fashion_mnist_m``: the same blend applied to every prepared Fashion-MNIST image (its own train/test split),
a FedGTST-style MNIST -> MNIST-M transfer on the one paper-family data set that is real offline.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

SIDE = 28
TEST_FRACTION = 0.25
SPLIT_SEED = 1797  # fixed: part of the data set's definition, not of any run
TEXTURE_SEED = 2015
CLASSES = [str(d) for d in range(10)]

Arrays = tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, dict[str, Any]]


def load_digits_28() -> tuple[np.ndarray, np.ndarray]:
    """All 1797 digits as uint8 [N, 28, 28, 1] (0..255, bilinear upscaling) and int64 labels."""
    from PIL import Image
    from sklearn.datasets import load_digits

    d = load_digits()
    scaled = d.images.astype(np.float32) * (255.0 / 16.0)
    # Bilinear never overshoots, so the 0..255 range survives without clipping artefacts.
    big = np.stack([np.asarray(Image.fromarray(im).resize((SIDE, SIDE), Image.BILINEAR))
                    for im in scaled])
    x = np.clip(np.rint(big), 0, 255).astype(np.uint8)[..., None]
    return x, d.target.astype(np.int64)


def split_indices(y: np.ndarray, test_fraction: float = TEST_FRACTION,
                  seed: int = SPLIT_SEED) -> tuple[np.ndarray, np.ndarray]:
    """A stratified split: round(test_fraction * n_c) random items of each class go to test.

    Implemented here rather than via sklearn's train_test_split so that the split is pinned by this
    code and numpy's PCG64 stream alone; indices come back sorted.
    """
    rng = np.random.default_rng(seed)
    test = []
    for c in np.unique(y):
        idx = np.flatnonzero(y == c)
        test.append(rng.permutation(idx)[: int(round(test_fraction * len(idx)))])
    test_idx = np.sort(np.concatenate(test))
    train_idx = np.setdiff1d(np.arange(len(y)), test_idx)
    return train_idx, test_idx


def sample_textures() -> list[np.ndarray]:
    """scikit-learn's two sample photographs (china.jpg, flower.jpg) as uint8 [H, W, 3]."""
    from sklearn.datasets import load_sample_images

    return [np.asarray(im, dtype=np.uint8) for im in load_sample_images().images]


def blend_mnistm(digits: np.ndarray, textures: list[np.ndarray],
                 seed: int = TEXTURE_SEED) -> tuple[np.ndarray, np.ndarray]:
    """MNIST-M blending: per digit, a random photo and a random patch; returns (|patch - digit|, patches).

    digits: uint8 [N, H, W, 1]; result and patches: uint8 [N, H, W, 3].
    """
    rng = np.random.default_rng(seed)
    n, h, w, _ = digits.shape
    patches = np.empty((n, h, w, 3), dtype=np.uint8)
    for i in range(n):
        photo = textures[rng.integers(len(textures))]
        top = rng.integers(photo.shape[0] - h + 1)
        left = rng.integers(photo.shape[1] - w + 1)
        patches[i] = photo[top:top + h, left:left + w, :3]
    blended = np.abs(patches.astype(np.int16) - digits.astype(np.int16)).astype(np.uint8)
    return blended, patches


def _meta(name: str, shape: list[int], source_note: str) -> dict[str, Any]:
    return {"name": name, "num_classes": 10, "classes": CLASSES, "shape": shape, "source": "scikit-learn",
            "license": source_note}


_DIGITS_NOTE = "sklearn.datasets.load_digits: UCI Optical Recognition of Handwritten Digits, CC BY 4.0"
_PHOTOS_NOTE = ("scikit-learn sample images china.jpg and flower.jpg (Flickr, CC BY 2.0, see "
                "sklearn/datasets/images/README.txt)")


def digits(raw_dir: Path | None = None) -> Arrays:
    """The embedded grey digits data set (raw_dir is unused: the data ships with scikit-learn)."""
    x, y = load_digits_28()
    tr, te = split_indices(y)
    return x[tr], y[tr], x[te], y[te], _meta("digits", [SIDE, SIDE, 1], _DIGITS_NOTE)


def digits_m(raw_dir: Path | None = None) -> Arrays:
    """The embedded MNIST-M-style colour digits: same images, labels and split as `digits`."""
    x, y = load_digits_28()
    tr, te = split_indices(y)
    # Blend all 1797 in their original order, so each image's patch does not depend on the split.
    xm, _ = blend_mnistm(x, sample_textures())
    return xm[tr], y[tr], xm[te], y[te], _meta("digits_m", [SIDE, SIDE, 3], f"{_DIGITS_NOTE}; textures: {_PHOTOS_NOTE}")


def fashion_mnist_m(inputs: list[Path]) -> Arrays:
    """Fashion-MNIST blended MNIST-M-style (``inputs``: the prepared fashion_mnist.npz): the same images,
    labels and train/test split, train then test blended in one pass so a test image's patch does not depend
    on the training set's size."""
    from fedrepro.data.format import load_prepared

    (source,) = inputs
    p = load_prepared(source)  # checked: its meta has name, shape, classes
    if p.meta["name"] != "fashion_mnist" or tuple(p.meta["shape"]) != (SIDE, SIDE, 1):
        raise ValueError(f"fashion_mnist_m: {source} holds {p.meta['name']!r} of shape {p.meta['shape']}, "
                         f"need fashion_mnist at {SIDE}x{SIDE}x1")
    blended, _ = blend_mnistm(np.concatenate([p.x_train, p.x_test]), sample_textures())
    note = f"{p.meta.get('license', 'Fashion-MNIST')}; textures: {_PHOTOS_NOTE}"
    meta = {**_meta("fashion_mnist_m", [SIDE, SIDE, 3], note), "classes": p.meta["classes"],
            "source": "fashion_mnist blended with scikit-learn's sample images"}
    n = len(p.y_train)
    return blended[:n], p.y_train, blended[n:], p.y_test, meta


PATCH_SEED = 2025
PATCHES_PER_PHOTO = 600
PATCH_CLASSES = ["china-dark", "china-bright", "flower-dark", "flower-bright"]


def photo_patches(raw_dir: Path | None = None) -> Arrays:
    """Out-of-domain images with another label set (Feddle's server data at laptop scale): grey 28x28 patches
    of scikit-learn's two sample photographs at random positions, 600 per photo, labelled by a rule:
    class = 2 * photo (0 china.jpg, 1 flower.jpg) + (patch mean brightness above that photo's median patch
    brightness). Grey is ITU-R BT.601 luma; the same fixed stratified 75/25 split rule as `digits`."""
    rng = np.random.default_rng(PATCH_SEED)
    xs, ys = [], []
    for photo_id, photo in enumerate(sample_textures()):
        grey = photo[..., :3].astype(np.float32) @ np.array([0.299, 0.587, 0.114], dtype=np.float32)
        tops = rng.integers(0, grey.shape[0] - SIDE + 1, PATCHES_PER_PHOTO)
        lefts = rng.integers(0, grey.shape[1] - SIDE + 1, PATCHES_PER_PHOTO)
        patches = np.stack([grey[t:t + SIDE, s:s + SIDE] for t, s in zip(tops, lefts, strict=True)])
        brightness = patches.mean(axis=(1, 2))
        xs.append(np.clip(np.rint(patches), 0, 255).astype(np.uint8)[..., None])
        ys.append(2 * photo_id + (brightness > np.median(brightness)).astype(np.int64))
    x, y = np.concatenate(xs), np.concatenate(ys)
    tr, te = split_indices(y)
    meta = {"name": "photo_patches", "num_classes": len(PATCH_CLASSES), "classes": PATCH_CLASSES,
            "shape": [SIDE, SIDE, 1], "source": "scikit-learn",
            "license": _PHOTOS_NOTE}
    return x[tr], y[tr], x[te], y[te], meta
