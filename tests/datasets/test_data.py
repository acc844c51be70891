"""Tests of fedrepro.data: the embedded data sets, the .npz format, checksummed downloads, the parsers.

Downloads go to a throwaway HTTP server on 127.0.0.1 that serves small files written in the real
formats (idx gz, CIFAR python tar.gz, SVHN .mat); no other network is used.
"""

from __future__ import annotations

import gzip
import io
import pickle
import tarfile
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from support.common import REPO
from support.files import (
    MAKERS,
    FileServer,
    idx_gz,
    make_cifar10,
    make_mnist,
    md5,
    pickle_bytes,
    tar_gz,
    torchvision_class_attrs,
)

from fedrepro.data import embedded, vision
from fedrepro.data.download import ChecksumError, DownloadError, fetch
from fedrepro.data.format import PreparedFormatError, load_prepared, save_prepared
from fedrepro.data.registry import DATASETS, download_dataset, prepare_dataset, raw_files
from fedrepro.io import atomic_write_npz

# ---------------------------------------------------------------- local HTTP server






# ---------------------------------------------------------------- small files in the real formats


# ---------------------------------------------------------------- embedded data sets


@pytest.fixture(scope="module")
def built() -> dict[str, tuple[Any, ...]]:
    return {"digits": embedded.digits(), "digits_m": embedded.digits_m()}


@pytest.mark.parametrize("name,channels", [("digits", 1), ("digits_m", 3)])
def test_embedded_shapes_and_split(built: dict[str, tuple[Any, ...]], name: str, channels: int) -> None:
    x_tr, y_tr, x_te, y_te, meta = built[name]
    assert x_tr.shape == (1347, 28, 28, channels) and x_te.shape == (450, 28, 28, channels)
    assert x_tr.dtype == x_te.dtype == np.uint8 and y_tr.dtype == y_te.dtype == np.int64
    assert meta["num_classes"] == 10 and meta["shape"] == [28, 28, channels] and meta["name"] == name
    assert x_tr.max() == 255 and x_tr.min() == 0
    all_y = np.concatenate([y_tr, y_te])
    for c in range(10):
        n_c = (all_y == c).sum()
        assert abs((y_te == c).sum() - 0.25 * n_c) <= 0.5 and (y_tr == c).sum() > 0  # stratified 75/25


def test_embedded_labels_shared_and_deterministic(built: dict[str, tuple[Any, ...]]) -> None:
    d, m = built["digits"], built["digits_m"]
    assert np.array_equal(d[1], m[1]) and np.array_equal(d[3], m[3])
    again = embedded.digits_m()
    for a, b in zip(m[:4], again[:4], strict=True):
        assert np.array_equal(a, b)
    assert np.array_equal(embedded.digits()[0], d[0])


def test_digits_are_scikit_learns_digits(built: dict[str, tuple[Any, ...]]) -> None:
    from sklearn.datasets import load_digits

    x, y = embedded.load_digits_28()
    tr, _ = embedded.split_indices(y)
    assert np.array_equal(x[tr], built["digits"][0])
    # Averaging the 28x28 image back over the 8x8 grid recovers the original 0..16 image closely.
    ref = load_digits().images * (255 / 16)
    e = np.linspace(0, 28, 9).round().astype(int)
    pooled = np.empty(ref.shape)
    for i in range(8):
        for j in range(8):
            pooled[:, i, j] = x[:, e[i]:e[i + 1], e[j]:e[j + 1], 0].mean(axis=(1, 2))
    assert np.corrcoef(pooled.ravel(), ref.ravel())[0, 1] > 0.95


def test_digits_m_is_mnistm_blend_of_the_digits(built: dict[str, tuple[Any, ...]]) -> None:
    x, _ = embedded.load_digits_28()
    textures = embedded.sample_textures()
    tr, _ = embedded.split_indices(embedded.load_digits_28()[1])
    blended, patches = embedded.blend_mnistm(x, textures)
    xm = built["digits_m"][0]
    assert np.array_equal(blended[tr], xm)
    # Output is |patch - digit| per channel, so background pixels equal the photo patch...
    digit = np.broadcast_to(x, patches.shape).astype(int)
    assert np.array_equal(blended.astype(int), np.abs(patches.astype(int) - digit))
    assert np.array_equal(blended[digit == 0], patches[digit == 0])
    # ...and bright stroke pixels differ from it.
    assert np.abs(blended.astype(int) - patches)[digit > 200].mean() > 60
    # Really coloured: the channels differ.
    assert np.abs(xm[..., 0].astype(int) - xm[..., 1]).mean() > 10
    # Each patch is a crop of one of the two photographs.
    for i in (0, 1, 2, 1000):
        found = False
        for photo in textures:
            cand = np.argwhere((photo[:-27, :-27] == patches[i, 0, 0]).all(axis=-1))
            found |= any(np.array_equal(photo[r:r + 28, c:c + 28], patches[i]) for r, c in cand)
        assert found, f"patch {i} is not a crop of a sample photo"


