"""DomainNet (Peng et al., ICCV 2019): six domains of the same 345 classes, and FedGTST's leave-one-out.

``domainnet_<domain>`` is one domain (clipart, infograph, painting, quickdraw, real, sketch): its zip from
the DomainNet site (the "cleaned" release) and the official ``<domain>_{train,test}.txt`` split lists,
whose lines are ``<domain>/<class>/<file>.jpg <label>``. Images are read from the zip in place, converted
to RGB and resized to ``SIDE`` x ``SIDE`` (bilinear, antialiased; the aspect ratio is not kept): DomainNet
has ~590,000 images of various sizes, and uint8 arrays at 64x64 keep the prepared domains at ~7 GB in all
(the paper does not say its resolution; 64 is our choice, and a setting may still resize further).
Classes are the zip's class folders in sorted order, which is the order of the split files' labels
(checked on every line).

``domainnet_no_<domain>`` is FedGTST's (and FedSR's) leave-one-out source: the other five domains'
train and test splits one after the other, in ``DOMAINS`` order, built from their prepared files (the
JPEGs are decoded once per domain, not once per leave-out). Its meta lists ``domains`` and
``domain_sizes_train`` / ``domain_sizes_test``, from which the partition kind ``domain`` gives each
source domain its own client.
"""

from __future__ import annotations

import json
import zipfile
from pathlib import Path, PurePosixPath

import numpy as np

from fedrepro.data.download import DownloadError, fetch
from fedrepro.data.format import load_prepared
from fedrepro.data.images import decode_image
from fedrepro.data.vision import Arrays, raw_file
from fedrepro.io import open_npz

DOMAINS = ("clipart", "infograph", "painting", "quickdraw", "real", "sketch")
SIDE = 64
BASE = "http://csr.bu.edu/ftp/visda/2019/multi-source/"
ZIP_PATH = {"clipart": "groundtruth/clipart.zip", "infograph": "infograph.zip",
            "painting": "groundtruth/painting.zip", "quickdraw": "quickdraw.zip", "real": "real.zip",
            "sketch": "sketch.zip"}
# md5 sums of the official files (as pinned by independent DomainNet loaders)
MD5 = {
    "clipart.zip": "cd0d8f2d77a4e181449b78ed62bccf1e",
    "infograph.zip": "720380b86f9e6ab4805bb38b6bd135f8",
    "painting.zip": "1ae32cdb4f98fe7ab5eb0a351768abfd",
    "quickdraw.zip": "bdc1b6f09f277da1a263389efe0c7a66",
    "real.zip": "dcc47055e8935767784b7162e7c7cca6",
    "sketch.zip": "658d8009644040ff7ce30bb2e820850f",
    "clipart_train.txt": "b4349693a7f9c05c53955725c47ed6cb",
    "infograph_train.txt": "379b50054f4ac2018dca4f89421b92d9",
    "painting_train.txt": "7db0e7ca73ad9982f6e1f7f3ef372c0a",
    "quickdraw_train.txt": "b732ced3939ac8efdd8c0a889dca56cc",
    "real_train.txt": "8ebf02c2075fadd564705f0dc7cd6291",
    "sketch_train.txt": "1233bd18aa9a8a200bf4cecf1c34ef3e",
    "clipart_test.txt": "f5ddbcfd657a3acf9d0f7da10db22565",
    "infograph_test.txt": "779626b50869edffe8ea6941c3755c71",
    "painting_test.txt": "232b35dc53f26d414686ae579e38d9b5",
    "quickdraw_test.txt": "c1a828fdfe216fb109f1c0083a252c6f",
    "real_test.txt": "6098816791c3ebed543c71ffa11b9054",
    "sketch_test.txt": "d8a222e4672cfd585298aa14d02ea441",
}
HOMEPAGE = "http://ai.bu.edu/M3SDA/"
LICENSE = "Peng et al. 2019, Moment Matching for Multi-Source Domain Adaptation (ICCV); fair use for research"


def files(domain: str) -> dict[str, str]:
    """Raw file name -> official URL of one domain: its zip and its two split lists."""
    return {f"{domain}.zip": BASE + ZIP_PATH[domain],
            f"{domain}_train.txt": f"{BASE}domainnet/txt/{domain}_train.txt",
            f"{domain}_test.txt": f"{BASE}domainnet/txt/{domain}_test.txt"}


def download(domain: str, raw_dir: Path, mirror: str | None = None,
             checksums: dict[str, str] | None = None) -> list[Path]:
    """Fetch one domain's zip and split lists into raw_dir (``mirror``: a base URL serving the files by
    name); md5 checked, a bad file quarantined as .corrupt."""
    paths = []
    for fname, url in files(domain).items():
        if mirror:
            url = mirror.rstrip("/") + "/" + fname
        md5 = (checksums or {}).get(fname, MD5[fname])
        try:
            paths.append(fetch(url, Path(raw_dir) / fname, md5))
        except DownloadError as e:
            raise DownloadError(f"domainnet_{domain}: {e}") from e
    return paths


