"""Feddle's data sets: CIFAR-100 under its 20 superclasses partitioned over the 100 fine labels, FEMNIST
(NIST SD19 by writer, first 40 classes) and CelebA (Smiling, by person), and the partition kind `writer`.

Downloads go to the throwaway HTTP server of tests/datasets/test_data.py on 127.0.0.1, which serves small files in
the real formats: a cifar-100-python.tar.gz of protocol-2 pickles, NIST's by_class.zip / by_write.zip
(128x128 binary PNGs in by_class/<hex code>/hsf_<k>/ and by_write/hsf_<k>/<writer>/<form>/), and CelebA's
img_align_celeba.zip of 178x218 JPEGs with list_attr_celeba.txt and identity_CelebA.txt.
"""

from __future__ import annotations

import io
import json
import zipfile
from pathlib import Path

import jsonschema
import numpy as np
import pytest
import yaml
from PIL import Image
from support.files import FileServer, cifar_rows, md5, pickle_bytes, tar_gz

from fedrepro import pipeline
from fedrepro.config import REPO
from fedrepro.data import feddle_sets
from fedrepro.data.download import ChecksumError
from fedrepro.data.format import PreparedFormatError, arrays_sha256, load_prepared, save_prepared
from fedrepro.data.registry import download_dataset, get_spec, prepare_dataset, raw_files
from fedrepro.io import atomic_write_npz
from fedrepro.partition import load_partition, make_partition

RNG = np.random.default_rng(8)


def write(raw: Path, files: dict[str, bytes]) -> Path:
    raw.mkdir(parents=True, exist_ok=True)
    for name, data in files.items():
        (raw / name).write_bytes(data)
    return raw


def zip_bytes(members: dict[str, bytes]) -> bytes:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as zf:
        for name, data in members.items():
            zf.writestr(name, data)
    return buf.getvalue()


# ---------------------------------------------------------------- the format's extra arrays


def small_arrays() -> tuple[np.ndarray, ...]:
    x_tr, x_te = RNG.integers(0, 256, (6, 4, 4, 1), dtype=np.uint8), RNG.integers(0, 256, (3, 4, 4, 1), dtype=np.uint8)
    return x_tr, np.array([0, 1, 0, 1, 1, 0]), x_te, np.array([1, 0, 1])


META = {"name": "t", "num_classes": 2, "classes": ["a", "b"], "shape": [4, 4, 1], "source": "test"}


def test_extra_arrays_round_trip_and_are_checked(tmp_path: Path) -> None:
    arrays = small_arrays()
    groups = {"groups_train": np.array([0, 0, 1, 1, 2, 2], dtype=np.int32), "groups_test": np.array([0, 1, 2])}
    meta = save_prepared(tmp_path / "g.npz", *arrays, META, groups)
    p = load_prepared(tmp_path / "g.npz")
    assert sorted(p.extras) == ["groups_test", "groups_train"] and p.extras["groups_train"].dtype == np.int64
    assert p.extras["groups_train"].tolist() == [0, 0, 1, 1, 2, 2] and p.meta == meta
    # the extras are part of the digest; a file without them keeps the digest of the four arrays
    assert meta["sha256"] != arrays_sha256(*arrays)
    assert save_prepared(tmp_path / "plain.npz", *arrays, META)["sha256"] == arrays_sha256(*arrays)
    assert load_prepared(tmp_path / "plain.npz").extras == {}
    # a tampered extra array is caught by the digest
    with np.load(tmp_path / "g.npz") as z:
        stored = dict(z)
    stored["groups_train"] = np.array([0, 0, 1, 1, 2, 3])
    atomic_write_npz(tmp_path / "tampered.npz", checksum=True, **stored)
    with pytest.raises(PreparedFormatError, match="tampered.npz: sha256 mismatch"):
        load_prepared(tmp_path / "tampered.npz")
    bad = [({"groups_train": np.zeros(5, np.int64)},
            r"groups_train must be int64 with one value per train sample \(6\)"),
           ({"groups_test": np.zeros(3)}, "groups_test must be int64"),
           ({"partition_labels_train": np.array([0, 1, -1, 0, 0, 0])}, "partition_labels_train has negative"),
           ({"writers": np.zeros(6, np.int64)}, r"unknown extra arrays \['writers'\]")]
    for extras, message in bad:
        with pytest.raises(PreparedFormatError, match=message):
            save_prepared(tmp_path / "bad.npz", *arrays, META, extras)
    assert not (tmp_path / "bad.npz").exists()


