"""Content checks that accept a recompressed copy, and local directories searched before the network.

A Debian dataset package (dataset-fashion-mnist) ships the publisher's idx files gzipped anew: other .gz
bytes, so another md5, same content. The download step accepts a file whose md5 or decompressed sha256
matches, from a local directory (config key local_data_dirs) or a server, and refuses a truncated or
altered one with a message naming the file and the check that failed. Servers run on 127.0.0.1 only.
"""

from __future__ import annotations

import gzip
import hashlib
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from fedrepro.config import validate
from fedrepro.data import download, vision
from fedrepro.data.download import ChecksumError, DownloadError, content_problem, fetch, payload_sha256
from fedrepro.data.registry import _manual, download_dataset, prepare_dataset
from fedrepro.pipeline import download as download_step

DEBIAN_DIR = Path("/usr/share/datasets/fashion-mnist")
FMNIST = vision.SOURCES["fashion_mnist"]


@pytest.fixture(autouse=True)
def _no_retry_wait(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(download, "RETRY_WAIT_S", 0.0)


@pytest.fixture
def served() -> Iterator[tuple[str, dict[str, bytes], list[str]]]:
    """A server on 127.0.0.1: its base URL, the files it serves (name -> bytes) and the names asked for."""
    files: dict[str, bytes] = {}
    asked: list[str] = []

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 (the name http.server dispatches to)
            name = self.path.lstrip("/")
            asked.append(name)
            if name not in files:
                self.send_error(404)
                return
            self.send_response(200)
            self.send_header("Content-Length", str(len(files[name])))
            self.end_headers()
            self.wfile.write(files[name])

        def log_message(self, *args: Any) -> None:
            pass

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=httpd.serve_forever, args=(0.02,), daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}/", files, asked
    finally:
        httpd.shutdown()
        httpd.server_close()
        thread.join()


def md5(data: bytes) -> str:
    return hashlib.md5(data).hexdigest()


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def idx(arr: np.ndarray) -> bytes:
    return bytes([0, 0, 0x08, arr.ndim]) + b"".join(int(d).to_bytes(4, "big") for d in arr.shape) + arr.tobytes()


def small_fashion_mnist() -> tuple[dict[str, bytes], tuple[np.ndarray, ...]]:
    """The four idx payloads of a tiny Fashion-MNIST, and the arrays they hold."""
    rng = np.random.default_rng(15)
    x_tr, x_te = (rng.integers(0, 256, (n, 28, 28), dtype=np.uint8) for n in (12, 4))
    y_tr, y_te = (rng.integers(0, 10, n).astype(np.uint8) for n in (12, 4))
    payloads = dict(zip(vision.IDX_FILES, map(idx, (x_tr, y_tr, x_te, y_te)), strict=True))
    return payloads, (x_tr[..., None], y_tr, x_te[..., None], y_te)


def publisher_gz(payload: bytes) -> bytes:
    return gzip.compress(payload, compresslevel=9, mtime=0)


def repackaged_gz(payload: bytes) -> bytes:
    """The same payload gzipped as a repackager might: another level and timestamp, so other bytes."""
    return gzip.compress(payload, compresslevel=1, mtime=1591315200)


@pytest.fixture
def synthetic_source(monkeypatch: pytest.MonkeyPatch) -> tuple[dict[str, bytes], tuple[np.ndarray, ...]]:
    """Fashion-MNIST's table pointed at a tiny synthetic copy: md5 of the publisher's .gz, payload sha256."""
    payloads, arrays = small_fashion_mnist()
    source = vision.Source(FMNIST.mirrors, {f: md5(publisher_gz(p)) for f, p in payloads.items()},
                           FMNIST.license, {f: sha256(p) for f, p in payloads.items()}, FMNIST.debian_package)
    monkeypatch.setitem(vision.SOURCES, "fashion_mnist", source)
    return payloads, arrays


# ---------------------------------------------------------------- the content check itself


