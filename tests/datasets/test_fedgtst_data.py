"""FedGTST's data sets: MNIST-M built from MNIST and BSDS500, DomainNet's domains and leave-one-out sources,
and the partition that gives each source domain its own client.

Downloads go to the throwaway HTTP server of tests/datasets/test_data.py on 127.0.0.1, which serves small files in
the real formats (idx gz, BSR_bsds500.tgz with JPEGs, DomainNet zips and split lists)."""

from __future__ import annotations

import hashlib
import io
import json
import tarfile
import zipfile
from pathlib import Path

import numpy as np
import pytest
from PIL import Image
from support.files import FileServer, make_mnist, md5

from fedrepro import pipeline
from fedrepro.data import domainnet, mnist_m, vision
from fedrepro.data.download import ChecksumError, fetch
from fedrepro.data.format import load_prepared, save_prepared
from fedrepro.data.registry import DATASETS, download_dataset, get_spec, prepare_dataset, raw_files
from fedrepro.partition import make_partition

RNG = np.random.default_rng(7)


def jpeg(x: np.ndarray) -> bytes:
    buf = io.BytesIO()
    Image.fromarray(x).save(buf, format="JPEG", quality=95)
    return buf.getvalue()


def bsds_tgz() -> bytes:
    """A small BSR_bsds500.tgz: 3 train photographs (smooth gradients) plus members the recipe must skip."""
    members = {}
    for i in range(3):
        h, w = 31 + i, 35 + 2 * i
        yy, xx = np.mgrid[0:h, 0:w]
        img = np.stack([(yy * 7 + 40 * i) % 256, (xx * 5 + 20) % 256, (yy + xx) * 3 % 256], -1).astype(np.uint8)
        members[f"BSR/BSDS500/data/images/train/{100 + i}.jpg"] = jpeg(img)
    members["BSR/BSDS500/data/images/test/900.jpg"] = jpeg(np.zeros((40, 40, 3), np.uint8))
    members["BSR/BSDS500/data/images/train/Thumbs.db"] = b"not an image"
    members["BSR/BSDS500/data/groundTruth/train/100.mat"] = b"\0" * 10
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        for name, data in reversed(list(members.items())):  # archive order must not matter
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


# ---------------------------------------------------------------- MNIST-M


def test_mnist_m_download_and_prepare_follow_the_recipe(tmp_path: Path, server: FileServer) -> None:  # noqa: F811
    files, (x_tr, y_tr, x_te, y_te) = make_mnist()
    files[mnist_m.BSDS_FILE] = bsds_tgz()
    server.files.update(files)
    raw = tmp_path / "raw"
    checks = {f: md5(b) for f, b in files.items()}  # the small stand-ins pass as the official files
    paths = download_dataset("mnist_m", raw, mirror=server.url, checksums=checks)
    assert [p.name for p in paths] == raw_files("mnist_m") == list(mnist_m.FILES)
    prepare_dataset("mnist_m", tmp_path / "mnist_m.npz", raw)
    p = load_prepared(tmp_path / "mnist_m.npz")
    assert p.x_train.shape == (30, 28, 28, 3) and p.x_test.shape == (10, 28, 28, 3)
    assert np.array_equal(p.y_train, y_tr) and np.array_equal(p.y_test, y_te)
    assert p.meta["backgrounds"] == 3 and p.meta["shape"] == [28, 28, 3]
    backgrounds = mnist_m.load_backgrounds(raw / mnist_m.BSDS_FILE)
    assert [b.shape[:2] for b in backgrounds] == [(31, 35), (32, 37), (33, 39)]  # train only, in name order
    # every image is |patch - binarised digit| for a 28x28 patch of one of the train photographs
    for x, digit in zip(np.concatenate([p.x_train, p.x_test]), np.concatenate([x_tr, x_te])[..., 0], strict=True):
        ink = np.where(digit > 0, 255, 0)[..., None]
        patch = np.where(ink == 255, 255 - x.astype(int), x.astype(int))  # undo the difference blend
        found = any(np.array_equal(bg[t : t + 28, c : c + 28], patch)
                    for bg in backgrounds for t in range(bg.shape[0] - 28) for c in range(bg.shape[1] - 28))
        assert found
    again = mnist_m.prepare_mnist_m(raw)  # a fixed seed: the data set is the same every time
    assert np.array_equal(again[0], p.x_train)


