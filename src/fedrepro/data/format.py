"""The prepared data set format: one .npz file with train/test arrays and a JSON `meta` record.

Arrays: ``x_train``/``x_test`` (uint8 images [N, H, W, C]), ``y_train``/``y_test`` (int64 [N]) and
``meta``, a 0-d str array holding JSON with the keys name, num_classes, classes, shape, source, sha256
(and optionally license). Optional per-sample int64 arrays (``EXTRA_ARRAYS``) may follow: labels the
partition is drawn over when they are not the training labels (CIFAR-100's fine labels under its 20
superclasses) and the writer/person of each sample (FEMNIST, CelebA). The file is read without pickle.
Its sha256 lies beside it in ``<file>.sha256`` (fedrepro.io), checked on every read.
This module must stay free of torch: light Snakemake rules import it.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from fedrepro.io import atomic_write_npz, open_npz, read_npz_into

ARRAY_KEYS = ("x_train", "y_train", "x_test", "y_test")
REQUIRED_META = ("name", "num_classes", "classes", "shape", "source")
# optional per-sample arrays -> the split they follow: int64, one non-negative value per sample
EXTRA_ARRAYS = {
    "partition_labels_train": "train",  # the labels a label-skew partition is drawn over (default y_train)
    "partition_labels_test": "test",
    "groups_train": "train",  # the writer / person of each sample (partition kind ``writer``)
    "groups_test": "test",
}


class PreparedFormatError(ValueError):
    """A prepared .npz file (or the arrays about to be written) breaks the format."""


@dataclass(frozen=True, eq=False)
class Prepared:
    """A loaded prepared data set (eq=False: arrays do not compare as a single bool)."""

    x_train: np.ndarray
    y_train: np.ndarray
    x_test: np.ndarray
    y_test: np.ndarray
    meta: dict[str, Any]
    extras: dict[str, np.ndarray] = field(default_factory=dict)  # present EXTRA_ARRAYS by name

    @property
    def num_classes(self) -> int:
        """Number of classes as recorded in meta."""
        return int(self.meta["num_classes"])


def arrays_sha256(x_train: np.ndarray, y_train: np.ndarray, x_test: np.ndarray, y_test: np.ndarray,
                  extras: Mapping[str, np.ndarray] | None = None) -> str:
    """Hex SHA-256 over the four arrays, in a fixed order, each as name, dtype, shape and C-order bytes,
    then over the extra arrays in name order (none: the digest of the four alone, as before extras).

    dtype and shape are hashed too, so that the same bytes reshaped or reinterpreted do not collide.
    """
    h = hashlib.sha256()
    named = [*zip(ARRAY_KEYS, (x_train, y_train, x_test, y_test), strict=True), *sorted((extras or {}).items())]
    for key, arr in named:
        arr = np.ascontiguousarray(arr)
        h.update(f"{key}|{arr.dtype.str}|{arr.shape}|".encode())
        h.update(arr.data)
    return h.hexdigest()


def _check(x_train: np.ndarray, y_train: np.ndarray, x_test: np.ndarray, y_test: np.ndarray,
           meta: dict[str, Any], where: str) -> None:
    missing = [k for k in REQUIRED_META if k not in meta]
    if missing:
        raise PreparedFormatError(f"{where}: meta lacks {missing}")
    if len(meta["classes"]) != meta["num_classes"]:
        raise PreparedFormatError(f"{where}: {len(meta['classes'])} class names for "
                                  f"num_classes={meta['num_classes']}")
    for split, x, y in (("train", x_train, y_train), ("test", x_test, y_test)):
        # images are uint8 pixels; text is token ids, as small an integer type as the vocabulary allows
        x_types = (np.uint16, np.int32) if meta.get("kind") == "text" else (np.uint8,)
        if x.dtype not in x_types or y.dtype != np.int64:
            raise PreparedFormatError(f"{where}: x_{split} must be {'/'.join(t.__name__ for t in x_types)} "
                                      f"and y_{split} int64, got {x.dtype} and {y.dtype}")
        if y.ndim != 1 or len(x) != len(y):
            raise PreparedFormatError(f"{where}: x_{split} has {len(x)} rows, y_{split} shape {y.shape}")
        if list(x.shape[1:]) != list(meta["shape"]):
            raise PreparedFormatError(f"{where}: x_{split} samples have shape {list(x.shape[1:])}, "
                                      f"meta says {meta['shape']}")
        if len(y) and (y.min() < 0 or y.max() >= meta["num_classes"]):
            raise PreparedFormatError(f"{where}: y_{split} outside 0..{meta['num_classes'] - 1}")


def _check_extras(extras: Mapping[str, np.ndarray], rows: dict[str, int], where: str) -> None:
    unknown = sorted(set(extras) - set(EXTRA_ARRAYS))
    if unknown:
        raise PreparedFormatError(f"{where}: unknown extra arrays {unknown}; allowed: {sorted(EXTRA_ARRAYS)}")
    for key, arr in extras.items():
        n = rows[EXTRA_ARRAYS[key]]
        if arr.dtype != np.int64 or arr.ndim != 1 or len(arr) != n:
            raise PreparedFormatError(f"{where}: {key} must be int64 with one value per {EXTRA_ARRAYS[key]} "
                                      f"sample ({n}), got {arr.dtype} shape {arr.shape}")
        if len(arr) and arr.min() < 0:
            raise PreparedFormatError(f"{where}: {key} has negative values (min {arr.min()})")


def _as_int64(values: Any) -> np.ndarray:
    # integer ids are stored as little-endian int64 like the labels; anything else fails _check_extras
    arr = np.asarray(values)
    return arr.astype("<i8") if np.issubdtype(arr.dtype, np.integer) else arr


def save_prepared(path: Path | str, x_train: np.ndarray, y_train: np.ndarray, x_test: np.ndarray,
                  y_test: np.ndarray, meta: dict[str, Any],
                  extras: Mapping[str, np.ndarray] | None = None) -> dict[str, Any]:
    """Validate, fill ``meta['sha256']`` and write the .npz atomically; return the meta written.

    ``extras``: optional per-sample arrays named in ``EXTRA_ARRAYS`` (stored as little-endian int64).
    """
    path = Path(path)
    # Labels are stored as little-endian int64 whatever the parser produced, so the digest is portable.
    y_train = np.asarray(y_train, dtype="<i8")
    y_test = np.asarray(y_test, dtype="<i8")
    x_train, x_test = np.asarray(x_train), np.asarray(x_test)
    meta = {**meta, "shape": [int(s) for s in meta["shape"]]} if "shape" in meta else dict(meta)
    extras = {k: _as_int64(v) for k, v in (extras or {}).items()}
    _check(x_train, y_train, x_test, y_test, meta, str(path))
    _check_extras(extras, {"train": len(y_train), "test": len(y_test)}, str(path))
    meta["sha256"] = arrays_sha256(x_train, y_train, x_test, y_test, extras)
    # atomic: a killed job never leaves a half-written .npz that a later rule would trust; its checksum beside it
    # is verified on every read (open_npz), by readers that take only the meta or labels too
    atomic_write_npz(path, checksum=True, x_train=x_train, y_train=y_train, x_test=x_test, y_test=y_test,
                     meta=np.array(json.dumps(meta, sort_keys=True)), **extras)
    return meta


def load_prepared(path: Path | str, into: Mapping[str, np.ndarray] | None = None) -> Prepared:
    """Load a prepared .npz, checking its file checksum, keys and arrays' sha256; errors name the file.

    ``into``: arrays by key (of ``ARRAY_KEYS``; e.g. slices of larger arrays) to read those arrays into in
    place of new ones (``read_npz_into``)."""
    path = Path(path)
    into = into or {}
    with open_npz(path, "prepared data set") as z:
        missing = [k for k in (*ARRAY_KEYS, "meta") if k not in z.files]
        if missing:
            raise PreparedFormatError(f"{path}: not a prepared data set, missing arrays {missing}")
        try:
            arrays = {k: read_npz_into(z, k, into[k]) if k in into else z[k] for k in ARRAY_KEYS}
        except ValueError as e:
            raise PreparedFormatError(f"{path}: {e}") from e
        extras = {k: z[k] for k in EXTRA_ARRAYS if k in z.files}
        meta = json.loads(str(z["meta"][()]))
    if "sha256" not in meta:
        raise PreparedFormatError(f"{path}: meta has no sha256")
    _check(*arrays.values(), meta, str(path))
    _check_extras(extras, {"train": len(arrays["y_train"]), "test": len(arrays["y_test"])}, str(path))
    actual = arrays_sha256(*arrays.values(), extras)
    if actual != meta["sha256"]:
        raise PreparedFormatError(f"{path}: sha256 mismatch (meta says {meta['sha256']}, arrays hash to "
                                  f"{actual}); the file is corrupt, delete it and prepare it again")
    return Prepared(**arrays, meta=meta, extras=extras)
