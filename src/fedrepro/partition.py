"""Client partitions of a labelled data set (numpy only: this module runs in a light rule without torch).

Every scheme takes integer labels ``[N]`` and a ``numpy.random.Generator`` and returns one sorted int64
index array per client. Unless a scheme says otherwise, every sample index appears in exactly one client;
``niid2`` and ``imbalance`` leave some samples in no client (``partition_stats`` reports them as dropped),
as does ``writer`` when it draws fewer writers than the data set has.
A new scheme is one function plus one entry in ``PARTITIONERS``.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from fedrepro.io import atomic_write_npz, atomic_write_text, open_npz

__all__ = [
    "MIN_SIZE",
    "PARTITIONERS",
    "dirichlet_partition",
    "iid_partition",
    "imbalance_partition",
    "load_partition",
    "load_partition_spec",
    "longtail_counts",
    "longtail_test_indices",
    "make_partition",
    "niid2_partition",
    "partition_stats",
    "pathological_partition",
    "save_partition",
    "stratified_subset",
    "writer_partition",
]

MIN_SIZE = 10  # dirichlet and imbalance: the fewest samples a client may get unless the spec says (min_size)


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
    min_size: int = MIN_SIZE,
    max_tries: int = 100,
    balance: bool = True,
    cap: float | None = None,
) -> list[np.ndarray]:
    """Label-skewed split of NIID-Bench / the official FedDisco code (their ``noniid-labeldir``).

    For each class the shuffled indices are split at the cumulative proportions ~ Dir(beta * 1_K). With
    ``balance`` a client that already holds >= ``cap`` samples (default N/K) gets no more (NIID-Bench's
    cap). The whole draw is repeated until every client has >= ``min_size`` samples, at most ``max_tries``
    times.
    """
    labels = _check_inputs(labels, n_clients)
    if beta <= 0:
        raise ValueError(f"beta must be > 0, got {beta}")
    n = len(labels)
    cap = n / n_clients if cap is None else cap
    if cap < n / n_clients:
        raise ValueError(f"cap must be >= N/K = {n / n_clients:g} (else all may be capped), got {cap}")

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
                uncapped = sizes < cap  # never all False as cap >= N/K: the classes not yet dealt are missing
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
    labels: np.ndarray, n_clients: int, classes_per_client: int, rng: np.random.Generator, balance: bool = True
) -> list[np.ndarray]:
    """Each client holds exactly ``classes_per_client`` distinct classes; every class is held by someone.

    Client i first gets class ``i mod C``; its other classes are drawn from ``rng`` among the classes held by
    the fewest clients so far (which guarantees coverage when ``n_clients * k >= C``). Each class's shuffled
    indices are split equally among the clients that hold it, or, with ``balance=False`` (unbalanced
    quantities, as PFLlib's/HtFLlib's ``pat`` split for FedL2G), in proportions drawn uniformly from [0.1, 1)
    per holder and normalised: shares differ up to 10x, and every holder gets at least one sample.
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
        if balance or len(idx) < len(holders):
            chunks = np.array_split(idx, len(holders))
        else:
            share = rng.uniform(0.1, 1.0, len(holders))
            counts = 1 + np.floor((len(idx) - len(holders)) * share / share.sum()).astype(int)
            counts[-1] += len(idx) - counts.sum()
            chunks = np.split(idx, np.cumsum(counts)[:-1])
        for i, chunk in zip(holders, chunks, strict=True):
            parts[i].extend(chunk.tolist())
    return _finish(parts)