def test_mnist_m_download_step_checks_the_archive_by_sha256(tmp_path: Path, server: FileServer,  # noqa: F811
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    files, _ = make_mnist()
    files[mnist_m.BSDS_FILE] = tgz = bsds_tgz()
    server.files.update(files)
    for fname, data in files.items():  # the small stand-ins pass as the official files
        if fname != mnist_m.BSDS_FILE:
            monkeypatch.setitem(vision.SOURCES["mnist"].files, fname, md5(data))
    monkeypatch.setattr(mnist_m, "BSDS_SHA256", hashlib.sha256(tgz).hexdigest())
    raw = tmp_path / "raw"
    pipeline.download("mnist_m", raw, server.url, log=lambda m: None)  # the rule's step
    record = json.loads((raw / "MANIFEST.json").read_text())
    assert record["dataset"] == "mnist_m" and sorted(record["files"]) == sorted(files)
    assert record["files"][mnist_m.BSDS_FILE] == {"md5": md5(tgz), "bytes": len(tgz)}


def test_acknowledged_unpinned_fetch_checks_length_and_keeps_a_copy(tmp_path: Path,
                                                                    server: FileServer) -> None:  # noqa: F811
    server.files["a.bin"] = b"x" * 100
    dest = fetch(server.url + "a.bin", tmp_path / "a.bin", None, unpinned_ok=True)
    assert dest.read_bytes() == b"x" * 100
    server.files["a.bin"] = b"y" * 100
    assert fetch(server.url + "a.bin", dest, None, unpinned_ok=True).read_bytes() == b"x" * 100  # kept
    server.cut_off.add("b.bin")
    server.files["b.bin"] = b"z" * 100
    with pytest.raises(ChecksumError, match="truncated"):
        fetch(server.url + "b.bin", tmp_path / "b.bin", None, unpinned_ok=True)


def test_mnist_m_official_sources() -> None:
    assert mnist_m.BSDS_URLS[0] == ("http://www.eecs.berkeley.edu/Research/Projects/CS/vision/grouping/BSR/"
                                    "BSR_bsds500.tgz")
    assert get_spec("mnist_m").needs_download and "BSR_bsds500.tgz" in get_spec("mnist_m").manual_instructions


# ---------------------------------------------------------------- DomainNet


def domain_files(domain: str, classes=("apple", "bus", "zebra"), per_split=(4, 2)) -> tuple[dict, dict]:
    """A DomainNet-like zip (class folders, images of various sizes, some unlisted) and split lists."""
    truth: dict[str, list] = {"train": [], "test": []}
    zbuf = io.BytesIO()
    lines = {"train": [], "test": []}
    with zipfile.ZipFile(zbuf, "w") as zf:
        for label, cls in enumerate(classes):
            for k in range(sum(per_split) + 1):  # one extra image in no split list
                h, w = 20 + 3 * k, 24 + 5 * label
                img = np.full((h, w, 3), (30 + 60 * label, 20 * k, 200 - 10 * k), dtype=np.uint8)
                member = f"{domain}/{cls}/{domain}_{label:03d}_{k:06d}.jpg"
                zf.writestr(member, jpeg(img))
                split = "train" if k < per_split[0] else "test" if k < sum(per_split) else None
                if split:
                    lines[split].append(f"{member} {label}")
                    truth[split].append((member, label, img[0, 0]))
    files = {f"{domain}.zip": zbuf.getvalue()}
    for split in ("train", "test"):
        order = RNG.permutation(len(lines[split]))
        files[f"{domain}_{split}.txt"] = "".join(lines[split][i] + "\n" for i in order).encode()
        truth[split] = [truth[split][i] for i in order]
    return files, truth


def test_domainnet_domain_download_and_prepare(tmp_path: Path, server: FileServer) -> None:  # noqa: F811
    files, truth = domain_files("clipart")
    server.files.update(files)
    raw = tmp_path / "raw"
    paths = download_dataset("domainnet_clipart", raw, mirror=server.url,
                             checksums={f: md5(b) for f, b in files.items()})
    assert [p.name for p in paths] == raw_files("domainnet_clipart") == list(files)
    meta = prepare_dataset("domainnet_clipart", tmp_path / "c.npz", raw)
    p = load_prepared(tmp_path / "c.npz")
    assert meta["classes"] == ["apple", "bus", "zebra"] and meta["domain"] == "clipart"
    assert p.x_train.shape == (12, domainnet.SIDE, domainnet.SIDE, 3) and p.x_test.shape[0] == 6
    for split, x, y in (("train", p.x_train, p.y_train), ("test", p.x_test, p.y_test)):
        assert y.tolist() == [label for _, label, _ in truth[split]]  # the split list's order and labels
        for img, (_, _, colour) in zip(x, truth[split], strict=True):  # flat colours survive the resize
            assert np.abs(img.astype(int) - colour.astype(int)).max() <= 3
    assert sorted(q.name for q in raw.iterdir()) == sorted(files)  # read in place, nothing extracted


def test_domainnet_split_lists_are_checked(tmp_path: Path) -> None:
    files, _ = domain_files("sketch")
    for name, data in files.items():
        (tmp_path / name).write_bytes(data)
    good = files["sketch_train.txt"].decode()
    first = good.splitlines()[0]
    member, label = first.split()
    (tmp_path / "sketch_train.txt").write_text(good.replace(first, f"{member} {(int(label) + 1) % 3}"))
    with pytest.raises(ValueError, match="does not match the zip's class folders"):
        domainnet.prepare_domain("sketch", tmp_path, side=8)
    (tmp_path / "sketch_train.txt").write_text(good + "sketch/bus/missing.jpg 1\n")
    with pytest.raises(ValueError, match="lacks"):
        domainnet.prepare_domain("sketch", tmp_path, side=8)
    (tmp_path / "sketch_train.txt").write_text(good + "garbage\n")
    with pytest.raises(ValueError, match="expected '<path> <label>'"):
        domainnet.prepare_domain("sketch", tmp_path, side=8)


def test_domainnet_corrupt_download_is_quarantined(tmp_path: Path, server: FileServer) -> None:  # noqa: F811
    files, _ = domain_files("real")
    server.files.update(files)
    server.files["real.zip"] = files["real.zip"][:-5] + b"XXXXX"
    with pytest.raises(ChecksumError, match="real.zip"):
        download_dataset("domainnet_real", tmp_path, mirror=server.url,
                         checksums={f: md5(b) for f, b in files.items()})
    assert (tmp_path / "real.zip.corrupt").exists()


def test_domainnet_official_sources() -> None:
    assert len(domainnet.MD5) == 18
    for d in domainnet.DOMAINS:
        assert set(domainnet.files(d)) <= set(domainnet.MD5)
        assert get_spec(f"domainnet_{d}").files == tuple(domainnet.files(d))
        assert get_spec(f"domainnet_no_{d}").built_from == tuple(f"domainnet_{s}" for s in domainnet.DOMAINS
                                                                 if s != d)
    assert domainnet.files("clipart")["clipart.zip"] == \
        "http://csr.bu.edu/ftp/visda/2019/multi-source/groundtruth/clipart.zip"
    assert domainnet.files("real")["real_test.txt"] == \
        "http://csr.bu.edu/ftp/visda/2019/multi-source/domainnet/txt/real_test.txt"


def write_fake_domains(data_dir: Path, classes: int = 4) -> dict[str, tuple[np.ndarray, ...]]:
    """Prepared per-domain files with distinct sizes and pixel values (domain index in every pixel)."""
    out = {}
    for i, d in enumerate(domainnet.DOMAINS):
        n_tr, n_te = 5 + i, 2 + i % 2
        x_tr = np.full((n_tr, 8, 8, 3), i, np.uint8)
        x_te = np.full((n_te, 8, 8, 3), 100 + i, np.uint8)
        y_tr, y_te = np.arange(n_tr) % classes, np.arange(n_te) % classes
        meta = {"name": f"domainnet_{d}", "num_classes": classes, "classes": [f"c{k}" for k in range(classes)],
                "shape": [8, 8, 3], "source": "test", "domain": d}
        save_prepared(data_dir / f"domainnet_{d}.npz", x_tr, y_tr, x_te, y_te, meta)
        out[d] = (x_tr, y_tr, x_te, y_te)
    return out


def test_domainnet_leave_one_out_and_one_client_per_domain(tmp_path: Path) -> None:
    domains = write_fake_domains(tmp_path)
    meta = prepare_dataset("domainnet_no_painting", tmp_path / "domainnet_no_painting.npz")
    p = load_prepared(tmp_path / "domainnet_no_painting.npz")
    sources = ["clipart", "infograph", "quickdraw", "real", "sketch"]
    assert meta["domains"] == sources and meta["left_out"] == "painting"
    assert meta["domain_sizes_train"] == [len(domains[d][1]) for d in sources]
    assert np.array_equal(p.x_train, np.concatenate([domains[d][0] for d in sources]))
    assert np.array_equal(p.y_test, np.concatenate([domains[d][3] for d in sources]))
    parts = make_partition(p.y_train, {"kind": "domain", "clients": 5}, seed=0, meta=p.meta)
    for k, d in enumerate(sources):  # client k holds exactly domain k's training images
        assert set(np.unique(p.x_train[parts[k]])) == {domainnet.DOMAINS.index(d)}
        assert len(parts[k]) == len(domains[d][1])
    with pytest.raises(ValueError, match="must equal the number of domains"):
        make_partition(p.y_train, {"kind": "domain", "clients": 4}, seed=0, meta=p.meta)
    with pytest.raises(ValueError, match="multi-domain data set"):
        make_partition(p.y_train, {"kind": "domain", "clients": 5}, seed=0, meta={"name": "x"})


def test_every_fedgtst_data_set_is_registered() -> None:
    for name in ("mnist", "mnist_m", "cifar10", "svhn", *(f"domainnet_{d}" for d in domainnet.DOMAINS),
                 *(f"domainnet_no_{d}" for d in domainnet.DOMAINS)):
        assert name in DATASETS
