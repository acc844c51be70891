"""Download and prepare the papers' vision data sets: MNIST, Fashion-MNIST, CIFAR-10/100, SVHN.

File names, URLs and md5 sums are the ones torchvision uses (tests compare them with torchvision's
source). The raw files are parsed here with numpy/gzip/tarfile/pickle (and scipy.io for SVHN) so that
neither torch nor torchvision is needed to prepare data.
"""

from __future__ import annotations

import gzip
import io
import pickle
import tarfile
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from fedrepro.data.download import DownloadError, copy_local, fetch

Arrays = tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, dict[str, Any]]


@dataclass(frozen=True)
class Source:
    """Where a data set's raw files come from: base URLs tried in order, and file name -> md5.

    `payload_sha256`: file name -> sha256 of the decompressed content of a .gz file, which a repackaged
    copy (another gzip of the same bytes) keeps while its md5 changes. `debian_package` ships the files.
    """

    mirrors: tuple[str, ...]
    files: dict[str, str]
    license: str
    payload_sha256: dict[str, str] = field(default_factory=dict)
    debian_package: str | None = None


IDX_FILES = ("train-images-idx3-ubyte.gz", "train-labels-idx1-ubyte.gz",
        "t10k-images-idx3-ubyte.gz", "t10k-labels-idx1-ubyte.gz")

SOURCES: dict[str, Source] = {
    "mnist": Source(
        ("https://ossci-datasets.s3.amazonaws.com/mnist/", "http://yann.lecun.com/exdb/mnist/"),
        dict(zip(IDX_FILES, ("f68b3c2dcbeaaa9fbdd348bbdeb94873", "d53e105ee54ea40749a09fcbcd1e9432",
                        "9fb629c4189551a2d022fa330f9573f3", "ec29112dd5afa0611ce80d1b7f02629c"),
                 strict=True)),
        "Y. LeCun, C. Cortes, C. J. C. Burges; CC BY-SA 3.0"),
    "fashion_mnist": Source(
        ("http://fashion-mnist.s3-website.eu-central-1.amazonaws.com/",),
        dict(zip(IDX_FILES, ("8d4fb7e6c68d591d4c3dfef9ec88bf0d", "25c81989df183df01b3e8a0aad5dffbe",
                        "bef4ecab320f06d8554ea6380940ec79", "bb300cfdad3c16e7a12a480ee83cd310"),
                 strict=True)),
        "Zalando Research; MIT licence",
        # sha256 of the four idx files as the publisher's .gz files decompress (the Debian package
        # dataset-fashion-mnist ships the same idx bytes, recompressed; its label files' payloads equal
        # those of the publisher's repository, whose .gz files have the md5 sums above)
        dict(zip(IDX_FILES, ("c59f468a2f672dc815687fe0f83887768d799fd8a3f3276145d20f83aa44d888",
                        "bad3541b69d912435c50bb6ba87bec294ff4f6a2e1246121d8633921760443d9",
                        "5b4141f0afbad91edebe8549f8fcffe087ea10ca49f1dbef5c9a5cd8815ce37b",
                        "0402a96d92fd2663957122ceb108a494c5af83dab82d92729df917d7dec38c34"),
                 strict=True)),
        "dataset-fashion-mnist"),
    "cifar10": Source(
        ("https://www.cs.toronto.edu/~kriz/",),
        {"cifar-10-python.tar.gz": "c58f30108f718f92721af3b95e74349a"},
        "A. Krizhevsky 2009, Learning Multiple Layers of Features from Tiny Images"),
    "cifar100": Source(
        ("https://www.cs.toronto.edu/~kriz/",),
        {"cifar-100-python.tar.gz": "eb9058c3a382ffc7106e4002c42a8d85"},
        "A. Krizhevsky 2009, Learning Multiple Layers of Features from Tiny Images"),
    "svhn": Source(
        ("http://ufldl.stanford.edu/housenumbers/",),
        {"train_32x32.mat": "e26dedcc434d2e4c54c9b2d4a06d8373",
         "test_32x32.mat": "eb5a983be6a315427106f1b164d9cef3"},
        "Netzer et al. 2011; non-commercial use only"),
}

DIGIT_CLASSES = [str(d) for d in range(10)]
FASHION_CLASSES = ["T-shirt/top", "Trouser", "Pullover", "Dress", "Coat", "Sandal", "Shirt", "Sneaker",
                   "Bag", "Ankle boot"]


