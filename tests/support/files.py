"""Small files in the real formats of the data sets' publishers, and what a local HTTP server serves of them (the
server and the no-retry-wait fixtures are tests/datasets/conftest.py's)."""

from __future__ import annotations

import ast
import contextlib
import gzip
import hashlib
import importlib.util
import io
import pickle
import tarfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import scipy.io

from fedrepro.data import vision


@dataclass
class FileServer:
    """What the server serves (path -> bytes), which paths it cuts off mid-body, and what was asked."""

    url: str = ""
    files: dict[str, bytes] = field(default_factory=dict)
    cut_off: set[str] = field(default_factory=set)
    requests: list[str] = field(default_factory=list)


def md5(data: bytes) -> str:
    return hashlib.md5(data).hexdigest()


RNG = np.random.default_rng(0)


def idx_gz(arr: np.ndarray) -> bytes:
    header = bytes([0, 0, 0x08, arr.ndim]) + b"".join(int(d).to_bytes(4, "big") for d in arr.shape)
    return gzip.compress(header + arr.astype(np.uint8).tobytes(), mtime=0)


def pickle_bytes(obj: Any) -> bytes:
    return pickle.dumps(obj, protocol=2)


def tar_gz(members: dict[str, bytes]) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def cifar_rows(n: int) -> tuple[np.ndarray, np.ndarray]:
    """n random images as NHWC and as CIFAR's rows of R, G, B planes."""
    x = RNG.integers(0, 256, (n, 32, 32, 3), dtype=np.uint8)
    return x, x.transpose(0, 3, 1, 2).reshape(n, 3072)


def make_mnist() -> tuple[dict[str, bytes], tuple[np.ndarray, ...]]:
    x_tr, x_te = RNG.integers(0, 256, (30, 28, 28), dtype=np.uint8), RNG.integers(0, 256, (10, 28, 28),
                                                                                   dtype=np.uint8)
    y_tr, y_te = RNG.integers(0, 10, 30), RNG.integers(0, 10, 10)
    files = dict(zip(vision.SOURCES["mnist"].files, map(idx_gz, (x_tr, y_tr, x_te, y_te)), strict=True))
    return files, (x_tr[..., None], y_tr, x_te[..., None], y_te)


def make_cifar10() -> tuple[dict[str, bytes], tuple[np.ndarray, ...]]:
    xs, ys, members = [], [], {}
    for i in range(1, 7):
        x, rows = cifar_rows(4)
        y = RNG.integers(0, 10, 4).tolist()
        name = f"data_batch_{i}" if i < 6 else "test_batch"
        members[f"cifar-10-batches-py/{name}"] = pickle_bytes(
            {"batch_label": name, "labels": y, "data": rows, "filenames": [f"{j}.png" for j in range(4)]}
        )
        xs.append(x)
        ys.append(y)
    names = ["airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck"]
    members["cifar-10-batches-py/batches.meta"] = pickle_bytes(
        {"num_cases_per_batch": 4, "label_names": names, "num_vis": 3072})
    arrays = (np.concatenate(xs[:5]), np.concatenate(ys[:5]), xs[5], np.asarray(ys[5]))
    return {"cifar-10-python.tar.gz": tar_gz(members)}, arrays


def make_cifar100() -> tuple[dict[str, bytes], tuple[np.ndarray, ...]]:
    members, arrays = {}, []
    for split, n in (("train", 12), ("test", 6)):
        x, rows = cifar_rows(n)
        fine = RNG.integers(0, 100, n)
        members[f"cifar-100-python/{split}"] = pickle_bytes(
            {"filenames": [f"{j}.png" for j in range(n)], "batch_label": split, "fine_labels": fine.tolist(),
             "coarse_labels": (fine // 5).tolist(), "data": rows})
        arrays += [x, fine]
    names = {"fine_label_names": [f"f{i}" for i in range(100)],
             "coarse_label_names": [f"c{i}" for i in range(20)]}
    members["cifar-100-python/meta"] = pickle_bytes(names)
    return {"cifar-100-python.tar.gz": tar_gz(members)}, tuple(arrays)


def make_svhn() -> tuple[dict[str, bytes], tuple[np.ndarray, ...]]:
    files, arrays = {}, []
    for fname, n in (("train_32x32.mat", 7), ("test_32x32.mat", 5)):
        x = RNG.integers(0, 256, (n, 32, 32, 3), dtype=np.uint8)
        y = np.array([10, 1, 2, 3, 4, 5, 6, 7, 8, 9][:n], dtype=np.uint8)  # 10 stands for the digit 0
        buf = io.BytesIO()
        scipy.io.savemat(buf, {"X": x.transpose(1, 2, 3, 0), "y": y[:, None]})  # SVHN stores HWCN, N x 1
        files[fname] = buf.getvalue()
        arrays += [x, np.where(y == 10, 0, y)]
    return files, tuple(arrays)


MAKERS = {"mnist": make_mnist, "cifar10": make_cifar10, "cifar100": make_cifar100, "svhn": make_svhn}


def torchvision_class_attrs(module: str) -> dict[str, dict[str, Any]]:
    """Literal class attributes of torchvision.datasets.<module>, read from source (no torch import)."""
    spec = importlib.util.find_spec("torchvision")
    if spec is None or spec.origin is None:
        pytest.skip("torchvision is not installed")
    tree = ast.parse((Path(spec.origin).parent / "datasets" / f"{module}.py").read_text())
    out: dict[str, dict[str, Any]] = {}
    for cls in (n for n in tree.body if isinstance(n, ast.ClassDef)):
        attrs = out.setdefault(cls.name, {})
        for stmt in cls.body:
            if isinstance(stmt, ast.Assign) and isinstance(stmt.targets[0], ast.Name):
                # Computed attributes (e.g. EMNIST's class lists) are not literals and not needed.
                with contextlib.suppress(ValueError):
                    attrs[stmt.targets[0].id] = ast.literal_eval(stmt.value)
    return out
