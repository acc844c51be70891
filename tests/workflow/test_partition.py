"""Client partition schemes: coverage, sizes, skew, reproducibility, errors, persistence."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from fedrepro.partition import (
    dirichlet_partition,
    iid_partition,
    load_partition,
    load_partition_spec,
    longtail_counts,
    longtail_test_indices,
    make_partition,
    niid2_partition,
    partition_stats,
    pathological_partition,
    save_partition,
    stratified_subset,
)

C = 10


@pytest.fixture
def labels() -> np.ndarray:
    # 2,000 samples, 10 classes, mildly unequal class sizes (as real data sets).
    rng = np.random.default_rng(123)
    return rng.choice(C, size=2000, p=np.linspace(1, 2, C) / np.linspace(1, 2, C).sum())


def assert_exact_cover(parts: list[np.ndarray], n: int) -> None:
    for p in parts:
        assert p.dtype == np.int64
        assert np.all(np.diff(p) > 0), "indices must be sorted and unique within a client"
    allidx = np.concatenate(parts)
    assert len(allidx) == n
    assert np.array_equal(np.sort(allidx), np.arange(n))


def mean_label_entropy(parts: list[np.ndarray], labels: np.ndarray) -> float:
    ents = []
    for p in parts:
        q = np.bincount(labels[p], minlength=C) / len(p)
        q = q[q > 0]
        ents.append(-(q * np.log(q)).sum())
    return float(np.mean(ents))


SPECS = [
    {"kind": "iid", "clients": 7},
    {"kind": "dirichlet", "clients": 10, "beta": 0.5, "min_size": 10},
    {"kind": "dirichlet", "clients": 10, "beta": 0.1, "min_size": 5, "balance": False},
    {"kind": "pathological", "clients": 10, "classes_per_client": 2},
    {"kind": "pathological", "clients": 4, "classes_per_client": 3},
]


@pytest.mark.parametrize("spec", SPECS, ids=lambda s: "-".join(f"{v}" for v in s.values()))
def test_every_sample_exactly_once(labels: np.ndarray, spec: dict) -> None:
    parts = make_partition(labels, spec, seed=0)
    assert len(parts) == spec["clients"]
    assert_exact_cover(parts, len(labels))


def test_iid_sizes_differ_by_at_most_one(labels: np.ndarray) -> None:
    sizes = [len(p) for p in iid_partition(labels, 7, np.random.default_rng(0))]
    assert max(sizes) - min(sizes) <= 1
    assert sum(sizes) == len(labels)


def test_dirichlet_reproducible(labels: np.ndarray) -> None:
    spec = {"kind": "dirichlet", "clients": 10, "beta": 0.5}
    a, b = make_partition(labels, spec, 1), make_partition(labels, spec, 1)
    assert all(np.array_equal(x, y) for x, y in zip(a, b, strict=True))
    c = make_partition(labels, spec, 2)
    assert not all(np.array_equal(x, y) for x, y in zip(a, c, strict=True))


def test_dirichlet_min_size_and_skew(labels: np.ndarray) -> None:
    rng = np.random.default_rng(0)
    skewed = dirichlet_partition(labels, 10, 0.1, rng, min_size=20)
    assert min(len(p) for p in skewed) >= 20
    flat = dirichlet_partition(labels, 10, 100.0, np.random.default_rng(0))
    iid = iid_partition(labels, 10, np.random.default_rng(0))
    h_skew, h_flat, h_iid = (mean_label_entropy(p, labels) for p in (skewed, flat, iid))
    # log(10) = 2.30 for uniform labels; beta = 0.1 leaves each client with ~2-3 dominant classes.
    assert h_iid > 2.2 and h_flat > 2.1
    assert h_skew < 0.6 * h_iid


def test_dirichlet_balance_caps_client_size(labels: np.ndarray) -> None:
    # NIID-Bench's cap: a client at >= N/K stops receiving, so no client can exceed N/K + one class.
    parts = dirichlet_partition(labels, 10, 0.1, np.random.default_rng(5), min_size=1)
    biggest_class = np.bincount(labels).max()
    assert max(len(p) for p in parts) < len(labels) / 10 + biggest_class


def test_dirichlet_impossible_min_size_raises(labels: np.ndarray) -> None:
    with pytest.raises(ValueError, match="min_size=500"):
        dirichlet_partition(labels, 10, 0.5, np.random.default_rng(0), min_size=500)
    # Feasible in total, but beta is so small that no draw reaches it: fails after max_tries.
    with pytest.raises(ValueError, match=r"min_size=150.*lower min_size or raise beta"):
        dirichlet_partition(labels, 10, 0.01, np.random.default_rng(0), min_size=150, max_tries=5)


def test_pathological_classes(labels: np.ndarray) -> None:
    for n_clients, k in [(10, 2), (4, 3), (25, 4), (3, 10)]:
        parts = pathological_partition(labels, n_clients, k, np.random.default_rng(n_clients))
        held = [set(np.unique(labels[p]).tolist()) for p in parts]
        assert all(len(h) == k for h in held), (n_clients, k, held)
        assert set().union(*held) == set(range(C))
        assert_exact_cover(parts, len(labels))


def test_pathological_equal_split_within_class(labels: np.ndarray) -> None:
    parts = pathological_partition(labels, 10, 2, np.random.default_rng(0))
    counts = np.array(partition_stats(parts, labels, C)["class_counts"])
    for c in range(C):
        nz = counts[:, c][counts[:, c] > 0]
        assert nz.max() - nz.min() <= 1


def test_pathological_unbalanced_keeps_classes_and_varies_quantities(labels: np.ndarray) -> None:
    """FedL2G's `pat` split with unbalanced quantities: the same classes per client as the balanced split,
    every sample placed once, but a class's holders get shares that differ (up to 10x), none empty."""
    balanced = pathological_partition(labels, 20, 2, np.random.default_rng(3))
    parts = pathological_partition(labels, 20, 2, np.random.default_rng(3), balance=False)
    assert [set(np.unique(labels[p])) for p in parts] == [set(np.unique(labels[p])) for p in balanced]
    assert_exact_cover(parts, len(labels))
    counts = np.array(partition_stats(parts, labels, C)["class_counts"])
    spreads = [counts[:, c][counts[:, c] > 0].max() / counts[:, c][counts[:, c] > 0].min() for c in range(C)]
    assert min(counts[counts > 0]) >= 1 and max(spreads) > 2 and max(spreads) < 10 * 1.5