def download(name: str, raw_dir: Path, mirror: str | None = None,
             checksums: dict[str, str] | None = None, local_dirs: Iterable[Path | str] = ()) -> list[Path]:
    """Fetch every raw file of data set `name` into raw_dir; return their paths.

    A file already in raw_dir that passes its checks is kept; otherwise the first of `local_dirs` that
    has it (e.g. a Debian dataset package's directory) is copied, then the network is asked. `mirror`
    replaces the official base URLs; `checksums` overrides md5 sums by file name. An unreachable
    official mirror falls back to the next one; a checksum error does not (it is loud), and neither
    does a local copy that fails its checks.
    """
    src = SOURCES[name]
    bases = (mirror,) if mirror else src.mirrors
    local_dirs = [Path(d) for d in local_dirs]
    paths = []
    for fname, md5 in src.files.items():
        md5 = (checksums or {}).get(fname, md5)
        payload_sha = src.payload_sha256.get(fname)
        dest = Path(raw_dir) / fname
        local = copy_local(fname, local_dirs, dest, md5, payload_sha=payload_sha)
        if local is not None:
            paths.append(local)
            continue
        errors = []
        for base in bases:
            try:
                paths.append(fetch(base.rstrip("/") + "/" + fname, dest, md5, payload_sha=payload_sha))
                break
            except DownloadError as e:
                errors.append(str(e))
        else:
            raise DownloadError(f"{name}: no mirror served {fname}:\n  " + "\n  ".join(errors)
                                + _where_else(src, fname, local_dirs))
    return paths


def _where_else(src: Source, fname: str, local_dirs: list[Path]) -> str:
    """The local places looked in before the network, and the package that would fill one."""
    lines = [f"\n  not in any local directory either ({', '.join(map(str, local_dirs))}; config key "
             f"local_data_dirs)" if local_dirs else
             "\n  no local directory was looked in (config key local_data_dirs names them per data set)"]
    if src.debian_package:
        lines.append(f"\n  Debian's package {src.debian_package} ships {fname} where local_data_dirs looks by "
                     f"default: install it (apt-get install {src.debian_package} as root; `make` does that)")
    return "".join(lines)


def raw_file(raw_dir: Path, fname: str) -> Path:
    path = Path(raw_dir) / fname
    if not path.exists():
        raise FileNotFoundError(f"{path} is missing: run the data set's download step first, or place the "
                                f"official file there by hand")
    return path


def read_idx(path: Path) -> np.ndarray:
    """Parse an (optionally gzipped) idx file of unsigned bytes, as MNIST and Fashion-MNIST ship."""
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rb") as f:
        data = f.read()
    zero, dtype_code, ndim = data[0:2], data[2], data[3]
    if zero != b"\0\0" or dtype_code != 0x08:
        raise ValueError(f"{path}: not an idx file of unsigned bytes (magic {data[:4].hex()})")
    dims = [int.from_bytes(data[4 + 4 * i: 8 + 4 * i], "big") for i in range(ndim)]
    body = np.frombuffer(data, dtype=np.uint8, offset=4 + 4 * ndim)
    if body.size != int(np.prod(dims)):
        raise ValueError(f"{path}: header says {dims} ({int(np.prod(dims))} bytes), body has {body.size}")
    return body.reshape(dims)


def _prepare_idx(name: str, raw_dir: Path, classes: list[str]) -> Arrays:
    x_tr, y_tr, x_te, y_te = (read_idx(raw_file(raw_dir, f)) for f in IDX_FILES)
    meta = {"name": name, "num_classes": 10, "classes": classes, "shape": [28, 28, 1],
            "source": SOURCES[name].mirrors[0], "license": SOURCES[name].license}
    return x_tr[..., None], y_tr.astype(np.int64), x_te[..., None], y_te.astype(np.int64), meta


def prepare_mnist(raw_dir: Path) -> Arrays:
    """MNIST from its four idx gz files."""
    return _prepare_idx("mnist", raw_dir, DIGIT_CLASSES)


def prepare_fashion_mnist(raw_dir: Path) -> Arrays:
    """Fashion-MNIST from its four idx gz files."""
    return _prepare_idx("fashion_mnist", raw_dir, FASHION_CLASSES)


class _ArrayUnpickler(pickle.Unpickler):
    """Unpickles only plain containers and numpy arrays: a pickle from a mirror cannot run code."""

    # _codecs.encode only turns text into bytes: Python 3 writes bytes that way in protocol-2 pickles.
    _ALLOWED = {("numpy.core.multiarray", "_reconstruct"), ("numpy._core.multiarray", "_reconstruct"),
                ("numpy", "ndarray"), ("numpy", "dtype"), ("_codecs", "encode")}

    def find_class(self, module: str, name: str) -> Any:
        if (module, name) not in self._ALLOWED:
            raise pickle.UnpicklingError(f"refusing to unpickle {module}.{name}")
        return super().find_class(module, name)


