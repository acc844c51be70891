"""Every download has a pinned checksum, and every hand-placed file is re-hashed against the one its
instructions print.

The pins below are written out (not read from the modules) so that a changed value is a visible change:
NIST SD19's two zips and BSDS500's archive, whose publishers print no checksum, are pinned by the values public
loaders check them against; HAM10000's by Dataverse's md5, ImageNet's and CelebA's as torchvision pins them.
Downloads go to the throwaway HTTP server of tests/datasets/test_data.py on 127.0.0.1; the stand-in files are not the
real ones, so a pinned value refuses them.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest
from support.files import FileServer, md5

from fedrepro import pipeline
from fedrepro.config import validate
from fedrepro.data.download import ChecksumError, DownloadError, fetch
from fedrepro.data.registry import download_dataset, get_spec, raw_files
from fedrepro.study import ConfigError

DOWNLOADED = [("femnist", "by_class.zip", "79572b1694a8506f2b722c7be54130c4"),
              ("femnist", "by_write.zip", "a29f21babf83db0bb28a2f77b2b456cb"),
              ("mnist_m", "BSR_bsds500.tgz", "97e49d31764f3912f0c4122707d53062ac9e783ba0f095e447a4d53c1a41af8e")]
PLACED = [("ham10000", "HAM10000_images_part_1.zip", "4639bfa73ab251610530a97c898e6e46"),
          ("ham10000", "HAM10000_images_part_2.zip", "da43d6cc50f6613013be07e8986b384b"),
          ("ham10000", "HAM10000_metadata.csv", "8f85fb1aa29d80a2797247e434deb79d"),
          ("imagenet_subset", "ILSVRC2012_img_train.tar", "1d675b47d978889d74fa0da5fadfb00e"),
          ("celeba_smiling", "img_align_celeba.zip", "00d2c5bc6d35e252742224ab0c1e8fcb")]


def stand_ins(name: str) -> dict[str, bytes]:
    return {f: f"not the real {f}".encode() for f in raw_files(name)}


@pytest.mark.parametrize(("name", "fname", "pin"), DOWNLOADED)
def test_pinned_download_with_other_bytes_is_refused_by_name(tmp_path: Path, server: FileServer,  # noqa: F811
                                                             name: str, fname: str, pin: str) -> None:
    served = stand_ins(name)
    server.files.update(served)
    # every other file passes (its md5 overridden by name), so the refusal is this file's pin
    others = {f: md5(b) for f, b in served.items() if f != fname}
    raw = tmp_path / "raw"
    with pytest.raises(ChecksumError) as err:
        download_dataset(name, raw, mirror=server.url, checksums=others)
    msg = str(err.value)
    assert f"{fname} downloaded from {server.url}{fname} failed its checks" in msg and f"expected {pin}" in msg
    assert (raw / f"{fname}.corrupt").read_bytes() == served[fname] and not (raw / fname).exists()
    assert pin in get_spec(name).manual_instructions  # the value a user placing the file by hand is told


@pytest.mark.parametrize(("name", "fname", "pin"), PLACED)
def test_hand_placed_file_with_another_hash_is_refused_by_name(tmp_path: Path, name: str, fname: str,
                                                               pin: str) -> None:
    raw = tmp_path / "raw"
    raw.mkdir()
    placed = stand_ins(name)
    for f, data in placed.items():
        (raw / f).write_bytes(data)
    others = {f: md5(b) for f, b in placed.items() if f != fname}
    with pytest.raises(ChecksumError) as err:
        download_dataset(name, raw, checksums=others)
    msg = str(err.value)
    assert f"{raw / fname} refused: md5 mismatch: expected {pin}, actual {md5(placed[fname])}" in msg
    assert "Download it again from" in msg
    assert (raw / fname).read_bytes() == placed[fname] and not list(raw.glob("*.corrupt"))  # the user's copy stays
    assert pin in get_spec(name).manual_instructions
    assert [p.name for p in download_dataset(name, raw, checksums={**others, fname: md5(placed[fname])})] == list(
        placed)


def test_copy_placed_by_hand_that_fails_its_pin_is_named_when_the_network_cannot_replace_it(
        tmp_path: Path, server: FileServer) -> None:  # noqa: F811
    raw = tmp_path / "raw"
    raw.mkdir()
    (raw / "by_class.zip").write_bytes(b"a truncated copy")  # "without network access, download these files"
    with pytest.raises(DownloadError) as err:
        download_dataset("femnist", raw, mirror=server.url)  # the server has nothing: as good as offline
    msg = str(err.value)
    assert f"the by_class.zip already in {raw} failed its checks and was moved to by_class.zip.corrupt" in msg
    assert "with the checksum they print" in msg
    assert (raw / "by_class.zip.corrupt").read_bytes() == b"a truncated copy"


def test_unpinned_download_is_refused_unless_acknowledged(tmp_path: Path, server: FileServer) -> None:  # noqa: F811
    server.files["a.bin"] = b"x" * 100
    with pytest.raises(ChecksumError, match=r"a\.bin: no checksum is pinned for http://127\.0\.0\.1:\d+/a\.bin"):
        fetch(server.url + "a.bin", tmp_path / "a.bin", None)
    assert server.requests == [] and not list(tmp_path.iterdir())  # refused before any request
    # a caller that checks the file itself afterwards (the weights' sha256 prefix) acknowledges it
    assert fetch(server.url + "a.bin", tmp_path / "a.bin", None, unpinned_ok=True).read_bytes() == b"x" * 100


def test_sha256_pin_is_checked_as_an_md5_pin_is(tmp_path: Path, server: FileServer) -> None:  # noqa: F811
    good = b"the real archive" * 50
    server.files["good.tgz"] = good
    server.files["bad.tgz"] = b"another archive" * 50
    pin = hashlib.sha256(good).hexdigest()
    assert fetch(server.url + "good.tgz", tmp_path / "good.tgz", pin).read_bytes() == good
    with pytest.raises(ChecksumError, match=rf"bad\.tgz downloaded .* sha256 mismatch: expected {pin}"):
        fetch(server.url + "bad.tgz", tmp_path / "bad.tgz", pin)
    with pytest.raises(ValueError, match="neither an md5 .* nor a sha256"):
        fetch(server.url + "good.tgz", tmp_path / "other.tgz", pin[:40])
    assert server.requests == ["good.tgz", "bad.tgz"]


def test_config_checksums_replace_a_pin_and_the_step_logs_it(tmp_path: Path) -> None:
    raw = tmp_path / "raw"
    raw.mkdir()
    placed = stand_ins("ham10000")  # a lab's copy whose bytes differ from Dataverse's
    for f, data in placed.items():
        (raw / f).write_bytes(data)
    lines: list[str] = []
    with pytest.raises(ChecksumError, match="HAM10000_images_part_1.zip refused"):
        pipeline.download("ham10000", raw, None, lines.append)
    trusted = {f: md5(b) for f, b in placed.items()}
    pipeline.download("ham10000", raw, None, lines.append, checksums=trusted)  # the rule's step, config key given
    assert sorted(json.loads((raw / "MANIFEST.json").read_text())["files"]) == sorted(placed)
    csv_md5 = trusted["HAM10000_metadata.csv"]
    assert f"ham10000: HAM10000_metadata.csv is checked against the config's checksum {csv_md5}, not the pinned one" \
        in lines
    config = validate({"studies": {"s": "study.yaml"}, "checksums": {"ham10000": trusted}}, "config", "test")
    assert config["checksums"]["ham10000"] == trusted
    with pytest.raises(ConfigError, match=r"checksums\.ham10000\.HAM10000_metadata\.csv"):
        validate({"studies": {"s": "study.yaml"}, "checksums": {"ham10000": {"HAM10000_metadata.csv": "123"}}},
                 "config", "test")