def test_pathological_errors(labels: np.ndarray) -> None:
    with pytest.raises(ValueError, match="n_clients \\* classes_per_client"):
        pathological_partition(labels, 3, 3, np.random.default_rng(0))
    with pytest.raises(ValueError, match="classes_per_client"):
        pathological_partition(labels, 20, 11, np.random.default_rng(0))


def test_unknown_kind_lists_kinds(labels: np.ndarray) -> None:
    with pytest.raises(ValueError, match="dirichlet, domain, iid, imbalance, niid2, pathological"):
        make_partition(labels, {"kind": "bogus", "clients": 3}, 0)
    with pytest.raises(ValueError, match="'beta'"):
        make_partition(labels, {"kind": "dirichlet", "clients": 3}, 0)


def test_stats(labels: np.ndarray) -> None:
    parts = make_partition(labels, {"kind": "pathological", "clients": 5, "classes_per_client": 2}, 0)
    stats = partition_stats(parts, labels, C)
    assert stats["clients"] == 5 and stats["num_classes"] == C
    assert stats["sizes"] == [len(p) for p in parts]
    assert np.array_equal(np.sum(stats["class_counts"], axis=0), np.bincount(labels, minlength=C))
    json.dumps(stats)


def test_save_load_round_trip(labels: np.ndarray, tmp_path: Path) -> None:
    spec = {"kind": "dirichlet", "clients": 6, "beta": 0.3, "min_size": 10}
    parts = make_partition(labels, spec, 3)
    stats = partition_stats(parts, labels, C)
    path = tmp_path / "parts" / "seed3.npz"
    save_partition(path, parts, stats, spec)
    loaded = load_partition(path)
    assert len(loaded) == len(parts)
    assert all(np.array_equal(a, b) and b.dtype == np.int64 for a, b in zip(parts, loaded, strict=True))
    assert load_partition_spec(path) == spec
    side = json.loads((tmp_path / "parts" / "seed3.json").read_text())
    assert side["spec"] == spec and side["sizes"] == stats["sizes"]
    # Atomic writes leave no temp files behind.
    assert sorted(os.listdir(path.parent)) == ["seed3.json", "seed3.json.sha256", "seed3.npz", "seed3.npz.sha256"]