def test_content_check_accepts_either_checksum_and_names_what_failed(tmp_path: Path) -> None:
    payload = idx(np.arange(64, dtype=np.uint8).reshape(4, 4, 4))
    official, repacked = publisher_gz(payload), repackaged_gz(payload)
    assert official != repacked
    for name, data in (("official.gz", official), ("repacked.gz", repacked)):
        (tmp_path / name).write_bytes(data)
    assert content_problem(tmp_path / "official.gz", md5(official), sha256(payload)) is None
    assert content_problem(tmp_path / "repacked.gz", md5(official), sha256(payload)) is None
    assert payload_sha256(tmp_path / "repacked.gz") == sha256(payload)
    # without the payload sha256 (the old check), the repackaged copy is refused by its md5 alone
    assert content_problem(tmp_path / "repacked.gz", md5(official)) == (
        f"md5 mismatch: expected {md5(official)}, actual {md5(repacked)}")

    (tmp_path / "cut.gz").write_bytes(repacked[: len(repacked) // 2])
    problem = content_problem(tmp_path / "cut.gz", md5(official), sha256(payload))
    assert problem is not None and "md5 mismatch" in problem
    assert "decompressed sha256 not computable: damaged or truncated gzip stream" in problem

    altered = bytearray(payload)
    altered[-1] ^= 0xFF
    (tmp_path / "altered.gz").write_bytes(repackaged_gz(bytes(altered)))
    problem = content_problem(tmp_path / "altered.gz", md5(official), sha256(payload))
    assert problem == (f"md5 mismatch: expected {md5(official)}, actual {md5(repackaged_gz(bytes(altered)))}; "
                       f"decompressed sha256 mismatch: expected {sha256(payload)}, actual {sha256(bytes(altered))}")


# ---------------------------------------------------------------- served from 127.0.0.1


def test_recompressed_download_is_accepted_and_kept(tmp_path: Path, served: tuple[str, dict[str, bytes],
                                                                                   list[str]]) -> None:
    url, files, asked = served
    payload = idx(np.arange(50, dtype=np.uint8).reshape(2, 5, 5))
    files["a.gz"] = repackaged_gz(payload)
    dest = tmp_path / "a.gz"
    assert fetch(url + "a.gz", dest, md5(publisher_gz(payload)), payload_sha=sha256(payload)) == dest
    assert dest.read_bytes() == files["a.gz"] and not (tmp_path / "a.gz.corrupt").exists()
    # a second call keeps it (the old check quarantined it as stale and downloaded it again)
    fetch(url + "a.gz", dest, md5(publisher_gz(payload)), payload_sha=sha256(payload))
    assert asked == ["a.gz"] and not (tmp_path / "a.gz.corrupt").exists()


@pytest.mark.parametrize("damage", ["truncated", "altered"])
def test_damaged_download_is_refused_naming_file_and_check(tmp_path: Path, served: tuple[str, dict[str, bytes],
                                                                                          list[str]],
                                                           damage: str) -> None:
    url, files, _ = served
    payload = idx(np.arange(200, dtype=np.uint8).reshape(8, 5, 5))
    if damage == "truncated":  # the server says it is whole: only the content check can tell
        files["a.gz"] = repackaged_gz(payload)[:-20]
        check = "decompressed sha256 not computable: damaged or truncated gzip stream"
    else:
        files["a.gz"] = repackaged_gz(payload.replace(b"\x07", b"\x08"))
        check = f"decompressed sha256 mismatch: expected {sha256(payload)}"
    with pytest.raises(ChecksumError) as err:
        fetch(url + "a.gz", tmp_path / "a.gz", md5(publisher_gz(payload)), payload_sha=sha256(payload))
    msg = str(err.value)
    assert f"a.gz downloaded from {url}a.gz failed its checks: md5 mismatch" in msg and check in msg
    assert (tmp_path / "a.gz.corrupt").read_bytes() == files["a.gz"] and not (tmp_path / "a.gz").exists()


# ---------------------------------------------------------------- local directories before the network


def test_local_recompressed_copy_is_used_before_the_network(
        tmp_path: Path, served: tuple[str, dict[str, bytes], list[str]],
        synthetic_source: tuple[dict[str, bytes], tuple[np.ndarray, ...]]) -> None:
    url, _, asked = served
    payloads, arrays = synthetic_source
    local = tmp_path / "debian"
    local.mkdir()
    for fname, payload in payloads.items():
        (local / fname).write_bytes(repackaged_gz(payload))
    raw = tmp_path / "raw"
    paths = download_dataset("fashion_mnist", raw, mirror=url, local_dirs=[tmp_path / "absent", local])
    assert [p.name for p in paths] == list(payloads) and asked == []
    assert all((raw / f).read_bytes() == (local / f).read_bytes() for f in payloads)
    assert not list(raw.glob("*.corrupt")) and not list(raw.glob("*.part"))
    prepare_dataset("fashion_mnist", tmp_path / "fm.npz", raw)
    with np.load(tmp_path / "fm.npz") as f:
        for key, want in zip(("x_train", "y_train", "x_test", "y_test"), arrays, strict=True):
            assert np.array_equal(f[key], want)
    # a second run keeps the copies: nothing asked, nothing quarantined
    download_dataset("fashion_mnist", raw, mirror=url, local_dirs=[local])
    assert asked == [] and not list(raw.glob("*.corrupt"))


@pytest.mark.parametrize("damage", ["truncated", "altered"])
def test_damaged_local_copy_is_refused_and_left_alone(
        tmp_path: Path, served: tuple[str, dict[str, bytes], list[str]],
        synthetic_source: tuple[dict[str, bytes], tuple[np.ndarray, ...]], damage: str) -> None:
    url, files, asked = served
    payloads, _ = synthetic_source
    local = tmp_path / "debian"
    local.mkdir()
    for fname, payload in payloads.items():
        files[fname] = publisher_gz(payload)
        (local / fname).write_bytes(repackaged_gz(payload))
    first = vision.IDX_FILES[0]
    bad = repackaged_gz(payloads[first])
    bad = bad[: len(bad) // 2] if damage == "truncated" else repackaged_gz(payloads[first][:-1] + b"\x01")
    (local / first).write_bytes(bad)
    raw = tmp_path / "raw"
    with pytest.raises(ChecksumError) as err:
        download_dataset("fashion_mnist", raw, mirror=url, local_dirs=[local])
    msg = str(err.value)
    assert f"local copy {local / first} refused: md5 mismatch" in msg
    assert ("damaged or truncated gzip stream" if damage == "truncated" else "decompressed sha256 mismatch") in msg
    assert "local_data_dirs" in msg
    # loud, like a bad download: the network is not asked instead, and the package's file stays put
    assert asked == [] and (local / first).read_bytes() == bad
    assert not (raw / first).exists() and not list(raw.glob("*.part"))


def test_no_local_copy_and_no_mirror_names_both(
        tmp_path: Path, served: tuple[str, dict[str, bytes], list[str]],
        synthetic_source: tuple[dict[str, bytes], tuple[np.ndarray, ...]]) -> None:
    url, _, asked = served
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(DownloadError) as err:
        download_dataset("fashion_mnist", tmp_path / "raw", mirror=url, local_dirs=[empty])
    msg = str(err.value)
    assert "fashion_mnist: no mirror served train-images-idx3-ubyte.gz" in msg
    assert f"not in any local directory either ({empty}; config key local_data_dirs)" in msg
    assert "apt-get install dataset-fashion-mnist" in msg
    assert asked == ["train-images-idx3-ubyte.gz"]


def test_local_dirs_refused_for_a_data_set_whose_download_ignores_them(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"local_data_dirs names 'cinic10'.*fashion_mnist"):
        download_dataset("cinic10", tmp_path, local_dirs=[tmp_path])


def test_default_config_looks_in_the_debian_directory() -> None:
    config = validate({"studies": {"s": "study.yaml"}}, "config", "test")
    assert config["local_data_dirs"] == {"fashion_mnist": [str(DEBIAN_DIR)]}
    assert "dataset-fashion-mnist" in _manual("fashion_mnist")


def test_download_step_copies_from_local_dirs_and_writes_manifest(
        tmp_path: Path, synthetic_source: tuple[dict[str, bytes], tuple[np.ndarray, ...]]) -> None:
    payloads, _ = synthetic_source
    local = tmp_path / "debian"
    local.mkdir()
    for fname, payload in payloads.items():
        (local / fname).write_bytes(repackaged_gz(payload))
    lines: list[str] = []
    # an unreachable mirror: the step must not need it
    download_step("fashion_mnist", tmp_path / "raw", "http://127.0.0.1:9/", lines.append, local_dirs=[str(local)])
    assert (tmp_path / "raw" / "MANIFEST.json").exists()
    assert any(str(local) in line for line in lines)


# ---------------------------------------------------------------- the Debian package, where installed


@pytest.mark.skipif(not all((DEBIAN_DIR / f).is_file() for f in FMNIST.files),
                    reason=f"Debian's dataset-fashion-mnist is not installed ({DEBIAN_DIR}); `make` installs it "
                           "as root")
def test_debian_fashion_mnist_passes_by_content(tmp_path: Path) -> None:
    for fname, official_md5 in FMNIST.files.items():
        path = DEBIAN_DIR / fname
        # the decompressed sha256 alone passes it (Debian's gzip bytes differ from the publisher's)
        assert content_problem(path, None, FMNIST.payload_sha256[fname]) is None
        assert content_problem(path, official_md5, FMNIST.payload_sha256[fname]) is None
    raw = tmp_path / "raw"
    # no mirror can be reached at this address: every file must come from the package's directory
    download_dataset("fashion_mnist", raw, mirror="http://127.0.0.1:9/", local_dirs=[DEBIAN_DIR])
    labels = vision.read_idx(raw / "train-labels-idx1-ubyte.gz")
    assert labels.shape == (60000,) and np.bincount(labels).tolist() == [6000] * 10
    assert vision.read_idx(raw / "t10k-images-idx3-ubyte.gz").shape == (10000, 28, 28)