def test_fashion_mnist_m_blends_every_fashion_mnist_image_and_refuses_another_source(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    x_tr, x_te = (rng.integers(0, 256, (n, 28, 28, 1), dtype=np.uint8) for n in (40, 10))
    y_tr, y_te = np.arange(40) % 10, np.arange(10)
    meta = {"name": "fashion_mnist", "num_classes": 10, "classes": [f"c{i}" for i in range(10)],
            "shape": [28, 28, 1], "source": "test", "license": "test"}
    save_prepared(tmp_path / "fashion_mnist.npz", x_tr, y_tr, x_te, y_te, meta)
    prepare_dataset("fashion_mnist_m", tmp_path / "fashion_mnist_m.npz")  # built from the file beside it
    m = load_prepared(tmp_path / "fashion_mnist_m.npz")
    blended, patches = embedded.blend_mnistm(np.concatenate([x_tr, x_te]), embedded.sample_textures())
    assert np.array_equal(m.x_train, blended[:40]) and np.array_equal(m.x_test, blended[40:])
    assert np.array_equal(m.y_train, y_tr) and np.array_equal(m.y_test, y_te)
    assert m.meta["shape"] == [28, 28, 3] and m.meta["classes"] == meta["classes"]
    # |patch - image| per channel: the source image is recoverable where the patch is black, and colour is real
    source = np.broadcast_to(np.concatenate([x_tr, x_te]), patches.shape).astype(int)
    assert np.array_equal(blended.astype(int), np.abs(patches.astype(int) - source))
    assert np.abs(m.x_train[..., 0].astype(int) - m.x_train[..., 1]).mean() > 5

    save_prepared(tmp_path / "fashion_mnist.npz", *embedded.digits())  # another data set under that name
    with pytest.raises(ValueError, match=r"fashion_mnist\.npz holds 'digits'"):
        prepare_dataset("fashion_mnist_m", tmp_path / "fashion_mnist_m.npz")


# ---------------------------------------------------------------- prepared format


def test_save_load_round_trip_and_sha_mismatch(tmp_path: Path, built: dict[str, tuple[Any, ...]]) -> None:
    out = tmp_path / "digits.npz"
    meta = save_prepared(out, *built["digits"])
    assert len(meta["sha256"]) == 64 and not list(tmp_path.glob("*.tmp"))
    p = load_prepared(out)
    for a, b in zip((p.x_train, p.y_train, p.x_test, p.y_test), built["digits"][:4], strict=True):
        assert np.array_equal(a, b) and a.dtype == b.dtype
    assert p.meta == meta and p.num_classes == 10
    assert save_prepared(tmp_path / "again.npz", *built["digits"])["sha256"] == meta["sha256"]

    with np.load(out) as z:
        arrays = {k: z[k] for k in z.files}
    arrays["x_train"][0, 14, 14, 0] ^= 1
    # written as the pipeline writes (with a checksum of the tampered bytes): the arrays' digest still refuses it
    atomic_write_npz(out, checksum=True, **arrays)
    with pytest.raises(PreparedFormatError, match=r"digits\.npz.*sha256 mismatch"):
        load_prepared(out)
    del arrays["y_test"]
    atomic_write_npz(out, checksum=True, **arrays)
    with pytest.raises(PreparedFormatError, match=r"digits\.npz.*missing arrays \['y_test'\]"):
        load_prepared(out)


def test_save_rejects_inconsistent_arrays(tmp_path: Path, built: dict[str, tuple[Any, ...]]) -> None:
    x_tr, y_tr, x_te, y_te, meta = built["digits"]
    with pytest.raises(PreparedFormatError, match="outside 0..9"):
        save_prepared(tmp_path / "bad.npz", x_tr, y_tr + 1, x_te, y_te, meta)
    with pytest.raises(PreparedFormatError, match="must be uint8"):
        save_prepared(tmp_path / "bad.npz", x_tr.astype(np.float32), y_tr, x_te, y_te, meta)
    assert not list(tmp_path.iterdir())


def test_registry_prepares_embedded_and_rejects_unknown(tmp_path: Path) -> None:
    meta = prepare_dataset("digits", tmp_path / "d" / "digits.npz")
    assert load_prepared(tmp_path / "d" / "digits.npz").meta == meta
    with pytest.raises(ValueError, match="known: ag_news, celeba_smiling, cifar10, cifar100, cifar100_coarse, "
                                         "cinic10, digits, digits_m, domainnet"):
        prepare_dataset("imagenet", tmp_path / "x.npz")
    with pytest.raises(ValueError, match="pass raw_dir"):
        prepare_dataset("mnist", tmp_path / "x.npz")
    assert download_dataset("digits_m", tmp_path / "raw") == [] and raw_files("digits") == []
    assert raw_files("svhn") == ["train_32x32.mat", "test_32x32.mat"]


@pytest.mark.parametrize("name", ["digits", "digits_m", "photo_patches"])
def test_a_data_sets_declared_size_is_what_its_preparation_gives(tmp_path: Path, name: str) -> None:
    prepare_dataset(name, tmp_path / f"{name}.npz")
    p, size = load_prepared(tmp_path / f"{name}.npz"), DATASETS[name].size
    assert (len(p.y_train), p.x_train.shape[1:], p.num_classes) == (size.train, size.shape, size.classes)
    assert size.test in (None, len(p.y_test))


def test_every_data_set_a_shipped_config_trains_on_declares_its_size() -> None:
    from fedrepro.config import merge_configfiles, resolve_config

    for extra in ("paper.yaml", "laptop-full.yaml"):
        config = resolve_config(merge_configfiles(REPO / "config" / "config.yaml", REPO / "config" / extra))
        for study in config["studies"].values():
            for setting in study["settings"].values():
                assert DATASETS[setting["dataset"]].size is not None, (extra, setting["dataset"])


# ---------------------------------------------------------------- downloads and parsers


@pytest.mark.parametrize("name", ["mnist", "fashion_mnist", "cifar10", "cifar100", "svhn"])
def test_download_and_prepare_real_formats(tmp_path: Path, server: FileServer, name: str) -> None:
    files, expected = MAKERS.get(name, make_mnist)()
    server.files.update(files)
    raw = tmp_path / "raw"
    paths = download_dataset(name, raw, mirror=server.url, checksums={f: md5(b) for f, b in files.items()})
    assert sorted(p.name for p in paths) == sorted(files) == sorted(raw_files(name))
    meta = prepare_dataset(name, tmp_path / f"{name}.npz", raw)
    p = load_prepared(tmp_path / f"{name}.npz")
    for got, want in zip((p.x_train, p.y_train, p.x_test, p.y_test), expected, strict=True):
        assert np.array_equal(got, want)
    assert p.meta == meta and p.meta["name"] == name and len(p.meta["classes"]) == p.num_classes
    if name == "cifar100":
        assert np.array_equal(np.asarray(meta["fine_to_coarse"])[p.y_train], p.y_train // 5)
        assert meta["coarse_classes"][3] == "c3"
    # Files already present with the right md5 are not fetched again.
    n = len(server.requests)
    download_dataset(name, raw, mirror=server.url, checksums={f: md5(b) for f, b in files.items()})
    assert len(server.requests) == n


def test_corrupt_download_is_quarantined_then_refetched(tmp_path: Path, server: FileServer) -> None:
    good = b"the real bytes" * 100
    server.files["f.bin"] = b"tampered bytes" * 100
    dest, url = tmp_path / "f.bin", server.url + "f.bin"
    with pytest.raises(ChecksumError) as err:
        fetch(url, dest, md5(good))
    msg = str(err.value)
    assert all(s in msg for s in ("f.bin", url, md5(good), md5(server.files["f.bin"])))
    assert not dest.exists() and not (tmp_path / "f.bin.part").exists()
    assert (tmp_path / "f.bin.corrupt").read_bytes() == server.files["f.bin"]
    server.files["f.bin"] = good
    assert fetch(url, dest, md5(good)).read_bytes() == good


@pytest.mark.parametrize("how", ["connection closed early", "file truncated upstream"])
def test_truncated_archive_is_rejected(tmp_path: Path, server: FileServer, how: str) -> None:
    files, expected = make_cifar10()
    archive = files["cifar-10-python.tar.gz"]
    checksums = {"cifar-10-python.tar.gz": md5(archive)}
    if how == "connection closed early":
        server.files["cifar-10-python.tar.gz"] = archive
        server.cut_off.add("cifar-10-python.tar.gz")
    else:
        server.files["cifar-10-python.tar.gz"] = archive[: len(archive) // 2]
    raw = tmp_path / "raw"
    with pytest.raises(ChecksumError, match=r"cifar-10-python\.tar\.gz.*127\.0\.0\.1.*" + md5(archive)):
        download_dataset("cifar10", raw, mirror=server.url, checksums=checksums)
    assert (raw / "cifar-10-python.tar.gz.corrupt").exists() and not (raw / "cifar-10-python.tar.gz").exists()
    if how == "connection closed early":
        assert len(server.requests) == 3  # the first try and two retries
    server.cut_off.clear()
    server.files["cifar-10-python.tar.gz"] = archive
    download_dataset("cifar10", raw, mirror=server.url, checksums=checksums)
    assert np.array_equal(vision.prepare_cifar10(raw)[0], expected[0])


def test_stale_local_file_is_replaced(tmp_path: Path, server: FileServer) -> None:
    server.files["f.bin"] = b"new"
    (tmp_path / "f.bin").write_bytes(b"old")
    fetch(server.url + "f.bin", tmp_path / "f.bin", md5(b"new"))
    assert (tmp_path / "f.bin").read_bytes() == b"new"
    assert (tmp_path / "f.bin.corrupt").read_bytes() == b"old"


def test_http_error_names_url(tmp_path: Path, server: FileServer) -> None:
    with pytest.raises(DownloadError, match=r"HTTP 404 .*127\.0\.0\.1:\d+/nothing\.gz"):
        fetch(server.url + "nothing.gz", tmp_path / "nothing.gz", "0" * 32)
    assert server.requests == ["nothing.gz"]  # a 4xx is not retried
    assert not list(tmp_path.iterdir())


def test_unpickler_reads_old_numpy_pickles_and_refuses_code() -> None:
    rows = np.arange(3072 * 2, dtype=np.uint8).reshape(2, 3072)
    new = pickle_bytes({"data": rows, "labels": [1, 2]})
    # The real CIFAR pickles were written by numpy 1.x, whose arrays name numpy.core.multiarray.
    old = new.replace(b"numpy._core.multiarray", b"numpy.core.multiarray")
    assert b"numpy.core.multiarray" in old
    archive = io.BytesIO(tar_gz({"old": old, "evil": pickle_bytes(print)}))
    with tarfile.open(fileobj=archive, mode="r:gz") as tar:
        assert np.array_equal(vision._unpickle(tar, "old")["data"], rows)
        with pytest.raises(pickle.UnpicklingError, match=r"refusing to unpickle .*\.print"):
            vision._unpickle(tar, "evil")


def test_idx_header_mismatch_is_an_error(tmp_path: Path) -> None:
    data = idx_gz(np.zeros((3, 2, 2), dtype=np.uint8))
    (tmp_path / "bad.gz").write_bytes(gzip.compress(gzip.decompress(data)[:-1]))
    with pytest.raises(ValueError, match=r"bad\.gz: header says \[3, 2, 2\]"):
        vision.read_idx(tmp_path / "bad.gz")


# ---------------------------------------------------------------- official tables agree with torchvision


def test_official_tables_match_torchvision() -> None:
    mnist, cifar, svhn = (torchvision_class_attrs(m) for m in ("mnist", "cifar", "svhn"))
    for ours, theirs in (("mnist", mnist["MNIST"]), ("fashion_mnist", mnist["FashionMNIST"])):
        assert vision.SOURCES[ours].files == dict(theirs["resources"])
        assert list(vision.SOURCES[ours].mirrors) == theirs["mirrors"]
    for ours, theirs in (("cifar10", cifar["CIFAR10"]), ("cifar100", cifar["CIFAR100"])):
        assert vision.SOURCES[ours].files == {theirs["filename"]: theirs["tgz_md5"]}
        assert vision.SOURCES[ours].mirrors[0] + theirs["filename"] == theirs["url"]
    splits = {k: v for k, v in svhn["SVHN"]["split_list"].items() if k != "extra"}
    assert vision.SOURCES["svhn"].files == {fname: m for _, fname, m in splits.values()}
    assert all(vision.SOURCES["svhn"].mirrors[0] + fname == url for url, fname, _ in splits.values())
    assert set(DATASETS) >= set(vision.SOURCES)