def test_partition_does_not_import_torch() -> None:
    src = Path(__file__).resolve().parents[2] / "src"
    env = {**os.environ, "PYTHONPATH": str(src)}
    code = "import fedrepro.partition, sys; assert 'torch' not in sys.modules, 'torch imported'"
    subprocess.run([sys.executable, "-c", code], check=True, env=env)


# ----- FedDisco: NIID-2 and global imbalance


def assert_disjoint_sorted(parts: list[np.ndarray]) -> np.ndarray:
    for p in parts:
        assert p.dtype == np.int64 and np.all(np.diff(p) > 0)
    allidx = np.concatenate(parts)
    assert len(np.unique(allidx)) == len(allidx), "a sample is in two clients"
    return allidx


def test_niid2_structure(labels: np.ndarray) -> None:
    parts = make_partition(labels, {"kind": "niid2", "clients": 6, "biased": 5, "unbiased": 1}, seed=0)
    assert len(parts) == 6
    held = [np.unique(labels[p]).tolist() for p in parts]
    # the official code's pairs: biased client i holds (2i mod 10, 2i+1 mod 10); the last client holds all
    assert held[:5] == [[0, 1], [2, 3], [4, 5], [6, 7], [8, 9]]
    assert held[5] == list(range(C))
    assert len({len(p) for p in parts}) == 1, "all clients have the same size"
    allidx = assert_disjoint_sorted(parts)
    counts = np.array(partition_stats(parts, labels, C)["class_counts"])
    u = counts[5, 0]
    assert np.all(counts[5] == u), "the unbiased client is exactly uniform"
    assert all(counts[i, 2 * i] == counts[i, 2 * i + 1] == 5 * u for i in range(5))
    # u is the largest every class can supply (each class: one biased client x 5u + one unbiased x u)
    assert u == np.bincount(labels).min() // 6
    stats = partition_stats(parts, labels, C)
    assert stats["dropped"] == len(labels) - len(allidx) > 0
    assert np.array_equal(stats["dropped_class_counts"], np.bincount(labels, minlength=C) - 6 * u)


def test_niid2_official_sizes() -> None:
    # CIFAR-10-like: 5,000 per class. 5+1 clients: shard floor(5000/6) = 833, every client 10 x 833 samples.
    labels = np.random.default_rng(0).permutation(np.repeat(np.arange(C), 5000))
    parts = make_partition(labels, {"kind": "niid2", "clients": 6}, seed=0)
    assert [len(p) for p in parts] == [8330] * 6
    assert partition_stats(parts, labels, C)["dropped_class_counts"] == [2] * C
    # partial participation, 50 biased + 10 unbiased (the default split of 60): floor(5000/60) = 83
    parts = make_partition(labels, {"kind": "niid2", "clients": 60}, seed=0)
    assert {len(p) for p in parts} == {830}
    held = [np.unique(labels[p]).tolist() for p in parts]
    assert held[:50] == [[2 * (i % 5), 2 * (i % 5) + 1] for i in range(50)]
    assert all(h == list(range(C)) for h in held[50:])
    assert_disjoint_sorted(parts)