def _unpickle(tar: tarfile.TarFile, member: str) -> dict[str, Any]:
    f = tar.extractfile(member)
    if f is None:
        raise ValueError(f"{tar.name}: {member} is not a regular file")
    # latin1: the CIFAR pickles were written by Python 2 (byte strings become str, arrays stay intact).
    return _ArrayUnpickler(io.BytesIO(f.read()), encoding="latin1").load()


def _cifar_images(batches: list[dict[str, Any]]) -> np.ndarray:
    # Rows are 3072 bytes: the red, green, then blue 32x32 planes.
    data = np.concatenate([np.asarray(b["data"], dtype=np.uint8) for b in batches])
    return data.reshape(-1, 3, 32, 32).transpose(0, 2, 3, 1).copy()


def prepare_cifar10(raw_dir: Path) -> Arrays:
    """CIFAR-10 from the python-version tar.gz (read in place, never extracted)."""
    with tarfile.open(raw_file(raw_dir, "cifar-10-python.tar.gz"), "r:gz") as tar:
        train = [_unpickle(tar, f"cifar-10-batches-py/data_batch_{i}") for i in range(1, 6)]
        test = [_unpickle(tar, "cifar-10-batches-py/test_batch")]
        classes = list(_unpickle(tar, "cifar-10-batches-py/batches.meta")["label_names"])
    meta = {"name": "cifar10", "num_classes": len(classes), "classes": classes, "shape": [32, 32, 3],
            "source": SOURCES["cifar10"].mirrors[0] + "cifar-10-python.tar.gz",
            "license": SOURCES["cifar10"].license}
    y_tr = np.concatenate([np.asarray(b["labels"], dtype=np.int64) for b in train])
    y_te = np.asarray(test[0]["labels"], dtype=np.int64)
    return _cifar_images(train), y_tr, _cifar_images(test), y_te, meta


def prepare_cifar100(raw_dir: Path) -> Arrays:
    """CIFAR-100 with its 100 fine labels; the 20 coarse ones stay available through meta.

    meta["coarse_classes"] names the super-classes and meta["fine_to_coarse"][fine] gives each fine
    class's super-class, so coarse labels are ``np.asarray(meta["fine_to_coarse"])[y]``.
    """
    with tarfile.open(raw_file(raw_dir, "cifar-100-python.tar.gz"), "r:gz") as tar:
        train = _unpickle(tar, "cifar-100-python/train")
        test = _unpickle(tar, "cifar-100-python/test")
        names = _unpickle(tar, "cifar-100-python/meta")
    classes, coarse_classes = list(names["fine_label_names"]), list(names["coarse_label_names"])
    fine_to_coarse = [-1] * len(classes)
    for split in (train, test):
        for f, c in zip(split["fine_labels"], split["coarse_labels"], strict=True):
            if fine_to_coarse[f] not in (-1, c):
                raise ValueError(f"CIFAR-100: fine class {f} appears under coarse classes "
                                 f"{fine_to_coarse[f]} and {c}")
            fine_to_coarse[f] = int(c)
    meta = {"name": "cifar100", "num_classes": len(classes), "classes": classes, "shape": [32, 32, 3],
            "coarse_classes": coarse_classes, "fine_to_coarse": fine_to_coarse,
            "source": SOURCES["cifar100"].mirrors[0] + "cifar-100-python.tar.gz",
            "license": SOURCES["cifar100"].license}
    return (_cifar_images([train]), np.asarray(train["fine_labels"], dtype=np.int64),
            _cifar_images([test]), np.asarray(test["fine_labels"], dtype=np.int64), meta)


def _svhn_split(path: Path) -> tuple[np.ndarray, np.ndarray]:
    import scipy.io  # lazy: only SVHN needs scipy, and importing it costs a quarter second

    mat = scipy.io.loadmat(path)
    x = np.ascontiguousarray(np.asarray(mat["X"], dtype=np.uint8).transpose(3, 0, 1, 2))  # HWCN -> NHWC
    y = np.asarray(mat["y"]).astype(np.int64).reshape(-1)
    y[y == 10] = 0  # SVHN labels the digit 0 as class 10
    return x, y


def prepare_svhn(raw_dir: Path) -> Arrays:
    """SVHN (cropped digits, train + test; the 'extra' split is not used) from the .mat files."""
    x_tr, y_tr = _svhn_split(raw_file(raw_dir, "train_32x32.mat"))
    x_te, y_te = _svhn_split(raw_file(raw_dir, "test_32x32.mat"))
    meta = {"name": "svhn", "num_classes": 10, "classes": DIGIT_CLASSES, "shape": [32, 32, 3],
            "source": SOURCES["svhn"].mirrors[0], "license": SOURCES["svhn"].license}
    return x_tr, y_tr, x_te, y_te, meta
