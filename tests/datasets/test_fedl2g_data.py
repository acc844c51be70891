"""FedL2G's Flowers102 and Tiny-ImageNet: checksummed download and preparation.

Downloads go to the throwaway HTTP server of tests/datasets/test_data.py on 127.0.0.1, which serves small files in
the real formats: a gzipped tar of JPEGs under jpg/ with imagelabels.mat and setid.mat written by
scipy.io.savemat (Flowers102), and a zip with Tiny-ImageNet's layout (wnids.txt, words.txt,
train/<wnid>/images/, val/images/ + val_annotations.txt, an unlabelled test/). Every image is one flat
colour that encodes its class (three base-5 digits, one per channel), so the label of each prepared image
can be read back from its pixels.
"""

from __future__ import annotations

import io
import json
import zipfile
from pathlib import Path

import numpy as np
import pytest
import scipy.io
from PIL import Image
from support.files import FileServer, md5, tar_gz, torchvision_class_attrs

from fedrepro import pipeline
from fedrepro.data import fedl2g_sets
from fedrepro.data.download import ChecksumError, DownloadError
from fedrepro.data.format import load_prepared
from fedrepro.data.registry import DATASETS, download_dataset, get_spec, prepare_dataset, raw_files

LEVEL = 60  # base-5 digit d is channel value d * LEVEL: JPEG and resizing move flat colours far less