def test_niid2_other_class_counts() -> None:
    # CIFAR-100: C/5 = 20 classes per biased client.
    labels = np.repeat(np.arange(100), 60)
    parts = niid2_partition(labels, 5, 1, np.random.default_rng(0))
    held = [np.unique(labels[p]).tolist() for p in parts]
    assert held[:5] == [list(range(20 * i, 20 * i + 20)) for i in range(5)]
    assert {len(p) for p in parts} == {1000}
    # AG News: 4 classes, 4 biased clients with 2 classes + 1 with all 4; C/5 is not defined, so say it.
    labels = np.repeat(np.arange(4), 300)
    with pytest.raises(ValueError, match="classes_per_biased"):
        make_partition(labels, {"kind": "niid2", "clients": 5, "unbiased": 1}, 0)
    parts = make_partition(labels, {"kind": "niid2", "clients": 5, "unbiased": 1, "classes_per_biased": 2}, 0)
    assert [np.unique(labels[p]).tolist() for p in parts] == [[0, 1], [2, 3], [0, 1], [2, 3], [0, 1, 2, 3]]
    assert {len(p) for p in parts} == {240}
    assert_disjoint_sorted(parts)


def test_niid2_spec_errors(labels: np.ndarray) -> None:
    with pytest.raises(ValueError, match=r"biased \(5\) \+ unbiased \(2\) must equal clients \(6\)"):
        make_partition(labels, {"kind": "niid2", "clients": 6, "biased": 5, "unbiased": 2}, 0)
    with pytest.raises(ValueError, match="too few samples per class"):
        make_partition(labels, {"kind": "niid2", "clients": 600}, 0)


def test_longtail_counts() -> None:
    counts = longtail_counts(5000, 20, 10)
    assert counts[0] == 5000 and counts[-1] == 250  # the paper's example
    expected = [round(5000 * 20 ** (-c / 9)) for c in range(10)]
    assert counts.tolist() == expected
    assert np.all(np.diff(counts) < 0)
    assert longtail_counts(100, 1, 10).tolist() == [100] * 10
    with pytest.raises(ValueError, match="rho"):
        longtail_counts(100, 0.5, 10)


@pytest.mark.parametrize("rho", [2, 10, 50])
def test_imbalance_partition(rho: float) -> None:
    labels = np.random.default_rng(1).permutation(np.repeat(np.arange(C), 500))
    spec = {"kind": "imbalance", "clients": 10, "rho": rho, "beta": 0.5, "min_size": 5}
    parts = make_partition(labels, spec, seed=0)
    assert len(parts) == 10 and min(len(p) for p in parts) >= 5
    allidx = assert_disjoint_sorted(parts)
    per_class = np.bincount(labels[allidx], minlength=C)
    # class c keeps round(n_max rho^(-c/(C-1))) samples, n_max = 500 (the smallest class)
    np.testing.assert_allclose(per_class, 500 * rho ** (-np.arange(C) / (C - 1)), atol=0.5)
    assert per_class[0] == 500 and abs(per_class[0] / rho - per_class[-1]) <= 1
    stats = partition_stats(parts, labels, C)
    assert stats["dropped"] == len(labels) - per_class.sum()
    # Dirichlet over clients: label-skewed, unlike an even split of the same samples
    counts = np.array(stats["class_counts"], dtype=float)
    shares = counts / counts.sum(axis=0)  # each class's split over the clients
    assert np.mean(np.abs(shares - 0.1).sum(axis=0)) > 0.5
    assert np.array_equal(np.concatenate(make_partition(labels, spec, seed=0)), np.concatenate(parts))