# ---------------------------------------------------------------- CIFAR-100, 20 superclasses

# a fine -> coarse map like the official one: 5 fine classes per superclass, not in blocks of 5
FINE_TO_COARSE = np.random.default_rng(100).permutation(np.repeat(np.arange(20), 5))
PER_FINE = 6


def cifar100_archive() -> tuple[bytes, dict[str, np.ndarray]]:
    members, fine = {}, {}
    for split, n in (("train", 100 * PER_FINE), ("test", 40)):
        _, rows = cifar_rows(n)
        fine[split] = np.tile(np.arange(100), n // 100 + 1)[:n] if split == "train" else RNG.integers(0, 100, n)
        members[f"cifar-100-python/{split}"] = pickle_bytes(
            {"filenames": [f"{j}.png" for j in range(n)], "batch_label": split, "fine_labels": fine[split].tolist(),
             "coarse_labels": FINE_TO_COARSE[fine[split]].tolist(), "data": rows})
    members["cifar-100-python/meta"] = pickle_bytes({"fine_label_names": [f"f{i}" for i in range(100)],
                                                     "coarse_label_names": [f"c{i}" for i in range(20)]})
    return tar_gz(members), fine


def max_share(parts: list[np.ndarray], labels: np.ndarray) -> np.ndarray:
    """Per class, the largest share of its samples any one client holds."""
    counts = np.array([np.bincount(labels[p], minlength=labels.max() + 1) for p in parts])
    return counts.max(axis=0) / counts.sum(axis=0)


def test_cifar100_coarse_labels_superclasses_and_partitions_over_fine(tmp_path: Path,
                                                                     server: FileServer) -> None:  # noqa: F811
    archive, fine = cifar100_archive()
    server.files["cifar-100-python.tar.gz"] = archive
    raw = tmp_path / "raw"
    paths = download_dataset("cifar100_coarse", raw, mirror=server.url,
                             checksums={"cifar-100-python.tar.gz": md5(archive)})
    assert [p.name for p in paths] == raw_files("cifar100_coarse") == ["cifar-100-python.tar.gz"]
    meta = prepare_dataset("cifar100_coarse", tmp_path / "cifar100_coarse.npz", raw)
    p = load_prepared(tmp_path / "cifar100_coarse.npz")
    assert meta["num_classes"] == 20 and meta["classes"] == [f"c{i}" for i in range(20)]
    assert meta["partition_classes"] == [f"f{i}" for i in range(100)]
    assert meta["fine_to_coarse"] == FINE_TO_COARSE.tolist()
    # training labels: the archive's official superclass of each fine label
    assert p.y_train.tolist() == FINE_TO_COARSE[fine["train"]].tolist() and set(p.y_train.tolist()) == set(range(20))
    assert p.y_test.tolist() == FINE_TO_COARSE[fine["test"]].tolist()
    assert p.extras["partition_labels_train"].tolist() == fine["train"].tolist()
    assert p.extras["partition_labels_test"].tolist() == fine["test"].tolist()

    # the partition step draws over the fine labels: with a tiny beta each fine class sits mostly on one
    # client, so superclasses (5 fine classes each) are spread; drawn over the superclasses instead,
    # each superclass would sit on one client
    spec = {"kind": "dirichlet", "clients": 10, "beta": 0.01, "balance": False}
    outs = [tmp_path / "part" / "s0.npz", tmp_path / "part" / "s1.npz"]
    pipeline.partition(tmp_path / "cifar100_coarse.npz", spec, [0, 1], outs, lambda _: None)
    parts = load_partition(outs[0])
    assert sorted(np.concatenate(parts).tolist()) == list(range(len(p.y_train)))
    # (not exactly one client: the cumulative cuts' rounding may pass a class's last sample on)
    assert max_share(parts, fine["train"]).mean() > 0.8
    assert max_share(parts, p.y_train).mean() < 0.6
    over_coarse = make_partition(p.y_train, spec, seed=0)
    assert max_share(over_coarse, p.y_train).mean() > 0.8
    assert [q.tolist() for q in over_coarse] != [q.tolist() for q in parts]
    stats = json.loads(outs[0].with_suffix(".json").read_text())
    # the stats count the training labels (superclasses), and say what the partition was drawn over
    assert stats["partitioned_by"] == "partition_labels_train" and np.array(stats["class_counts"]).shape == (10, 20)
    assert np.array(stats["class_counts"]).sum(axis=0).tolist() == np.bincount(p.y_train, minlength=20).tolist()
    assert load_partition(outs[1])[0].tolist() != parts[0].tolist()  # the seed matters
    # a pooled partition needs the test split's fine labels too, and has them
    pipeline.partition(tmp_path / "cifar100_coarse.npz", {**spec, "pool_test": True}, [0], [tmp_path / "pool.npz"],
                       lambda _: None)
    assert sum(map(len, load_partition(tmp_path / "pool.npz"))) == len(p.y_train) + len(p.y_test)


# ---------------------------------------------------------------- FEMNIST

# LEAF's class ids: 0-9 digits, 10-35 A-Z, 36-61 a-z; the first 40 are 0-9, A-Z, a-d
CODES = {0: "30", 7: "37", 10: "41", 35: "5a", 36: "61", 39: "64", 40: "65", 61: "7a"}
# writer -> the LEAF classes of its images, in by_write file order (hsf partition, form type per class)
WRITERS = {
    "f0100_07": [0, 7, 10, 35, 36, 39, 0, 7, 10, 35, 36, 39],
    "f0003_41": [7, 7, 10, 10, 39, 39, 0, 0, 61, 40],  # two of classes >= 40, which are left out
    "f0042_14": [35, 36, 0, 0, 7, 10, 10],
    "f1999_00": [39, 0, 36],
    "f0500_12": [10],  # one sample: cannot be split, not eligible
}
PARTITION_OF = {"f0100_07": 0, "f0003_41": 0, "f0042_14": 3, "f1999_00": 7, "f0500_12": 7}


def scan(label: int, serial: int) -> bytes:
    """A 128x128 binary PNG: a dark band of 2 * (label + 1) rows from the top (its class, readable after
    resizing) on white, and the serial number's bits as dark dots in the last row (unique bytes)."""
    img = np.full((128, 128), 255, np.uint8)
    img[: 2 * (label + 1)] = 0
    img[127, [b for b in range(12) if serial >> b & 1]] = 0
    buf = io.BytesIO()
    Image.fromarray(img).convert("1").save(buf, format="PNG")
    return buf.getvalue()


def class_of(img: np.ndarray) -> int:
    """The class of a prepared 28x28 scan: its dark fraction is (2 * (label + 1)) / 128."""
    return int(np.rint((1 - img.mean() / 255) * 64 - 1))


def nist_zips(unmatched: bool = True) -> dict[str, bytes]:
    by_class, by_write, serial = {}, {}, 0
    for writer, labels in WRITERS.items():
        for k, label in enumerate(labels):
            png = scan(label, serial)
            code = CODES[label]
            by_class[f"by_class/{code}/hsf_{PARTITION_OF[writer]}/hsf_{PARTITION_OF[writer]}_{serial:05d}.png"] = png
            by_class[f"by_class/{code}/train_{code}/train_{code}_{serial:05d}.png"] = png  # the same images again
            form = {0: "d", 1: "d", 2: "u", 3: "u"}.get(k % 4, "l")
            number = writer[1:5]
            by_write[f"by_write/hsf_{PARTITION_OF[writer]}/{writer}/{form}{number}_{writer[-2:]}/"
                     f"{form}{number}_{writer[-2:]}_{k:05d}.png"] = png
            serial += 1
    for code in {CODES[c] for c in (0, 10)}:
        by_class[f"by_class/{code}/hsf_0.mit"] = b"a NIST .mit index, not an image"
    if unmatched:  # an image found in no by_class folder
        by_write["by_write/hsf_0/f0100_07/c0100_07/c0100_07_00099.png"] = scan(5, 4000)
    return {"by_class.zip": zip_bytes(by_class), "by_write.zip": zip_bytes(by_write)}


def test_leaf_class_ids() -> None:
    assert [feddle_sets.leaf_class(c, "x") for c in ("30", "39", "41", "5a", "61", "64", "7a")] == [
        0, 9, 10, 35, 36, 39, 61]
    assert feddle_sets.LEAF_CLASSES[:40] == "0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcd"
    with pytest.raises(ValueError, match="class folder 'zz' is not a hex"):
        feddle_sets.leaf_class("zz", "x")
    with pytest.raises(ValueError, match="class folder '2e' is '.', not a digit or a letter"):
        feddle_sets.leaf_class("2e", "x")


def test_femnist_download_and_prepare(tmp_path: Path, server: FileServer,  # noqa: F811
                                     monkeypatch: pytest.MonkeyPatch) -> None:
    files = nist_zips()
    server.files.update(files)
    for fname, data in files.items():  # the small stand-ins pass as NIST's files
        monkeypatch.setitem(feddle_sets.FEMNIST_MD5, fname, md5(data))
    raw = tmp_path / "femnist" / "raw"
    pipeline.download("femnist", raw, server.url, lambda _: None)  # the rule's step
    assert sorted(server.requests) == ["by_class.zip", "by_write.zip"] == raw_files("femnist")
    manifest = json.loads((raw / "MANIFEST.json").read_text())
    assert manifest["files"] == {f: {"md5": md5(b), "bytes": len(b)} for f, b in files.items()}
    assert "https://s3.amazonaws.com/nist-srd/SD19/by_write.zip" in get_spec("femnist").manual_instructions

    meta = prepare_dataset("femnist", tmp_path / "femnist.npz", raw)
    p = load_prepared(tmp_path / "femnist.npz")
    assert meta["num_classes"] == 40 and meta["classes"][-4:] == ["a", "b", "c", "d"] and meta["shape"] == [28, 28, 1]
    assert p.x_train.shape[1:] == (28, 28, 1) and p.x_train.dtype == np.uint8
    # the 4 writers with >= 2 samples of the first 40 classes, in name order (fewer than 1000: all kept)
    assert meta["writers"] == ["f0003_41", "f0042_14", "f0100_07", "f1999_00"] and meta["eligible_writers"] == 4
    assert meta["skipped_images"] == {"unmatched": 1, "ambiguous": 0, "other_classes": 2}
    # every image shows its own class; each writer's labels are those of its by_write images
    for x, y in ((p.x_train, p.y_train), (p.x_test, p.y_test)):
        assert [class_of(img) for img in x] == y.tolist()
    for w, name in enumerate(meta["writers"]):
        labels = p.y_train[p.extras["groups_train"] == w].tolist() + p.y_test[p.extras["groups_test"] == w].tolist()
        kept = [c for c in WRITERS[name] if c < 40]
        assert sorted(labels) == sorted(kept)
        assert (p.extras["groups_train"] == w).sum() == int(0.9 * len(kept))  # LEAF's 90/10 sample split
    assert np.all(np.diff(p.extras["groups_train"]) >= 0)  # stored writer by writer

    # the partition kind `writer`: each writer one client
    out = tmp_path / "part.npz"
    pipeline.partition(tmp_path / "femnist.npz", {"kind": "writer", "clients": 4}, [0], [out], lambda _: None)
    parts = load_partition(out)
    assert [sorted(set(p.extras["groups_train"][q].tolist())) for q in parts] == [[0], [1], [2], [3]]
    assert sum(map(len, parts)) == len(p.y_train)


def test_femnist_selection_of_writers(tmp_path: Path) -> None:
    raw = write(tmp_path, nist_zips(unmatched=False))
    *_, meta, groups = feddle_sets.prepare_femnist(raw, clients=2, select="largest")
    assert meta["writers"] == ["f0003_41", "f0100_07"]  # 8 and 12 samples of the first 40 classes
    assert set(groups["groups_train"].tolist()) == {0, 1}
    drawn = {tuple(feddle_sets.prepare_femnist(raw, clients=3)[4]["writers"]) for _ in range(2)}
    assert len(drawn) == 1 and len(next(iter(drawn))) == 3  # a fixed draw, part of the data set
    assert set(next(iter(drawn))) <= {"f0003_41", "f0042_14", "f0100_07", "f1999_00"}
    with pytest.raises(ValueError, match="select must be 'random' or 'largest', got 'first'"):
        feddle_sets.prepare_femnist(raw, select="first")


def test_femnist_bad_files_are_named(tmp_path: Path) -> None:
    good = nist_zips()
    with pytest.raises(FileNotFoundError, match=r"by_class\.zip is missing"):
        feddle_sets.prepare_femnist(write(tmp_path / "a", {"by_write.zip": good["by_write.zip"]}))
    raw = write(tmp_path / "b", {**good, "by_write.zip": b"PK not a zip"})
    with pytest.raises(ValueError, match=r"by_write\.zip: not a readable zip"):
        feddle_sets.prepare_femnist(raw)
    raw = write(tmp_path / "c", {**good, "by_class.zip": zip_bytes({"by_class/30/train_30/x.png": scan(0, 1)})})
    with pytest.raises(ValueError, match=r"by_class\.zip: no images under by_class/<code>/hsf_<k>/"):
        feddle_sets.prepare_femnist(raw)
    raw = write(tmp_path / "d", {**good, "by_class.zip": zip_bytes({"by_class/30/hsf_0/x.png": scan(0, 5000)})})
    with pytest.raises(ValueError, match=r"by_write\.zip: no image .* matches an image of the first 40 classes"):
        feddle_sets.prepare_femnist(raw)


# ---------------------------------------------------------------- CelebA

ATTRIBUTE_LINE = ("5_o_Clock_Shadow Arched_Eyebrows Attractive Bags_Under_Eyes Bald Bangs Big_Lips Big_Nose "
                  "Black_Hair Blond_Hair Blurry Brown_Hair Bushy_Eyebrows Chubby Double_Chin Eyeglasses Goatee "
                  "Gray_Hair Heavy_Makeup High_Cheekbones Male Mouth_Slightly_Open Mustache Narrow_Eyes No_Beard "
                  "Oval_Face Pale_Skin Pointy_Nose Receding_Hairline Rosy_Cheeks Sideburns Smiling Straight_Hair "
                  "Wavy_Hair Wearing_Earrings Wearing_Hat Wearing_Lipstick Wearing_Necklace Wearing_Necktie Young")
ATTRIBUTES = ATTRIBUTE_LINE.split()  # CelebA's 40 attributes in their file order
# person id -> Smiling (1 / -1) of each of their images; "5" has 4 images, fewer than LEAF's 5
PEOPLE = {"2880": [1, -1, -1, 1, 1, -1, 1], "17": [-1, -1, 1, 1, -1, 1], "10173": [1, 1, -1, -1, -1],
          "5": [1, -1, 1, -1]}
LEVEL = 60


def colour(k: int) -> tuple[int, int, int]:
    return (k % 5 * LEVEL, k // 5 % 5 * LEVEL, k // 25 % 5 * LEVEL)


def index_of(img: np.ndarray) -> int:
    d = np.rint(img.reshape(-1, 3).mean(0) / LEVEL).astype(int)
    return int(d[0] + 5 * d[1] + 25 * d[2])


def celeba_files(drop_of: str | None = None) -> tuple[dict[str, bytes], dict[str, tuple[str, int]]]:
    """The three CelebA files, and image name -> (person, smiling 0/1). Images are interleaved across
    people, as CelebA's numbering is, and image k is one flat colour encoding k. ``drop_of``: a person
    whose first image the zip lacks."""
    rows = [(person, s) for person, values in PEOPLE.items() for s in values]
    order = np.random.default_rng(5).permutation(len(rows))
    truth, members, attr, ids = {}, {}, [], []
    for k, i in enumerate(order, start=1):
        person, s = rows[i]
        name = f"{k:06d}.jpg"
        truth[name] = (person, int(s == 1))
        if person == drop_of:
            drop_of = None
        else:
            buf = io.BytesIO()
            Image.fromarray(np.full((218, 178, 3), colour(k), np.uint8)).save(buf, format="JPEG", quality=95)
            members[f"img_align_celeba/{name}"] = buf.getvalue()
        values = [RNG.choice([-1, 1]) for _ in ATTRIBUTES]
        values[ATTRIBUTES.index("Smiling")] = s
        attr.append(name + " " + " ".join(f"{v:2d}" for v in values))
        ids.append(f"{name} {person}")
    files = {"img_align_celeba.zip": zip_bytes(members),
             "list_attr_celeba.txt": f"{len(rows)}\n{' '.join(ATTRIBUTES)} \n{chr(10).join(attr)}\n".encode(),
             "identity_CelebA.txt": ("\n".join(ids) + "\n").encode()}
    return files, truth


def test_celeba_needs_a_manual_download(tmp_path: Path) -> None:
    spec = get_spec("celeba_smiling")
    assert spec.needs_download and raw_files("celeba_smiling") == [
        "img_align_celeba.zip", "list_attr_celeba.txt", "identity_CelebA.txt"]
    assert all(f in spec.manual_instructions for f in raw_files("celeba_smiling"))
    raw = write(tmp_path / "raw", {"list_attr_celeba.txt": b"1\nSmiling\nx.jpg 1\n"})
    with pytest.raises(FileNotFoundError, match=r"img_align_celeba\.zip, identity_CelebA\.txt missing from .*raw") as e:
        download_dataset("celeba_smiling", raw)
    assert "by hand" in str(e.value) and str(raw) in str(e.value) and "00d2c5bc6d35e252742224ab0c1e8fcb" in str(e.value)
    files, _ = celeba_files()
    write(raw, files)
    # the official md5 refuses the small stand-ins; the overridden one accepts them
    with pytest.raises(ChecksumError, match=r"img_align_celeba\.zip refused: md5 mismatch: expected 00d2c5bc"):
        download_dataset("celeba_smiling", raw)
    assert download_dataset("celeba_smiling", raw, checksums={f: md5(b) for f, b in files.items()}) == [
        raw / f for f in raw_files("celeba_smiling")]


def test_celeba_smiling_prepare(tmp_path: Path) -> None:
    files, truth = celeba_files()
    raw = write(tmp_path / "raw", files)
    x_tr, y_tr, x_te, y_te, meta, groups = feddle_sets.prepare_celeba_smiling(raw)
    save_prepared(tmp_path / "celeba.npz", x_tr, y_tr, x_te, y_te, meta, groups)  # a valid prepared file
    assert meta["num_classes"] == 2 and meta["shape"] == [32, 32, 3] and x_tr.shape[1:] == (32, 32, 3)
    assert meta["writers"] == ["10173", "17", "2880"] and meta["eligible_writers"] == 3  # "5" has 4 images
    names = sorted(truth)
    for x, y, g in ((x_tr, y_tr, groups["groups_train"]), (x_te, y_te, groups["groups_test"])):
        images = [names[index_of(img) - 1] for img in x]
        assert [truth[n][1] for n in images] == y.tolist()  # Smiling: 1 -> 1, -1 -> 0
        assert [meta["writers"][w] for w in g] == [truth[n][0] for n in images]
    for w, person in enumerate(meta["writers"]):  # every image of a kept person, 90/10 per person
        n = len(PEOPLE[person])
        assert (groups["groups_train"] == w).sum() == int(0.9 * n)
        assert (groups["groups_test"] == w).sum() == n - int(0.9 * n)
    *_, meta2, _ = feddle_sets.prepare_celeba_smiling(raw, clients=1, select="largest")
    assert meta2["writers"] == ["2880"]


def test_celeba_bad_files_are_named(tmp_path: Path) -> None:
    files, _ = celeba_files(drop_of="17")
    with pytest.raises(ValueError, match=r"img_align_celeba\.zip: lacks 1 image\(s\) .*img_align_celeba/\d{6}\.jpg"):
        feddle_sets.prepare_celeba_smiling(write(tmp_path / "a", files))
    files, _ = celeba_files()
    cases = [({"list_attr_celeba.txt": files["list_attr_celeba.txt"].replace(b"Smiling", b"Smiles")},
              r"list_attr_celeba\.txt: no attribute 'Smiling'"),
             ({"list_attr_celeba.txt": files["list_attr_celeba.txt"].replace(b"22\n", b"23\n", 1)},
              r"list_attr_celeba\.txt: header says 23 images, the file lists 22"),
             ({"list_attr_celeba.txt": files["list_attr_celeba.txt"].replace(b" 1", b" 2", 1)},
              r"list_attr_celeba\.txt line 3: expected an image name and 40 values of 1 or -1"),
             ({"identity_CelebA.txt": files["identity_CelebA.txt"] + b"000999.jpg 4\n"},
              r"list_attr_celeba\.txt: no Smiling value for 1 image\(s\) of .*identity_CelebA\.txt, e\.g\. 000999"),
             ({"identity_CelebA.txt": b"000001.jpg\n"},
              r"identity_CelebA\.txt line 1: expected an image name and a person")]
    for i, (replace, message) in enumerate(cases):
        with pytest.raises(ValueError, match=message):
            feddle_sets.prepare_celeba_smiling(write(tmp_path / f"case{i}", {**files, **replace}))


# ---------------------------------------------------------------- the partition kind `writer`


def test_writer_partition_draws_writers_and_names_bad_specs() -> None:
    groups = np.repeat([4, 0, 2, 7, 1], [3, 5, 2, 4, 6])
    labels = np.zeros(len(groups), np.int64)
    parts = make_partition(labels, {"kind": "writer", "clients": 5}, seed=0, groups=groups)
    assert [sorted(set(groups[q].tolist())) for q in parts] == [[0], [1], [2], [4], [7]]  # writers in id order
    assert sorted(np.concatenate(parts).tolist()) == list(range(len(groups)))
    drawn = [tuple(int(groups[q[0]]) for q in make_partition(labels, {"kind": "writer", "clients": 2}, seed=s,
                                                            groups=groups)) for s in range(10)]
    assert all(len(set(d)) == 2 and list(d) == sorted(d) for d in drawn) and len(set(drawn)) > 1
    with pytest.raises(ValueError, match=r"clients \(6\) exceeds the data set's 5 writers"):
        make_partition(labels, {"kind": "writer", "clients": 6}, seed=0, groups=groups)
    with pytest.raises(ValueError, match="needs a writer/person per sample .* which cifar10 lacks"):
        make_partition(labels, {"kind": "writer", "clients": 2}, seed=0, meta={"name": "cifar10"})
    with pytest.raises(ValueError, match="known kinds: .*writer"):
        make_partition(labels, {"kind": "writers", "clients": 2}, seed=0)


def test_schema_and_cost_know_the_new_sets() -> None:
    schema = yaml.safe_load((REPO / "workflow" / "schemas" / "study.schema.yaml").read_text())
    partition = schema["definitions"]["partition"]
    jsonschema.validate({"kind": "writer", "clients": 1000}, partition)
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate({"kind": "writers", "clients": 1000}, partition)
    from fedrepro.cost import DATASETS as COSTS  # torch: imported only here

    assert COSTS["cifar100_coarse"] == (50000, (32, 32, 3), 20)
    assert COSTS["femnist"][1:] == ((28, 28, 1), 40) and COSTS["celeba_smiling"][1:] == ((32, 32, 3), 2)