def colour(label: int) -> tuple[int, int, int]:
    """The RGB colour of class `label` (0..124): its three base-5 digits."""
    return (label % 5 * LEVEL, label // 5 % 5 * LEVEL, label // 25 % 5 * LEVEL)


def label_of(img: np.ndarray) -> int:
    """Read a class back from an image's mean colour."""
    d = np.rint(img.reshape(-1, 3).mean(0) / LEVEL).astype(int)
    return int(d[0] + 5 * d[1] + 25 * d[2])


def jpeg(label: int, h: int, w: int, mode: str = "RGB") -> bytes:
    img = Image.fromarray(np.full((h, w, 3), colour(label), np.uint8))
    buf = io.BytesIO()
    img.convert(mode).save(buf, format="JPEG", quality=95)
    return buf.getvalue()


def mat(**variables: np.ndarray) -> bytes:
    buf = io.BytesIO()
    scipy.io.savemat(buf, variables)
    return buf.getvalue()


# ---------------------------------------------------------------- Flowers102

# official labels (1..102) of images 1..12, and the official split (ids out of order, as setid.mat has them)
FLOWER_LABELS = np.array([77, 1, 102, 77, 40, 13, 1, 102, 56, 40, 13, 77])
TRNID, VALID, TSTID = [5, 1, 9], [12, 3, 7], [2, 11, 4, 8, 10, 6]


def flowers_files(labels: np.ndarray = FLOWER_LABELS, setid: dict | None = None,
                  skip: tuple[int, ...] = ()) -> dict[str, bytes]:
    """The three Flowers102 files: images of various sizes (reversed archive order, a non-image member)."""
    setid = setid or {"trnid": TRNID, "valid": VALID, "tstid": TSTID}
    members = {"jpg/README.txt": b"not an image"}
    for k in range(len(labels), 0, -1):
        if k not in skip:
            members[f"jpg/image_{k:05d}.jpg"] = jpeg(int(labels[k - 1]) - 1, 40 + 3 * k, 70 - 2 * k)
    # MATLAB stores these as 1 x N doubles, as the official files do
    return {"102flowers.tgz": tar_gz(members),
            "imagelabels.mat": mat(labels=np.asarray(labels, float)[None]),
            "setid.mat": mat(**{k: np.asarray(v, float)[None] for k, v in setid.items()})}


def write(raw: Path, files: dict[str, bytes]) -> Path:
    raw.mkdir(parents=True, exist_ok=True)
    for name, data in files.items():
        (raw / name).write_bytes(data)
    return raw


def test_flowers102_download_and_prepare(tmp_path: Path, server: FileServer) -> None:  # noqa: F811
    files = flowers_files()
    server.files.update(files)
    raw = tmp_path / "raw"
    paths = download_dataset("flowers102", raw, mirror=server.url, checksums={f: md5(b) for f, b in files.items()})
    assert [p.name for p in paths] == raw_files("flowers102") == ["102flowers.tgz", "imagelabels.mat", "setid.mat"]
    assert all(p.read_bytes() == files[p.name] for p in paths)
    meta = prepare_dataset("flowers102", tmp_path / "flowers102.npz", raw)
    p = load_prepared(tmp_path / "flowers102.npz")
    side = fedl2g_sets.SIDE
    assert side == 32 and meta["shape"] == [32, 32, 3]
    assert p.x_train.shape == (6, 32, 32, 3) and p.x_test.shape == (6, 32, 32, 3)  # trnid + valid | tstid
    assert meta["num_classes"] == 102 and len(meta["classes"]) == 102 and meta["classes"][76] == "77"
    assert meta["split_sizes"] == {"trnid": 3, "valid": 3, "tstid": 6}
    # labels: the official label - 1 of each id, in setid order
    assert p.y_train.tolist() == [FLOWER_LABELS[i - 1] - 1 for i in TRNID + VALID] == [39, 76, 55, 76, 101, 0]
    assert p.y_test.tolist() == [FLOWER_LABELS[i - 1] - 1 for i in TSTID]
    assert p.y_train.min() >= 0 and p.y_test.max() == 101  # 0..101
    for x, y in ((p.x_train, p.y_train), (p.x_test, p.y_test)):  # every image shows its own class
        assert [label_of(img) for img in x] == y.tolist()
    assert sorted(q.name for q in raw.iterdir()) == sorted(files)  # read in place, nothing extracted


def test_flowers102_side_is_a_parameter(tmp_path: Path) -> None:
    raw = write(tmp_path, flowers_files())
    x_tr, y_tr, x_te, _, meta = fedl2g_sets.prepare_flowers102(raw, side=64)
    assert x_tr.shape == (6, 64, 64, 3) and x_te.shape == (6, 64, 64, 3) and meta["shape"] == [64, 64, 3]
    assert [label_of(img) for img in x_tr] == y_tr.tolist()


def test_flowers102_official_md5_is_checked_and_bad_bytes_quarantined(tmp_path: Path,
                                                                     server: FileServer) -> None:  # noqa: F811
    files = flowers_files()
    server.files.update(files)
    raw = tmp_path / "raw"
    # the small stand-ins are not the official files: the pinned md5 refuses the first one
    with pytest.raises(ChecksumError, match=r"102flowers\.tgz.*expected 52808999861908f626f3c1f4e79d11fa"):
        download_dataset("flowers102", raw, mirror=server.url)
    assert (raw / "102flowers.tgz.corrupt").exists() and not (raw / "102flowers.tgz").exists()
    good = {f: md5(b) for f, b in files.items()}
    server.files["imagelabels.mat"] = files["imagelabels.mat"][:-4] + b"JUNK"  # damaged in transit
    with pytest.raises(ChecksumError, match=r"imagelabels\.mat") as err:
        download_dataset("flowers102", raw, mirror=server.url, checksums=good)
    assert f"expected {good['imagelabels.mat']}" in str(err.value)
    assert (raw / "imagelabels.mat.corrupt").exists() and not (raw / "imagelabels.mat").exists()
    server.files["imagelabels.mat"] = files["imagelabels.mat"]
    server.requests.clear()
    download_dataset("flowers102", raw, mirror=server.url, checksums=good)
    assert server.requests == ["imagelabels.mat", "setid.mat"]  # the verified archive is not fetched again
    server.files.pop("setid.mat")
    (raw / "setid.mat").unlink()
    with pytest.raises(DownloadError, match=r"flowers102: HTTP 404.*setid\.mat"):
        download_dataset("flowers102", raw, mirror=server.url, checksums=good)


def test_flowers102_bad_files_are_named(tmp_path: Path) -> None:
    raw = write(tmp_path, flowers_files())
    (raw / "setid.mat").unlink()
    with pytest.raises(FileNotFoundError, match=r"setid\.mat is missing"):
        fedl2g_sets.prepare_flowers102(raw)
    cases = [
        ({"imagelabels.mat": b"not a mat file at all"}, r"imagelabels\.mat: not a MATLAB \.mat file"),
        ({"imagelabels.mat": mat(classes=FLOWER_LABELS[None])}, r"imagelabels\.mat: no variable 'labels'"),
        (flowers_files(labels=np.where(FLOWER_LABELS == 102, 103, FLOWER_LABELS)),
         r"imagelabels\.mat: 'labels' must lie in 1\.\.102"),
        (flowers_files(labels=np.where(FLOWER_LABELS == 1, 0, FLOWER_LABELS)), r"imagelabels\.mat: 'labels'"),
        (flowers_files(setid={"trnid": TRNID, "valid": VALID, "tstid": [*TSTID, 13]}),
         r"setid\.mat: tstid lists image id 13, outside 1\.\.12"),
        (flowers_files(setid={"trnid": TRNID, "valid": [*VALID, 5], "tstid": TSTID}),
         r"setid\.mat: image id 5 is in both trnid and valid"),
        (flowers_files(setid={"trnid": TRNID, "tstid": TSTID}), r"setid\.mat: no variable 'valid'"),
        (flowers_files(skip=(11,)), r"102flowers\.tgz: lacks 1 image.*jpg/image_00011\.jpg"),
        ({"102flowers.tgz": b"\x1f\x8b not really gzip"}, r"102flowers\.tgz: not a readable \.tgz"),
        ({"102flowers.tgz": tar_gz({"jpg/image_00002.jpg": b"\xff\xd8 broken jpeg"})},
         r"102flowers\.tgz member jpg/image_00002\.jpg: not a readable image"),
    ]
    for i, (replace, message) in enumerate(cases):
        raw = write(tmp_path / f"case{i}", {**flowers_files(), **replace})
        with pytest.raises(ValueError, match=message):
            fedl2g_sets.prepare_flowers102(raw, side=8)


def test_flowers102_official_sources_match_torchvision() -> None:
    theirs = torchvision_class_attrs("flowers102")["Flowers102"]
    remote = fedl2g_sets.REMOTES["flowers102"]
    assert remote.base == theirs["_download_url_prefix"]
    assert remote.files == dict(theirs["_file_dict"].values())
    assert get_spec("flowers102").files == tuple(remote.files)
    assert remote.base + "102flowers.tgz" in get_spec("flowers102").manual_instructions


# ---------------------------------------------------------------- Tiny-ImageNet

WNIDS = ["n03444034", "n01443537", "n02124075"]  # not sorted: wnids.txt order is the class order
GREY = 31  # Tiny-ImageNet class c is drawn as colour(GREY + c): class 0 is (60, 60, 60), a grey
# annotation order differs from file-name order: the prepared test split follows val_annotations.txt
VAL = [("val_3.JPEG", 1), ("val_0.JPEG", 2), ("val_4.JPEG", 0), ("val_1.JPEG", 0), ("val_2.JPEG", 2)]


def tiny_zip(wnids: list[str] = WNIDS, val: list[tuple[str, int]] = VAL, per_class: int = 4,
             extra: dict[str, bytes] | None = None, drop: tuple[str, ...] = (),
             annotations: str | None = None) -> bytes:
    """A tiny-imagenet-200.zip: 64x64 JPEGs (one greyscale), boxes files, an unlabelled test/ folder."""
    root = "tiny-imagenet-200/"
    members = {root + "wnids.txt": "".join(w + "\n" for w in wnids).encode(),
               root + "words.txt": "".join(f"{w}\tname of {w}, alias\n" for w in [*wnids, "n09999999"]).encode()}
    for label, w in enumerate(wnids):
        for k in reversed(range(per_class)):  # archive order must not matter
            mode = "L" if (label, k) == (0, 1) else "RGB"  # Tiny-ImageNet has greyscale JPEGs
            members[f"{root}train/{w}/images/{w}_{k}.JPEG"] = jpeg(GREY + label, 64, 64, mode)
        members[f"{root}train/{w}/{w}_boxes.txt"] = b"".join(f"{w}_{k}.JPEG\t0\t0\t63\t63\n".encode()
                                                            for k in range(per_class))
    lines = []
    for fname, label in val:
        members[f"{root}val/images/{fname}"] = jpeg(GREY + label, 64, 64)
        lines.append(f"{fname}\t{wnids[label] if label < len(wnids) else 'n00000000'}\t1\t2\t60\t61\n")
    members[root + "val/val_annotations.txt"] = (annotations if annotations is not None else "".join(lines)).encode()
    members[root + "test/images/test_0.JPEG"] = jpeg(7, 64, 64)
    members.update(extra or {})
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as zf:
        for name, data in members.items():
            if name not in drop:
                zf.writestr(name, data)
    return buf.getvalue()


def test_tiny_imagenet_download_and_prepare(tmp_path: Path, server: FileServer) -> None:  # noqa: F811
    data = tiny_zip()
    server.files["tiny-imagenet-200.zip"] = data
    raw = tmp_path / "raw"
    paths = download_dataset("tiny_imagenet", raw, mirror=server.url, checksums={"tiny-imagenet-200.zip": md5(data)})
    assert [p.name for p in paths] == raw_files("tiny_imagenet") == ["tiny-imagenet-200.zip"]
    meta = prepare_dataset("tiny_imagenet", tmp_path / "tiny_imagenet.npz", raw)
    p = load_prepared(tmp_path / "tiny_imagenet.npz")
    assert meta["num_classes"] == 3 and meta["classes"] == WNIDS
    assert meta["class_names"] == [f"name of {w}, alias" for w in WNIDS]
    assert p.x_train.shape == (12, 32, 32, 3) and p.x_test.shape == (5, 32, 32, 3)  # train/ | val/
    assert p.y_train.tolist() == [0] * 4 + [1] * 4 + [2] * 4  # wnids.txt order, not sorted order
    assert p.y_test.tolist() == [label for _, label in VAL]  # val_annotations.txt order and labels
    for x, y in ((p.x_train, p.y_train), (p.x_test, p.y_test)):
        assert [label_of(img) - GREY for img in x] == y.tolist()
    grey = p.x_train[2]  # n03444034_1.JPEG, stored as a greyscale JPEG: three equal channels after RGB
    assert np.array_equal(grey[..., 0], grey[..., 1]) and np.array_equal(grey[..., 1], grey[..., 2])
    assert abs(int(grey.mean()) - LEVEL) <= 3


def test_tiny_imagenet_at_native_size_is_not_resampled(tmp_path: Path) -> None:
    raw = write(tmp_path, {"tiny-imagenet-200.zip": tiny_zip()})
    x_tr, _, x_te, _, meta = fedl2g_sets.prepare_tiny_imagenet(raw, side=64)
    assert meta["shape"] == [64, 64, 3]
    with zipfile.ZipFile(raw / "tiny-imagenet-200.zip") as zf:
        first = zf.read(f"tiny-imagenet-200/train/{WNIDS[0]}/images/{WNIDS[0]}_0.JPEG")
        val4 = zf.read("tiny-imagenet-200/val/images/val_4.JPEG")
    assert np.array_equal(x_tr[0], np.asarray(Image.open(io.BytesIO(first)).convert("RGB")))
    assert np.array_equal(x_te[2], np.asarray(Image.open(io.BytesIO(val4)).convert("RGB")))  # 3rd annotation


def test_tiny_imagenet_bad_files_are_named(tmp_path: Path, server: FileServer) -> None:  # noqa: F811
    with pytest.raises(FileNotFoundError, match=r"tiny-imagenet-200\.zip is missing"):
        fedl2g_sets.prepare_tiny_imagenet(tmp_path)
    root = "tiny-imagenet-200/"
    good = "".join(f"{f}\t{WNIDS[c]}\t0\t0\t1\t1\n" for f, c in VAL)
    cases = [
        (b"PK\x03\x04 not a zip", r"tiny-imagenet-200\.zip: not a readable zip"),
        (tiny_zip(drop=(root + "wnids.txt",)), r"lacks tiny-imagenet-200/wnids\.txt"),
        (tiny_zip(wnids=[*WNIDS, WNIDS[0]]), r"wnids\.txt is empty or repeats"),
        (tiny_zip(val=[*VAL, ("val_5.JPEG", 5)]), r"val_annotations\.txt:6: WordNet id 'n00000000' is not in"),
        (tiny_zip(annotations=good + "val_9.JPEG\t" + WNIDS[0] + "\n"),
         r"lists val_9\.JPEG, which .*val/images/ lacks"),
        (tiny_zip(annotations=good.replace("val_4.JPEG\t" + WNIDS[0] + "\t0\t0\t1\t1\n", "")),
         r"val/images/val_4\.JPEG has no line in val_annotations\.txt"),
        (tiny_zip(annotations=good + "garbage\n"), r"val_annotations\.txt:6: expected"),
        (tiny_zip(annotations=good + good.splitlines(True)[0]), r"lists an image twice"),
        (tiny_zip(extra={f"{root}train/n00000001/images/n00000001_0.JPEG": jpeg(0, 64, 64)}),
         r"train/n00000001/images/n00000001_0\.JPEG is under a class folder not listed in wnids\.txt"),
        (tiny_zip(drop=tuple(f"{root}train/{WNIDS[1]}/images/{WNIDS[1]}_{k}.JPEG" for k in range(4))),
         rf"no training images under tiny-imagenet-200/train/{WNIDS[1]}/images/ \(1 of 3 classes"),
        (tiny_zip(extra={f"{root}val/images/val_1.JPEG": b"\xff\xd8 broken"}),
         r"member tiny-imagenet-200/val/images/val_1\.JPEG: not a readable image"),
    ]
    for i, (data, message) in enumerate(cases):
        raw = write(tmp_path / f"case{i}", {"tiny-imagenet-200.zip": data})
        with pytest.raises(ValueError, match=message):
            fedl2g_sets.prepare_tiny_imagenet(raw, side=8)
            pytest.fail(f"case {i} was accepted")
    # a download whose bytes are not the pinned archive is refused and kept aside
    server.files["tiny-imagenet-200.zip"] = tiny_zip()
    with pytest.raises(ChecksumError, match=r"tiny-imagenet-200\.zip.*expected 90528d7ca1a48142e341f4ef8d21d0de"):
        download_dataset("tiny_imagenet", tmp_path / "raw", mirror=server.url)
    assert (tmp_path / "raw" / "tiny-imagenet-200.zip.corrupt").exists()


def test_rule_steps_download_and_prepare_from_a_mirror(tmp_path: Path, server: FileServer,  # noqa: F811
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """The download / prepare rules' steps (fedrepro.pipeline) with a mirror serving both data sets."""
    served = {**flowers_files(), "tiny-imagenet-200.zip": tiny_zip()}
    server.files.update(served)
    for name in ("flowers102", "tiny_imagenet"):  # the stand-ins pass as the official files
        for fname in fedl2g_sets.REMOTES[name].files:
            monkeypatch.setitem(fedl2g_sets.REMOTES[name].files, fname, md5(served[fname]))
    for name, n_train, n_test, classes in (("flowers102", 6, 6, 102), ("tiny_imagenet", 12, 5, 3)):
        raw, out = tmp_path / name / "raw", tmp_path / f"{name}.npz"
        logged: list[str] = []
        pipeline.download(name, raw, server.url, log=logged.append)
        record = json.loads((raw / "MANIFEST.json").read_text())
        assert record["dataset"] == name
        assert record["files"] == {f: {"md5": md5(served[f]), "bytes": len(served[f])} for f in raw_files(name)}
        pipeline.prepare(name, out, raw, log=logged.append)
        p = load_prepared(out)
        assert (len(p.y_train), len(p.y_test), p.num_classes) == (n_train, n_test, classes)
        assert p.x_train.shape[1:] == (32, 32, 3) and p.meta["name"] == name
        assert "checksum verified" in logged[0] and f"{classes} classes" in logged[-1]


def test_fedl2g_data_sets_are_registered() -> None:
    for name in ("cifar10", "cifar100", "flowers102", "tiny_imagenet"):
        assert name in DATASETS and get_spec(name).needs_download
    assert fedl2g_sets.REMOTES["tiny_imagenet"].base + "tiny-imagenet-200.zip" == \
        "http://cs231n.stanford.edu/tiny-imagenet-200.zip"
    assert fedl2g_sets.REMOTES["tiny_imagenet"].files == {"tiny-imagenet-200.zip": "90528d7ca1a48142e341f4ef8d21d0de"}