def test_imbalance_defaults_and_errors(labels: np.ndarray) -> None:
    # n_max defaults to the smallest class's count, so rho = 1 truncates every class to it
    parts = make_partition(labels, {"kind": "imbalance", "clients": 4, "rho": 1, "beta": 1.0}, 0)
    per_class = np.bincount(labels[np.concatenate(parts)], minlength=C)
    assert np.all(per_class == np.bincount(labels).min())
    spec = {"kind": "imbalance", "clients": 4, "rho": 10, "beta": 1.0, "n_max": 100}
    parts = make_partition(labels, spec, 0)
    per_class = np.bincount(labels[np.concatenate(parts)], minlength=C)
    assert per_class.tolist() == longtail_counts(100, 10, C).tolist()
    with pytest.raises(ValueError, match="lower n_max"):
        make_partition(labels, {**spec, "n_max": 10_000}, 0)
    with pytest.raises(ValueError, match="'rho'"):
        make_partition(labels, {"kind": "imbalance", "clients": 4, "beta": 1.0}, 0)


def test_dirichlet_cap_below_even_share_rejected(labels: np.ndarray) -> None:
    with pytest.raises(ValueError, match="cap must be >= N/K"):
        dirichlet_partition(labels, 10, 0.5, np.random.default_rng(0), cap=100)


@pytest.mark.parametrize("rho", [1, 10, 50])
def test_longtail_test_indices(rho: float) -> None:
    labels = np.random.default_rng(2).permutation(np.repeat(np.arange(C), 100))
    idx = longtail_test_indices(labels, rho, np.random.default_rng(0))
    assert idx.dtype == np.int64 and np.all(np.diff(idx) > 0)
    assert np.bincount(labels[idx], minlength=C).tolist() == longtail_counts(100, rho, C).tolist()
    other = longtail_test_indices(labels, rho, np.random.default_rng(1))
    assert rho == 1 or not np.array_equal(idx, other)  # a random subset, not the first samples of each class


def test_stratified_subset_keeps_class_shares() -> None:
    labels = np.repeat(np.arange(4), [400, 300, 200, 100])
    sub = stratified_subset(labels, 100, np.random.default_rng(0))
    assert len(sub) == len(np.unique(sub)) == 100
    assert np.bincount(labels[sub]).tolist() == [40, 30, 20, 10]
    with pytest.raises(ValueError, match="samples: 1001"):
        stratified_subset(labels, 1001, np.random.default_rng(0))


@pytest.mark.parametrize("spec", [{"kind": "dirichlet", "clients": 5, "beta": 0.5},
                                  {"kind": "niid2", "clients": 6, "biased": 5, "unbiased": 1}])
def test_partition_of_a_sample_subset(spec: dict) -> None:
    labels = np.repeat(np.arange(10), 300)
    parts = make_partition(labels, {**spec, "samples": 1000}, seed=3)
    flat = np.concatenate(parts)
    assert len(flat) == len(np.unique(flat)) and len(flat) <= 1000
    # the clients' samples come from the stratified subset, indices into the full label array
    subset = stratified_subset(labels, 1000, np.random.default_rng([3, 1]))
    assert np.isin(flat, subset).all()
    again = make_partition(labels, {**spec, "samples": 1000}, seed=3)
    assert [p.tolist() for p in parts] == [p.tolist() for p in again]
    with pytest.raises(ValueError, match="does not apply to kind 'writer'"):
        make_partition(labels, {"kind": "writer", "clients": 2, "samples": 10}, seed=0, groups=labels)


def test_a_partition_seed_gives_every_trial_one_partition_subset_included():
    labels = np.arange(2000) % C
    spec = {"kind": "dirichlet", "clients": 6, "beta": 0.5, "samples": 900}

    def draw(run_seed, **extra):
        return [p.tolist() for p in make_partition(labels, {**spec, **extra}, run_seed)]

    assert draw(0, seed=5) == draw(1, seed=5) == draw(5)  # HtFLlib's trials read one generated split
    assert draw(0) != draw(1)  # unset: each seed draws its own partition
