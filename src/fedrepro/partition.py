"""Client partitions of a labelled data set (numpy only: this module runs in a light rule without torch).

Every scheme takes integer labels ``[N]`` and a ``numpy.random.Generator`` and returns one sorted int64
index array per client. Unless a scheme says otherwise, every sample index appears in exactly one client.
A new scheme is one function plus one entry in ``PARTITIONERS``.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

__all__ = [
    "PARTITIONERS",
    "dirichlet_partition",
    "iid_partition",
    "load_partition",
    "load_partition_spec",
    "make_partition",
    "partition_stats",
    "pathological_partition",
    "save_partition",
]


def _check_inputs(labels: np.ndarray, n_clients: int) -> np.ndarray:
    labels = np.asarray(labels)
    if labels.ndim != 1 or not np.issubdtype(labels.dtype, np.integer):
        raise ValueError(f"labels must be a 1-D integer array, got shape {labels.shape} dtype {labels.dtype}")
    if n_clients < 1:
        raise ValueError(f"n_clients must be >= 1, got {n_clients}")
    return labels


def _finish(parts: list[np.ndarray] | list[list[int]]) -> list[np.ndarray]:
    # Sorted int64 indices make partitions comparable across schemes and cheap to slice on load.
    return [np.sort(np.asarray(p, dtype=np.int64)) for p in parts]


def iid_partition(labels: np.ndarray, n_clients: int, rng: np.random.Generator) -> list[np.ndarray]:
    """Shuffle all samples and split them into ``n_clients`` parts whose sizes differ by at most one."""
    labels = _check_inputs(labels, n_clients)
    return _finish(np.array_split(rng.permutation(len(labels)), n_clients))


def dirichlet_partition(
    labels: np.ndarray,
    n_clients: int,
    beta: float,
    rng: np.random.Generator,
    min_size: int = 10,
    max_tries: int = 100,
    balance: bool = True,
) -> list[np.ndarray]:
    """Label-skewed split of NIID-Bench / the official FedDisco code (their ``noniid-labeldir``).

    For each class the shuffled indices are split at the cumulative proportions ~ Dir(beta * 1_K). With
    ``balance`` a client that already holds >= N/K samples gets no more (NIID-Bench's cap). The whole draw
    is repeated until every client has >= ``min_size`` samples, at most ``max_tries`` times.
    """
    labels = _check_inputs(labels, n_clients)
    if beta <= 0:
        raise ValueError(f"beta must be > 0, got {beta}")
    n = len(labels)

    def fail(reason: str) -> ValueError:
        return ValueError(
            f"dirichlet_partition(beta={beta}, n_clients={n_clients}, min_size={min_size}): {reason} "
            f"(N={n}); lower min_size or raise beta"
        )

    # Impossible whatever the draw: fail at once instead of after max_tries futile draws.
    if n_clients * min_size > n:
        raise fail(f"even an equal split gives only {n // n_clients} samples per client")
    classes = np.unique(labels)
    smallest = 0
    for _ in range(max_tries):
        parts: list[list[int]] = [[] for _ in range(n_clients)]
        sizes = np.zeros(n_clients, dtype=np.int64)
        for c in classes:
            idx = np.flatnonzero(labels == c)
            rng.shuffle(idx)
            p = rng.dirichlet(np.full(n_clients, beta))
            if balance:
                uncapped = sizes < n / n_clients  # never all False: the classes not yet dealt are missing
                p = p * uncapped
                # For tiny beta all mass may sit on capped clients (the rest underflow to 0); NIID-Bench
                # would divide by zero there, we split evenly among the uncapped clients instead.
                if p.sum() <= 0:
                    p = uncapped.astype(float)
            cuts = (np.cumsum(p / p.sum()) * len(idx)).astype(int)[:-1]
            for k, chunk in enumerate(np.split(idx, cuts)):
                parts[k].extend(chunk.tolist())
                sizes[k] += len(chunk)
        smallest = int(sizes.min())
        if smallest >= min_size:
            return _finish(parts)
    raise fail(f"smallest client has {smallest} samples after {max_tries} tries")


def pathological_partition(
    labels: np.ndarray, n_clients: int, classes_per_client: int, rng: np.random.Generator
) -> list[np.ndarray]:
    """Each client holds exactly ``classes_per_client`` distinct classes; every class is held by someone.

    Client i first gets class ``i mod C``; its other classes are drawn from ``rng`` among the classes held by
    the fewest clients so far (which guarantees coverage when ``n_clients * k >= C``). Each class's shuffled
    indices are split equally among the clients that hold it.
    """
    labels = _check_inputs(labels, n_clients)
    classes = np.unique(labels)
    n_cls, k = len(classes), classes_per_client
    if not 1 <= k <= n_cls:
        raise ValueError(f"classes_per_client must be in 1..{n_cls} (number of classes), got {k}")
    if n_clients * k < n_cls:
        raise ValueError(
            f"pathological_partition: n_clients * classes_per_client = {n_clients} * {k} < {n_cls} classes, "
            "so some class would be held by no client; raise n_clients or classes_per_client"
        )
    held = np.zeros(n_cls, dtype=np.int64)
    owned: list[list[int]] = []
    for i in range(n_clients):
        mine = [i % n_cls]
        held[i % n_cls] += 1
        owned.append(mine)
    for mine in owned:
        for _ in range(k - 1):
            free = np.setdiff1d(np.arange(n_cls), mine)
            least = free[held[free] == held[free].min()]
            c = int(rng.choice(least))
            mine.append(c)
            held[c] += 1
    parts: list[list[int]] = [[] for _ in range(n_clients)]
    for ci, c in enumerate(classes):
        holders = [i for i, mine in enumerate(owned) if ci in mine]
        idx = rng.permutation(np.flatnonzero(labels == c))
        for i, chunk in zip(holders, np.array_split(idx, len(holders)), strict=True):
            parts[i].extend(chunk.tolist())
    return _finish(parts)


def partition_stats(parts: list[np.ndarray], labels: np.ndarray, num_classes: int) -> dict[str, Any]:
    """Per-client sizes and class counts (JSON-serialisable)."""
    labels = np.asarray(labels)
    counts = [np.bincount(labels[p], minlength=num_classes).tolist() for p in parts]
    return {
        "clients": len(parts),
        "sizes": [len(p) for p in parts],
        "class_counts": counts,
        "num_classes": num_classes,
    }


def _atomic_write(path: Path, write: Callable[[Any], None], mode: str) -> None:
    # Temp file in the target directory so os.replace is a same-filesystem atomic rename: a killed job
    # never leaves a half-written file that Snakemake would take for a finished output.
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, mode) as f:
            write(f)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _stats_path(path: Path) -> Path:
    return path.with_suffix(".json") if path.suffix == ".npz" else path.with_name(path.name + ".json")


def save_partition(path: str | os.PathLike, parts: list[np.ndarray], stats: dict, spec: dict) -> None:
    """Write ``parts`` to one .npz (indices, offsets, spec) and ``stats`` + ``spec`` to ``<stem>.json``."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    sizes = np.array([len(p) for p in parts], dtype=np.int64)
    offsets = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
    indices = np.concatenate([np.zeros(0, np.int64), *parts]).astype(np.int64)
    spec_json = np.array(json.dumps(spec, sort_keys=True))
    _atomic_write(path, lambda f: np.savez(f, indices=indices, offsets=offsets, spec=spec_json), "wb")
    text = json.dumps({**stats, "spec": spec}, indent=1, sort_keys=True) + "\n"
    _atomic_write(_stats_path(path), lambda f: f.write(text), "w")


def load_partition(path: str | os.PathLike) -> list[np.ndarray]:
    """Read the per-client index arrays written by :func:`save_partition`."""
    with np.load(path, allow_pickle=False) as z:
        indices, offsets = z["indices"], z["offsets"]
    return [indices[a:b].copy() for a, b in zip(offsets[:-1], offsets[1:], strict=True)]


def load_partition_spec(path: str | os.PathLike) -> dict:
    """Read the spec stored in a partition .npz."""
    with np.load(path, allow_pickle=False) as z:
        return json.loads(str(z["spec"]))


def _require(spec: dict, key: str) -> Any:
    if key not in spec:
        raise ValueError(f"partition spec of kind {spec.get('kind')!r} needs key {key!r}; got {sorted(spec)}")
    return spec[key]


# Adapters from a spec dict to a scheme: one entry per kind.
PARTITIONERS: dict[str, Callable[[np.ndarray, dict, np.random.Generator], list[np.ndarray]]] = {
    "iid": lambda labels, spec, rng: iid_partition(labels, _require(spec, "clients"), rng),
    "dirichlet": lambda labels, spec, rng: dirichlet_partition(
        labels,
        _require(spec, "clients"),
        _require(spec, "beta"),
        rng,
        min_size=spec.get("min_size", 10),
        max_tries=spec.get("max_tries", 100),
        balance=spec.get("balance", True),
    ),
    "pathological": lambda labels, spec, rng: pathological_partition(
        labels, _require(spec, "clients"), _require(spec, "classes_per_client"), rng
    ),
}


def make_partition(labels: np.ndarray, spec: dict, seed: int) -> list[np.ndarray]:
    """Partition ``labels`` as ``spec["kind"]`` says, driven by ``np.random.default_rng(seed)``."""
    kind = spec.get("kind")
    if kind not in PARTITIONERS:
        raise ValueError(f"unknown partition kind {kind!r}; known kinds: {', '.join(sorted(PARTITIONERS))}")
    return PARTITIONERS[kind](labels, spec, np.random.default_rng(seed))