def niid2_partition(
    labels: np.ndarray,
    biased: int,
    unbiased: int,
    rng: np.random.Generator,
    classes_per_biased: int | None = None,
) -> list[np.ndarray]:
    """FedDisco's NIID-2: ``biased`` clients holding C/5 classes each, then ``unbiased`` clients holding all C
    classes, every client of the same size S = C * u.

    Biased client i holds the classes at positions (g*i + j) mod C, j < g, with g = ``classes_per_biased``
    (default C/5, the paper; for C = 10 this is the official code's (2i mod 10, 2i+1 mod 10)), and S/g
    samples of each (the first S mod g of its classes one more when g does not divide S). An unbiased client
    holds u samples of every class. u is the largest value every class can supply; with equal class sizes
    and a multiple of C/g biased clients it is the official code's floor(N / C / K). Each class's shuffled
    indices are dealt without replacement; the rest of each class is dropped (in no client).
    Deviation: the official code slices the label-sorted indices at c * (N // C), which is where class c
    starts only when classes are equal; on unequal classes (the digits) its biased clients get a few
    samples of a neighbouring third class and its unbiased client unequal class shares. Here biased clients
    hold exactly their g classes.
    """
    labels = _check_inputs(labels, biased + unbiased)
    if biased < 0 or unbiased < 0:
        raise ValueError(f"niid2_partition: biased and unbiased must be >= 0, got {biased} and {unbiased}")
    classes, avail = np.unique(labels, return_counts=True)
    n_cls = len(classes)
    if classes_per_biased is None:
        if n_cls % 5:
            raise ValueError(
                f"niid2_partition: biased clients hold C/5 classes, but C = {n_cls} is not a multiple of 5; "
                "set classes_per_biased"
            )
        classes_per_biased = n_cls // 5
    g = classes_per_biased
    if not 1 <= g <= n_cls:
        raise ValueError(f"classes_per_biased must be in 1..{n_cls} (number of classes), got {g}")
    held = [[(g * i + j) % n_cls for j in range(g)] for i in range(biased)]

    def amounts(u: int) -> np.ndarray:
        """[clients, C] samples per client and class position when every client holds S = C * u."""
        need = np.zeros((biased + unbiased, n_cls), dtype=np.int64)
        per, extra = divmod(n_cls * u, g)
        for i, mine in enumerate(held):
            need[i, mine] = per + (np.arange(g) < extra)
        need[biased:] = u
        return need

    # Per class a biased holder takes about u*C/g and an unbiased client u: start at that bound, step down
    # past the rounding of S/g.
    rate = np.bincount(np.asarray(held, dtype=np.int64).ravel(), minlength=n_cls) * n_cls / g + unbiased
    u = int(np.min(avail[rate > 0] // rate[rate > 0]))
    while u > 0 and np.any(amounts(u).sum(axis=0) > avail):
        u -= 1
    if u < 1:
        raise ValueError(
            f"niid2_partition({biased} biased + {unbiased} unbiased): too few samples per class (smallest: "
            f"{avail.min()}) to give every client one sample of each class it holds; use fewer clients"
        )
    need = amounts(u)
    parts: list[list[int]] = [[] for _ in range(biased + unbiased)]
    for ci, c in enumerate(classes):
        idx = rng.permutation(np.flatnonzero(labels == c))
        ends = np.cumsum(need[:, ci])
        for k, (a, b) in enumerate(zip(ends - need[:, ci], ends, strict=True)):
            parts[k].extend(idx[a:b].tolist())
    return _finish(parts)


def longtail_counts(n_max: int, rho: float, num_classes: int) -> np.ndarray:
    """n_c = round(n_max * rho^(-c / (C-1))), c = 0..C-1 (Cui et al., 2019; FedDisco's global imbalance)."""
    if rho < 1:
        raise ValueError(f"rho (imbalance ratio) must be >= 1, got {rho}")
    expo = np.arange(num_classes) / max(num_classes - 1, 1)
    counts = np.rint(n_max * float(rho) ** -expo).astype(np.int64)
    if counts.min() < 1:
        raise ValueError(f"n_max={n_max} with rho={rho} leaves the last class without samples; lower rho")
    return counts


def _longtail_subset(
    labels: np.ndarray, rho: float, rng: np.random.Generator, n_max: int | None
) -> np.ndarray:
    classes, avail = np.unique(labels, return_counts=True)
    n_max = int(avail.min()) if n_max is None else n_max
    keep = longtail_counts(n_max, rho, len(classes))
    short = np.flatnonzero(keep > avail)
    if len(short):
        c = short[0]
        raise ValueError(
            f"long-tail subset (n_max={n_max}, rho={rho}) needs {keep[c]} samples of class {classes[c]}, "
            f"which has {avail[c]}; lower n_max"
        )
    chosen = [
        rng.choice(np.flatnonzero(labels == c), k, replace=False) for c, k in zip(classes, keep, strict=True)
    ]
    return np.sort(np.concatenate(chosen)).astype(np.int64)


def longtail_test_indices(
    labels: np.ndarray, rho: float, rng: np.random.Generator, n_max: int | None = None
) -> np.ndarray:
    """Sorted indices of a test subset whose class c (c-th smallest label) keeps
    round(n_max * rho^(-c/(C-1))) samples drawn without replacement; n_max defaults to the smallest class's
    count. FedDisco's Table 5 tests on such a set matching the long-tailed training data."""
    return _longtail_subset(_check_inputs(labels, 1), rho, rng, n_max)


def imbalance_partition(
    labels: np.ndarray,
    n_clients: int,
    rho: float,
    beta: float,
    rng: np.random.Generator,
    n_max: int | None = None,
    min_size: int = MIN_SIZE,
    max_tries: int = 100,
    balance: bool = True,
) -> list[np.ndarray]:
    """FedDisco's global imbalance: keep n_c = round(n_max * rho^(-c/(C-1))) random samples of class c (c-th
    smallest label; n_max defaults to the smallest class's count), then split them by
    :func:`dirichlet_partition`. The other samples are in no client. As in the official code, ``balance``
    caps a client at the *full* training set's N/K, not the subset's."""
    labels = _check_inputs(labels, n_clients)
    kept = _longtail_subset(labels, rho, rng, n_max)
    parts = dirichlet_partition(
        labels[kept], n_clients, beta, rng, min_size=min_size, max_tries=max_tries, balance=balance,
        cap=len(labels) / n_clients,
    )
    return _finish([kept[p] for p in parts])


def partition_stats(parts: list[np.ndarray], labels: np.ndarray, num_classes: int) -> dict[str, Any]:
    """Per-client sizes and class counts, and the samples in no client (``dropped``; JSON-serialisable)."""
    labels = np.asarray(labels)
    counts = [np.bincount(labels[p], minlength=num_classes).tolist() for p in parts]
    dropped = np.bincount(labels, minlength=num_classes) - np.sum(counts, axis=0, dtype=np.int64)
    return {
        "clients": len(parts),
        "sizes": [len(p) for p in parts],
        "class_counts": counts,
        "num_classes": num_classes,
        "dropped": int(dropped.sum()),
        "dropped_class_counts": dropped.tolist(),
    }


def _stats_path(path: Path) -> Path:
    return path.with_suffix(".json") if path.suffix == ".npz" else path.with_name(path.name + ".json")


def save_partition(path: str | os.PathLike, parts: list[np.ndarray], stats: dict, spec: dict) -> None:
    """Write ``parts`` to one .npz (indices, offsets, spec) and ``stats`` + ``spec`` to ``<stem>.json``, each with
    its checksum beside it (fedrepro.io.checksum_path), verified when read back."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    sizes = np.array([len(p) for p in parts], dtype=np.int64)
    offsets = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
    indices = np.concatenate([np.zeros(0, np.int64), *parts]).astype(np.int64)
    spec_json = np.array(json.dumps(spec, sort_keys=True))
    # npz before json: the stats file is the rule's last output, so a killed job leaves it missing
    atomic_write_npz(path, checksum=True, indices=indices, offsets=offsets, spec=spec_json)
    atomic_write_text(_stats_path(path), json.dumps({**stats, "spec": spec}, indent=1, sort_keys=True) + "\n",
                      checksum=True)


def load_partition(path: str | os.PathLike) -> list[np.ndarray]:
    """Read the per-client index arrays written by :func:`save_partition`."""
    with open_npz(path, "partition file") as z:
        indices, offsets = z["indices"], z["offsets"]
    return [indices[a:b].copy() for a, b in zip(offsets[:-1], offsets[1:], strict=True)]


def load_partition_spec(path: str | os.PathLike) -> dict:
    """Read the spec stored in a partition .npz."""
    with open_npz(path, "partition file") as z:
        return json.loads(str(z["spec"]))


def _require(spec: dict, key: str) -> Any:
    if key not in spec:
        raise ValueError(f"partition spec of kind {spec.get('kind')!r} needs key {key!r}; got {sorted(spec)}")
    return spec[key]


def _niid2_split(spec: dict) -> tuple[int, int]:
    """(biased, unbiased) of a niid2 spec: either may be left out; with both out, the paper's 5:1 ratio
    (5 + 1 clients, 50 + 10 for partial participation) gives unbiased = max(1, clients // 6)."""
    clients = _require(spec, "clients")
    biased, unbiased = spec.get("biased"), spec.get("unbiased")
    if biased is None:
        unbiased = max(1, clients // 6) if unbiased is None else unbiased
        biased = clients - unbiased
    elif unbiased is None:
        unbiased = clients - biased
    if biased < 0 or unbiased < 0 or biased + unbiased != clients:
        raise ValueError(
            f"partition spec of kind 'niid2': biased ({biased}) + unbiased ({unbiased}) must equal clients "
            f"({clients}), both >= 0"
        )
    return biased, unbiased


# Adapters from a spec dict to a scheme: one entry per kind.
PARTITIONERS: dict[str, Callable[[np.ndarray, dict, np.random.Generator], list[np.ndarray]]] = {
    "iid": lambda labels, spec, rng: iid_partition(labels, _require(spec, "clients"), rng),
    "dirichlet": lambda labels, spec, rng: dirichlet_partition(
        labels,
        _require(spec, "clients"),
        _require(spec, "beta"),
        rng,
        min_size=spec.get("min_size", MIN_SIZE),
        max_tries=spec.get("max_tries", 100),
        balance=spec.get("balance", True),
    ),
    "pathological": lambda labels, spec, rng: pathological_partition(
        labels, _require(spec, "clients"), _require(spec, "classes_per_client"), rng,
        balance=spec.get("balance", True),
    ),
    "niid2": lambda labels, spec, rng: niid2_partition(
        labels, *_niid2_split(spec), rng, classes_per_biased=spec.get("classes_per_biased")
    ),
    "imbalance": lambda labels, spec, rng: imbalance_partition(
        labels,
        _require(spec, "clients"),
        _require(spec, "rho"),
        _require(spec, "beta"),
        rng,
        n_max=spec.get("n_max"),
        min_size=spec.get("min_size", MIN_SIZE),
        max_tries=spec.get("max_tries", 100),
        balance=spec.get("balance", True),
    ),
}


def domain_partition(domain_sizes: list[int], n_clients: int) -> list[np.ndarray]:
    """One client per domain of a multi-domain data set whose train split holds the domains one after
    the other (``domain_sizes`` samples each, the prepared data set's meta): DomainNet leave-one-out."""
    if n_clients != len(domain_sizes):
        raise ValueError(f"partition kind 'domain': clients ({n_clients}) must equal the number of domains "
                         f"({len(domain_sizes)})")
    bounds = np.cumsum([0, *domain_sizes])
    return _finish([np.arange(bounds[i], bounds[i + 1]) for i in range(len(domain_sizes))])


def writer_partition(groups: np.ndarray, n_clients: int, rng: np.random.Generator) -> list[np.ndarray]:
    """One client per writer (FEMNIST) or person (CelebA), LEAF's natural split: ``groups[i]`` is the id of
    sample i's writer. With as many clients as writers every writer is a client, in id order; with fewer,
    ``n_clients`` writers are drawn from ``rng`` without replacement (in id order too) and the others'
    samples are in no client (the paper's "randomly sample 1000 clients")."""
    groups = _check_inputs(groups, n_clients)
    if len(groups) and groups.min() < 0:
        raise ValueError(f"writer ids must be >= 0, got {groups.min()}")
    ids = np.unique(groups)
    if n_clients > len(ids):
        raise ValueError(f"partition kind 'writer': clients ({n_clients}) exceeds the data set's "
                         f"{len(ids)} writers")
    chosen = ids if n_clients == len(ids) else np.sort(rng.choice(ids, n_clients, replace=False))
    order = np.argsort(groups, kind="stable")  # sample indices grouped by writer id, ascending
    starts = np.searchsorted(groups[order], chosen, side="left")
    ends = np.searchsorted(groups[order], chosen, side="right")
    return _finish([order[a:b] for a, b in zip(starts, ends, strict=True)])


def stratified_subset(labels: np.ndarray, n: int, rng: np.random.Generator) -> np.ndarray:
    """Sorted indices of ``n`` samples drawn without replacement, each class keeping its share of ``labels``
    (largest remainders, so the counts sum to exactly ``n``)."""
    labels = _check_inputs(labels, 1)
    if not 1 <= n <= len(labels):
        raise ValueError(f"samples: {n} must lie in 1..{len(labels)} (the data set's training samples)")
    classes, counts = np.unique(labels, return_counts=True)
    exact = counts * n / len(labels)
    keep = np.floor(exact).astype(int)
    keep[np.argsort(-(exact - keep), kind="stable")[: n - keep.sum()]] += 1
    picked = [rng.choice(np.flatnonzero(labels == c), size=k, replace=False)
              for c, k in zip(classes, keep, strict=True)]
    return np.sort(np.concatenate(picked)).astype(np.int64)


def make_partition(labels: np.ndarray, spec: dict, seed: int, meta: dict | None = None,
                   groups: np.ndarray | None = None) -> list[np.ndarray]:
    """Partition ``labels`` as ``spec["kind"]`` says, driven by ``np.random.default_rng(seed)``; kind
    ``domain`` reads the domains' sizes from the data set's ``meta``, kind ``writer`` the per-sample writer
    ids ``groups`` (the prepared data set's ``groups_train``). With ``spec["samples"]`` only a seeded,
    class-stratified subset of that many samples is partitioned (laptop scale: the paper's clients, fewer
    samples each); indices still point into the full ``labels``. With ``spec["seed"]`` that seed replaces
    ``seed``: every trial of a study then shares one partition (HtFLlib's protocol)."""
    if "seed" in spec:
        seed, spec = spec["seed"], {k: v for k, v in spec.items() if k != "seed"}
    kind = spec.get("kind")
    if spec.get("samples"):
        if kind in ("domain", "writer"):
            raise ValueError(f"partition key 'samples' does not apply to kind {kind!r} (its clients are fixed)")
        # its own stream, so the partition of the subset draws as it would on a data set of that size
        subset = stratified_subset(labels, spec["samples"], np.random.default_rng([seed, 1]))
        rest = {k: v for k, v in spec.items() if k != "samples"}
        return [subset[p] for p in make_partition(np.asarray(labels)[subset], rest, seed, meta, groups)]
    if kind == "domain":
        if not meta or "domain_sizes_train" not in meta:
            raise ValueError("partition kind 'domain' needs a multi-domain data set (meta domain_sizes_train)")
        return domain_partition(meta["domain_sizes_train"], _require(spec, "clients"))
    if kind == "writer":
        if groups is None:
            name = (meta or {}).get("name", "this data set")
            raise ValueError(f"partition kind 'writer' needs a writer/person per sample (array groups_train), "
                             f"which {name} lacks; femnist and celeba_smiling have one")
        if len(groups) != len(labels):
            raise ValueError(f"partition kind 'writer': {len(groups)} writer ids for {len(labels)} samples")
        return writer_partition(groups, _require(spec, "clients"), np.random.default_rng(seed))
    if kind not in PARTITIONERS:
        known = ", ".join(sorted([*PARTITIONERS, "domain", "writer"]))
        raise ValueError(f"unknown partition kind {kind!r}; known kinds: {known}")
    return PARTITIONERS[kind](labels, spec, np.random.default_rng(seed))
