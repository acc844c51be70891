"""The data set registry: every data set the studies may name, how to download and prepare it.

Importing this module costs only numpy: scikit-learn, PIL and scipy are imported inside the functions
that need them, and torch is never imported by fedrepro.data.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from fedrepro.data import (
    domainnet,
    embedded,
    feddisco_sets,
    feddle_sets,
    fedl2g_sets,
    imagenet_subset,
    mnist_m,
    vision,
)
from fedrepro.data.format import save_prepared


@dataclass(frozen=True)
class Size:
    """A data set's sizes as prepared, known without downloading it: the config check (fedrepro.config), the
    cost estimate (fedrepro.cost) and the preflight's synthetic data (fedrepro.preflight) read them.

    `train` training samples (an estimate when `estimated`), `shape` one input's shape (H, W, C; text: (tokens,)),
    `classes` the labels trained on; `test` the test split's size where partitions may pool it (`pool_test`);
    `partition_classes` the labels partitions are drawn over when they are not the trained ones."""

    train: int
    shape: tuple[int, ...]
    classes: int
    test: int | None = None
    estimated: bool = False
    partition_classes: int | None = None


@dataclass(frozen=True)
class DatasetSpec:
    """One data set: `download(raw_dir, mirror=None, checksums=None)` and `prepare(raw_dir)`.

    `files` names the raw files the download step leaves in raw_dir (empty: the vision tables say).
    `built_from` names prepared data sets this one is made of (DomainNet's leave-one-out sources): its
    `prepare` then takes their .npz paths, which live beside its own output. `local_copies`: its
    download also takes `local_dirs`, directories searched for the raw files before the network.
    `size`: its sizes as prepared (None for a data set no study trains on, e.g. a server's stand-in set).
    """

    name: str
    needs_download: bool
    download: Callable[..., list[Path]] | None
    prepare: Callable[..., tuple[Any, ...]]
    manual_instructions: str | None
    files: tuple[str, ...] = ()
    built_from: tuple[str, ...] = ()
    local_copies: bool = False
    size: Size | None = None


def _manual(name: str) -> str:
    src = vision.SOURCES[name]
    lines = [f"Without network access, download these files (from {src.mirrors[0]}) into the raw directory "
             f"of {name}; the download step then only checks their md5:"]
    lines += [f"  {src.mirrors[0]}{fname}  md5 {md5}" for fname, md5 in src.files.items()]
    if src.payload_sha256:
        lines.append("A repackaged copy (other gzip bytes, same content) passes by the sha256 of its decompressed "
                     "content instead:")
        lines += [f"  {fname}  decompressed sha256 {sha}" for fname, sha in src.payload_sha256.items()]
    if src.debian_package:
        lines.append(f"Debian's package {src.debian_package} ships them: name its directory in the config's "
                     f"local_data_dirs (the default does) and the download step copies them from there.")
    return "\n".join(lines)


def _vision(name: str, prepare: Callable[[Path], tuple[Any, ...]], size: Size) -> DatasetSpec:
    return DatasetSpec(name, True, partial(vision.download, name), prepare, _manual(name), local_copies=True,
                       size=size)


# DomainNet (FedGTST): train sizes of the official splits, images prepared at 64x64 (data/domainnet.py)
_DOMAINNET_TRAIN = {"clipart": 33525, "infograph": 36023, "painting": 50426, "quickdraw": 120750,
                    "real": 120906, "sketch": 48212}


DATASETS: dict[str, DatasetSpec] = {
    "digits": DatasetSpec("digits", False, None, embedded.digits, None, size=Size(1347, (28, 28, 1), 10, test=450)),
    "digits_m": DatasetSpec("digits_m", False, None, embedded.digits_m, None, size=Size(1347, (28, 28, 3), 10)),
    # Fashion-MNIST blended as MNIST-M is: a FedGTST-style transfer on real data offline (measured, not taken:
    # docs/measurements/laptop-fedgtst.md)
    "fashion_mnist_m": DatasetSpec("fashion_mnist_m", False, None, embedded.fashion_mnist_m, None,
                                   built_from=("fashion_mnist",), size=Size(60000, (28, 28, 3), 10)),
    # Feddle's out-of-domain server data at laptop scale (other images, other labels)
    "photo_patches": DatasetSpec("photo_patches", False, None, embedded.photo_patches, None,
                                 size=Size(900, (28, 28, 1), 4, test=300)),
    # Feddle's out-of-domain server data at paper scale; downloaded by hand (ImageNet's licence)
    # (250 images of each ImageNet class, data/imagenet_subset.py)
    "imagenet_subset": DatasetSpec("imagenet_subset", True, imagenet_subset.check, imagenet_subset.prepare,
                                   imagenet_subset.manual_instructions(), imagenet_subset.FILES,
                                   size=Size(250000, (32, 32, 3), 1000)),
    "mnist": _vision("mnist", vision.prepare_mnist, Size(60000, (28, 28, 1), 10)),
    "fashion_mnist": _vision("fashion_mnist", vision.prepare_fashion_mnist, Size(60000, (28, 28, 1), 10)),
    "cifar10": _vision("cifar10", vision.prepare_cifar10, Size(50000, (32, 32, 3), 10, test=10000)),
    "cifar100": _vision("cifar100", vision.prepare_cifar100, Size(50000, (32, 32, 3), 100, test=10000)),
    "svhn": _vision("svhn", vision.prepare_svhn, Size(73257, (32, 32, 3), 10)),
    "cinic10": DatasetSpec("cinic10", True, partial(feddisco_sets.download, "cinic10"),
                           feddisco_sets.prepare_cinic10, feddisco_sets.manual_instructions("cinic10"),
                           tuple(feddisco_sets.REMOTES["cinic10"].files), size=Size(90000, (32, 32, 3), 10)),
    # Downloaded by hand: its "download" step only checks that the files are in place.
    "ham10000": DatasetSpec("ham10000", True, feddisco_sets.check_ham10000, feddisco_sets.prepare_ham10000,
                            feddisco_sets.manual_instructions("ham10000"), feddisco_sets.HAM_FILES,
                            size=Size(9805, (56, 56, 3), 7)),
    "ag_news": DatasetSpec("ag_news", True, partial(feddisco_sets.download, "ag_news"),
                           feddisco_sets.prepare_ag_news, feddisco_sets.manual_instructions("ag_news"),
                           tuple(feddisco_sets.REMOTES["ag_news"].files), size=Size(120000, (64,), 4)),
    # FedGTST: MNIST-M built from MNIST and BSDS500; DomainNet's six domains and their leave-one-outs
    "mnist_m": DatasetSpec("mnist_m", True, mnist_m.download, mnist_m.prepare_mnist_m,
                           mnist_m.manual_instructions(), mnist_m.FILES, size=Size(60000, (28, 28, 3), 10)),
    **{f"domainnet_{d}": DatasetSpec(f"domainnet_{d}", True, partial(domainnet.download, d),
                                     partial(domainnet.prepare_domain, d), domainnet.manual_instructions(d),
                                     tuple(domainnet.files(d)), size=Size(_DOMAINNET_TRAIN[d], (64, 64, 3), 345))
       for d in domainnet.DOMAINS},
    **{f"domainnet_no_{d}": DatasetSpec(f"domainnet_no_{d}", False, None,
                                        partial(domainnet.prepare_leave_one_out, d), None,
                                        built_from=tuple(f"domainnet_{s}" for s in domainnet.DOMAINS if s != d),
                                        size=Size(sum(_DOMAINNET_TRAIN.values()) - _DOMAINNET_TRAIN[d],
                                                  (64, 64, 3), 345))
       for d in domainnet.DOMAINS},
    # FedL2G: Oxford Flowers102 and Tiny-ImageNet, prepared at fedl2g_sets.SIDE (32x32)
    **{name: DatasetSpec(name, True, partial(fedl2g_sets.download, name), prepare,
                         fedl2g_sets.manual_instructions(name), tuple(fedl2g_sets.REMOTES[name].files), size=size)
       for name, prepare, size in (
           ("flowers102", fedl2g_sets.prepare_flowers102, Size(2040, (32, 32, 3), 102, test=6149)),
           ("tiny_imagenet", fedl2g_sets.prepare_tiny_imagenet, Size(100000, (32, 32, 3), 200, test=10000)))},
    # Feddle: CIFAR-100's 20 superclasses partitioned over its 100 fine labels (same archive as cifar100);
    # LEAF's FEMNIST (first 40 classes) and CelebA (Smiling), 1000 writers / people with per-sample ids for
    # the partition kind `writer`; CelebA is downloaded by hand (its licence)
    "cifar100_coarse": DatasetSpec("cifar100_coarse", True, partial(vision.download, "cifar100"),
                                   feddle_sets.prepare_cifar100_coarse,
                                   feddle_sets.manual_instructions("cifar100_coarse"),
                                   (feddle_sets.CIFAR100_FILE,),
                                   size=Size(50000, (32, 32, 3), 20, partition_classes=100)),
    "femnist": DatasetSpec("femnist", True, feddle_sets.download_femnist, feddle_sets.prepare_femnist,
                           feddle_sets.manual_instructions("femnist"), feddle_sets.FEMNIST_FILES,
                           size=Size(150000, (28, 28, 1), 40, estimated=True)),
    "celeba_smiling": DatasetSpec("celeba_smiling", True, feddle_sets.check_celeba,
                                  feddle_sets.prepare_celeba_smiling,
                                  feddle_sets.manual_instructions("celeba_smiling"), feddle_sets.CELEBA_FILES,
                                  size=Size(19000, (32, 32, 3), 2, estimated=True)),
}


# The sizes as the rest of the project reads them, derived from the entries above (their `size`). FEMNIST and
# CelebA (Feddle) keep 1000 writers / people with 90% of each one's samples for training (data/feddle_sets.py), so
# their sizes are estimates: ~165 samples of the first 40 classes per NIST writer, ~21 images per CelebA person
# with >= 5.
# (training samples, input shape, classes) of each data set as prepared
SHAPES: dict[str, tuple[int, tuple[int, ...], int]] = {
    name: (spec.size.train, spec.size.shape, spec.size.classes) for name, spec in DATASETS.items() if spec.size}
# test-split sizes, for partitions that pool train and test (`pool_test`, FedL2G)
TEST_SIZES: dict[str, int] = {name: spec.size.test for name, spec in DATASETS.items() if spec.size and spec.size.test}
# training sizes that are estimates, not counts
ESTIMATED_SIZES = frozenset(name for name, spec in DATASETS.items() if spec.size and spec.size.estimated)
# data sets whose partitions are drawn over other labels than the classes they train (partition_labels_train):
# the number of those labels
PARTITION_CLASSES = {name: spec.size.partition_classes for name, spec in DATASETS.items()
                     if spec.size and spec.size.partition_classes}


def get_spec(name: str) -> DatasetSpec:
    """The spec of data set `name`; ValueError listing the known names otherwise."""
    try:
        return DATASETS[name]
    except KeyError:
        raise ValueError(f"unknown data set {name!r}; known: {', '.join(sorted(DATASETS))}") from None


_PIN = re.compile(r"\b(?:[0-9a-fA-F]{32}|[0-9a-fA-F]{64})\b")
_URL = re.compile(r"\b[a-z][a-z0-9+.-]*://[^\s)'\"]+")


def download_problems(name: str) -> list[str]:
    """What is wrong with data set ``name``'s download as declared, found without the network (the preflight
    runs this for every data set a config reads): a downloadable data set must name its raw files, each on a line
    of its instructions with a pinned md5 or sha256 (the value the download step and a user placing the file by
    hand check against), and every address there must be an http(s) URL with a host. Empty when all is well."""
    spec = get_spec(name)
    if not spec.needs_download:
        return []
    files = raw_files(name)
    if not files:
        return [f"{name}: names no raw files"]
    lines = (spec.manual_instructions or "").splitlines()
    problems = [f"{name}: raw file {f} has no pinned md5 or sha256 beside it in its instructions"
                for f in files if not any(_PIN.search(line) for line in lines if f in line)]
    for url in _URL.findall(spec.manual_instructions or ""):
        parts = urlparse(url)
        if parts.scheme not in ("http", "https") or not parts.netloc:
            problems.append(f"{name}: {url!r} is no http(s) address")
    return problems


def data_sets_read(study: dict) -> set[str]:
    """Every data set a resolved study reads: its settings' data sets, out-of-domain server sets and fine-tuning
    targets, and what those are built from."""
    names: set[str] = set()
    for setting in study["settings"].values():
        names.add(setting["dataset"])
        if ood := {**study.get("async", {}), **setting.get("async", {})}.get("ood_dataset"):
            names.add(ood)
        if "target" in setting:
            names.add(setting["target"]["dataset"])
    pending = list(names)
    while pending:
        for source in get_spec(pending.pop()).built_from:
            if source not in names:
                names.add(source)
                pending.append(source)
    return names


def raw_files(name: str) -> list[str]:
    """File names the download step writes into the raw directory (empty for embedded data sets)."""
    spec = get_spec(name)
    if spec.files:
        return list(spec.files)
    return list(vision.SOURCES[name].files) if spec.needs_download else []


def download_dataset(name: str, raw_dir: Path, mirror: str | None = None,
                     checksums: dict[str, str] | None = None, local_dirs: Iterable[Path | str] = ()) -> list[Path]:
    """Download the raw files of `name` into raw_dir (nothing for embedded data sets); return their paths.

    `local_dirs` are searched for the raw files before the network (data sets with `local_copies` only).
    """
    spec = get_spec(name)
    local_dirs = list(local_dirs)
    if local_dirs and not spec.local_copies:
        known = sorted(n for n, s in DATASETS.items() if s.local_copies)
        raise ValueError(f"local_data_dirs names {name!r}, whose download step does not look in local "
                         f"directories; those that do: {', '.join(known)}")
    if spec.download is None:
        return []
    if spec.local_copies:
        return spec.download(Path(raw_dir), mirror=mirror, checksums=checksums, local_dirs=local_dirs)
    return spec.download(Path(raw_dir), mirror=mirror, checksums=checksums)


def prepare_dataset(name: str, out: Path, raw_dir: Path | None = None) -> dict[str, Any]:
    """Build data set `name` (from raw_dir when it needs a download) and write it to `out`; return meta."""
    spec = get_spec(name)
    if spec.built_from:
        return save_prepared(out, *spec.prepare([Path(out).parent / f"{s}.npz" for s in spec.built_from]))
    if spec.needs_download and raw_dir is None:
        raise ValueError(f"data set {name!r} is prepared from downloaded files: pass raw_dir")
    return save_prepared(out, *spec.prepare(None if raw_dir is None else Path(raw_dir)))
