"""Feddle's server data sets: the embedded out-of-domain photo patches and the paper-scale ImageNet subset
(prepared from a miniature archive with ImageNet's nested-tar layout)."""

from __future__ import annotations

import io
import tarfile

import numpy as np
import pytest
from PIL import Image

from fedrepro.data import embedded, imagenet_subset


def test_photo_patches_follow_their_labelling_rule():
    x_tr, y_tr, x_te, y_te, meta = embedded.photo_patches()
    assert meta["num_classes"] == 4 and x_tr.shape[1:] == (28, 28, 1) and x_tr.dtype == np.uint8
    assert np.bincount(y_tr).tolist() == [225] * 4 and np.bincount(y_te).tolist() == [75] * 4
    x, y = np.concatenate([x_tr, x_te]), np.concatenate([y_tr, y_te])
    for photo in (0, 1):  # within a photo, every "bright" patch is brighter than every "dark" one (up to rounding)
        bright = x[y == 2 * photo + 1].mean(axis=(1, 2, 3))
        dark = x[y == 2 * photo].mean(axis=(1, 2, 3))
        assert bright.min() >= dark.max() - 0.5
    again = embedded.photo_patches()
    assert np.array_equal(again[0], x_tr) and np.array_equal(again[1], y_tr)


def _jpeg(value: int) -> bytes:
    buf = io.BytesIO()
    Image.fromarray(np.full((40, 60, 3), value, dtype=np.uint8)).save(buf, format="JPEG")
    return buf.getvalue()


def _add(tar: tarfile.TarFile, name: str, data: bytes) -> None:
    info = tarfile.TarInfo(name)
    info.size = len(data)
    tar.addfile(info, io.BytesIO(data))


def test_imagenet_subset_takes_the_first_images_of_each_class_archive(tmp_path, monkeypatch):
    monkeypatch.setattr(imagenet_subset, "TRAIN_PER_CLASS", 2)
    monkeypatch.setattr(imagenet_subset, "TEST_PER_CLASS", 1)
    monkeypatch.setattr(imagenet_subset, "NUM_CLASSES", 3)
    with tarfile.open(tmp_path / imagenet_subset.ARCHIVE, "w") as outer:
        for k, wnid in enumerate(["n03", "n01", "n02"]):  # archive order is not label order
            inner_buf = io.BytesIO()
            with tarfile.open(fileobj=inner_buf, mode="w") as inner:
                for i in range(4):
                    _add(inner, f"{wnid}_{i}.JPEG", _jpeg(40 * k + 10 * i))
            _add(outer, f"{wnid}.tar", inner_buf.getvalue())
    x_tr, y_tr, x_te, y_te, meta = imagenet_subset.prepare(tmp_path)
    assert meta["classes"] == ["n01", "n02", "n03"] and x_tr.shape == (6, 32, 32, 3)
    assert y_tr.tolist() == [0, 0, 1, 1, 2, 2] and y_te.tolist() == [0, 1, 2]
    # n01 was the second archive (k = 1): its first two images are 40 and 50, its test image 60
    assert [round(float(v)) for v in x_tr[:2].mean(axis=(1, 2, 3))] == [40, 50]
    assert round(float(x_te[0].mean())) == 60


def test_imagenet_subset_without_its_archive_says_how_to_get_it(tmp_path):
    with pytest.raises(FileNotFoundError, match="image-net.org"):
        imagenet_subset.check(tmp_path)