def manual_instructions(domain: str) -> str:
    lines = [f"Without network access, put these files into <data_dir>/domainnet_{domain}/raw (from {HOMEPAGE}); "
             "the download step then only checks their md5:"]
    lines += [f"  {url}  md5 {MD5[fname]}" for fname, url in files(domain).items()]
    return "\n".join(lines)


def _split_list(path: Path) -> list[tuple[str, int]]:
    out = []
    for lineno, line in enumerate(path.read_text().splitlines(), 1):
        if not line.strip():
            continue
        parts = line.split()
        if len(parts) != 2 or not parts[1].lstrip("-").isdigit():
            raise ValueError(f"{path}:{lineno}: expected '<path> <label>', got {line!r}")
        out.append((parts[0], int(parts[1])))
    return out


def prepare_domain(domain: str, raw_dir: Path, side: int = SIDE) -> Arrays:
    """One DomainNet domain from its zip and official split lists (read in place)."""
    with zipfile.ZipFile(raw_file(raw_dir, f"{domain}.zip")) as zf:
        names = set(zf.namelist())
        classes = sorted({PurePosixPath(n).parts[1] for n in names
                          if len(PurePosixPath(n).parts) == 3 and PurePosixPath(n).parts[0] == domain})
        if not classes:
            raise ValueError(f"{raw_dir}/{domain}.zip: no {domain}/<class>/<image> members")
        index = {c: i for i, c in enumerate(classes)}
        arrays = []
        for split in ("train", "test"):
            listed = _split_list(raw_file(raw_dir, f"{domain}_{split}.txt"))
            x = np.empty((len(listed), side, side, 3), dtype=np.uint8)
            y = np.empty(len(listed), dtype=np.int64)
            for i, (member, label) in enumerate(listed):
                parts = PurePosixPath(member).parts
                if len(parts) != 3 or parts[0] != domain or index.get(parts[1]) != label:
                    raise ValueError(f"{domain}_{split}.txt: {member} {label} does not match the zip's class "
                                     f"folders (expected label {index.get(parts[1]) if len(parts) == 3 else '?'})")
                if member not in names:
                    raise ValueError(f"{domain}_{split}.txt lists {member}, which {domain}.zip lacks")
                x[i], y[i] = decode_image(zf.read(member), f"{domain}.zip member {member}", side, draft=True), label
            arrays += [x, y]
    meta = {"name": f"domainnet_{domain}", "num_classes": len(classes), "classes": classes,
            "shape": [side, side, 3], "source": BASE + ZIP_PATH[domain], "license": LICENSE, "domain": domain}
    return (*arrays, meta)


def _meta_and_counts(path: Path) -> tuple[dict, dict[str, int]]:
    """A prepared file's meta and its number of train and test samples (its images stay on disk)."""
    with open_npz(path, "prepared data set") as z:
        return json.loads(str(z["meta"][()])), {"train": len(z["y_train"]), "test": len(z["y_test"])}


def prepare_leave_one_out(target: str, inputs: list[Path]) -> Arrays:
    """The five domains other than ``target``, concatenated domain by domain (``inputs``: their prepared
    files, in ``DOMAINS`` order), each read straight into its place in the preallocated arrays."""
    sources = [d for d in DOMAINS if d != target]
    read = [_meta_and_counts(p) for p in inputs]
    metas, counts = [meta for meta, _ in read], [count for _, count in read]
    if [m.get("domain") for m in metas] != sources:
        raise ValueError(f"domainnet_no_{target}: inputs are {[m.get('domain') for m in metas]}, need {sources}")
    if any(m["classes"] != metas[0]["classes"] or m["shape"] != metas[0]["shape"] for m in metas):
        raise ValueError(f"domainnet_no_{target}: the domains' classes or image shapes differ")
    shape = tuple(metas[0]["shape"])
    out = {}
    for split in ("train", "test"):
        total = sum(c[split] for c in counts)
        out[f"x_{split}"] = np.empty((total, *shape), dtype=np.uint8)
        out[f"y_{split}"] = np.empty(total, dtype=np.int64)
    offsets = {"train": 0, "test": 0}
    for p, count in zip(inputs, counts, strict=True):
        into = {}
        for split, o in offsets.items():
            into |= {f"{a}_{split}": out[f"{a}_{split}"][o : o + count[split]] for a in "xy"}
            offsets[split] += count[split]
        # checked like any prepared file, and read straight into its place: no domain is held twice
        load_prepared(p, into=into)
    sizes = {split: [c[split] for c in counts] for split in ("train", "test")}
    meta = {"name": f"domainnet_no_{target}", "num_classes": metas[0]["num_classes"], "classes": metas[0]["classes"],
            "shape": list(shape), "source": HOMEPAGE, "license": LICENSE, "left_out": target, "domains": sources,
            "domain_sizes_train": sizes["train"], "domain_sizes_test": sizes["test"]}
    return out["x_train"], out["y_train"], out["x_test"], out["y_test"], meta
