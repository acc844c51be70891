"""FedDisco's discrepancy-aware weights (Eq. 3): hand-computed examples, properties, the engine's hook."""

from __future__ import annotations

import math
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from fedrepro.algorithms.disco import disco_weights
from fedrepro.algorithms.weighting import WEIGHTINGS, make_weighting

# Three clients, four classes. Sizes 40, 40, 20 -> n = (0.4, 0.4, 0.2).
#   A: uniform (0.25 each)  B: (0.5, 0.3, 0.2, 0)  C: (0, 0, 0.5, 0.5);   target T = 0.25 each.
COUNTS = np.array([[10, 10, 10, 10], [20, 12, 8, 0], [0, 0, 10, 10]])
UNIFORM = np.full(4, 0.25)
N = (0.4, 0.4, 0.2)
A, B = 0.3, 0.05  # not the defaults (0.5, 0.1)


def eq3(d: tuple[float, float, float]) -> list[float]:
    """Eq. 3 by hand: ReLU(n_k - a d_k + b), normalised."""
    relu = [max(n - A * dk + B, 0.0) for n, dk in zip(N, d, strict=True)]
    return [r / sum(relu) for r in relu]


def kl_by_hand() -> tuple[float, float, float]:
    # KL(D || T) = sum_c D_c log(D_c / T_c), 0 log 0 = 0; then divided by the sum over the clients.
    kl_b = 0.5 * math.log(0.5 / 0.25) + 0.3 * math.log(0.3 / 0.25) + 0.2 * math.log(0.2 / 0.25)
    kl_c = 0.5 * math.log(0.5 / 0.25) + 0.5 * math.log(0.5 / 0.25)
    total = 0.0 + kl_b + kl_c
    return (0.0, kl_b / total, kl_c / total)


HAND = {
    "kl": kl_by_hand(),
    # |0.5-0.25| + |0.3-0.25| + |0.2-0.25| + |0-0.25| = 0.6;  C: 4 * 0.25 = 1.0
    "l1": (0.0, 0.6, 1.0),
    "l2": (0.0, math.sqrt(0.25**2 + 0.05**2 + 0.05**2 + 0.25**2), math.sqrt(4 * 0.25**2)),
    # 1 - D.T / (|D| |T|) with D.T = 0.25 for every distribution and |T| = 0.5
    "cosine": (
        0.0,
        1 - 0.25 / (math.sqrt(0.5**2 + 0.3**2 + 0.2**2) * 0.5),
        1 - 0.25 / (math.sqrt(0.5**2 + 0.5**2) * 0.5),
    ),
}


@pytest.mark.parametrize("metric", sorted(HAND))
def test_eq3_by_hand(metric: str) -> None:
    p = disco_weights(COUNTS, UNIFORM, a=A, b=B, metric=metric)
    np.testing.assert_allclose(p, eq3(HAND[metric]), rtol=1e-12)
    assert np.all(p >= 0) and p.sum() == pytest.approx(1.0)


def test_hand_example_values() -> None:
    # The hand example itself, spelled out once: L1 clips client C to zero, so A and B share 0.45 : 0.27.
    np.testing.assert_allclose(eq3(HAND["l1"]), [0.45 / 0.72, 0.27 / 0.72, 0.0])
    p = disco_weights(COUNTS, UNIFORM, a=A, b=B, metric="l1")
    assert p[2] == 0.0


def test_kl_matches_official_formula() -> None:
    # The official code: scipy.special.kl_div(D, T) summed over classes, divided by the sum over clients.
    special = pytest.importorskip("scipy.special")
    dist = COUNTS / COUNTS.sum(axis=1, keepdims=True)
    kl = special.kl_div(dist, UNIFORM).sum(axis=1)
    d = kl / kl.sum()
    n = COUNTS.sum(axis=1) / COUNTS.sum()
    relu = np.maximum(n - 0.5 * d + 0.1, 0)
    np.testing.assert_allclose(disco_weights(COUNTS, UNIFORM), relu / relu.sum(), rtol=1e-12)


@pytest.mark.parametrize("metric", sorted(HAND))
def test_more_discrepancy_less_weight(metric: str) -> None:
    # A and B have the same size; B is further from uniform.
    p = disco_weights(COUNTS, UNIFORM, metric=metric)
    assert p[0] > p[1]


def test_random_counts_give_a_distribution() -> None:
    rng = np.random.default_rng(0)
    for metric in HAND:
        for _ in range(20):
            counts = rng.integers(0, 50, size=(7, 5)) + (rng.random((7, 5)) < 0.2)
            counts[:, 0] += 1  # no empty client
            a, b = rng.uniform(0, 2), rng.uniform(0, 0.4)
            p = disco_weights(counts, np.full(5, 0.2), a=a, b=b, metric=metric)
            assert p.shape == (7,) and np.all(p >= 0) and p.sum() == pytest.approx(1.0)


def test_identical_clients_keep_size_weights() -> None:
    # Every client uniform: all discrepancies 0 (KL's normaliser is 0: the official code's zeros), so
    # p = (n + b) / (1 + m b).
    counts = np.array([[5, 5], [10, 10], [25, 25]])
    n = np.array([10, 20, 50]) / 80
    np.testing.assert_allclose(disco_weights(counts, np.full(2, 0.5), b=0.1), (n + 0.1) / (1 + 3 * 0.1))


def test_test_target_differs_from_uniform() -> None:
    skewed = np.array([0.7, 0.1, 0.1, 0.1])
    counts = np.array([[70, 10, 10, 10], [25, 25, 25, 25], [10, 30, 30, 30]])
    uni = disco_weights(counts, skewed, target="uniform")
    test = disco_weights(counts, skewed, target="test")
    assert not np.allclose(uni, test)
    assert np.argmax(uni) == 1  # the uniform client wins against T = 1/C
    assert np.argmax(test) == 0  # the client matching the test distribution wins against T = test
    # test_dist need not be normalised
    np.testing.assert_allclose(disco_weights(counts, 10 * skewed, target="test"), test)


def test_all_relu_zero_falls_back_to_size_weights() -> None:
    # a = 10 pushes every n_k - a d_k + b below zero (the official code fails here).
    counts = np.array([[20, 12, 8, 0], [0, 0, 10, 10]])
    p = disco_weights(counts, UNIFORM, a=10.0, b=0.0, metric="l1")
    np.testing.assert_allclose(p, [40 / 60, 20 / 60])


def test_unknown_metric_or_target() -> None:
    with pytest.raises(ValueError, match=r"metric 'kll'.*\['cosine', 'kl', 'l1', 'l2'\]"):
        disco_weights(COUNTS, UNIFORM, metric="kll")
    with pytest.raises(ValueError, match=r"target 'tset'.*\['test', 'uniform'\]"):
        disco_weights(COUNTS, UNIFORM, target="tset")
    # the old name says what replaced it (it meant the training distribution, which the code never used)
    with pytest.raises(ValueError, match=r"target 'global' was renamed 'test': T is the test set's"):
        disco_weights(COUNTS, UNIFORM, target="global")


def test_make_weighting_engine_signature() -> None:
    # The engine builds the policy once from all clients' class counts and the test set's, then calls it with
    # sampled ids.
    class_counts = np.array([[10, 10, 10, 10], [20, 12, 8, 0], [0, 0, 10, 10], [40, 0, 0, 0], [5, 5, 5, 25]])
    test_counts = np.array([60, 30, 20, 10])  # long-tailed, unlike the clients' pooled training data
    assert WEIGHTINGS["disco"] is disco_weights
    policy = make_weighting({"kind": "disco", "a": A, "b": B, "metric": "l2"}, class_counts, test_counts)
    sampled = np.array([0, 1, 2])
    np.testing.assert_allclose(policy(sampled), eq3(HAND["l2"]), rtol=1e-12)
    # target "test" is the test set's class distribution (the official code's), not the training data's
    policy = make_weighting({"kind": "disco", "target": "test"}, class_counts, test_counts)
    sampled = np.array([1, 3])
    expected = disco_weights(class_counts[sampled], test_counts / test_counts.sum(), target="test")
    np.testing.assert_allclose(policy(sampled), expected)
    pooled_train = class_counts.sum(0) / class_counts.sum()
    assert not np.allclose(policy(sampled), disco_weights(class_counts[sampled], pooled_train, target="test"))
    assert policy(np.arange(5)).sum() == pytest.approx(1.0)
    # bad options fail when the policy is built, not in the first round; so does T = test without a test set
    with pytest.raises(ValueError, match="metric 'l3'"):
        make_weighting({"kind": "disco", "metric": "l3"}, class_counts, test_counts)
    with pytest.raises(ValueError, match="target 'test' needs the test set's class distribution"):
        make_weighting({"kind": "disco", "target": "test"}, class_counts, np.zeros(4))
    make_weighting({"kind": "size"}, class_counts, np.zeros(4))  # the others do not need one


def test_the_engine_gives_disco_the_test_sets_class_distribution(small_data) -> None:
    import dataclasses

    from fedrepro.algorithms import build_algorithm
    from fedrepro.models import build_model
    from fedrepro.sim.sync import FederatedRun, TrainingConfig

    # a long-tailed test set: class c keeps about 1 / (c + 1) of its samples
    y = small_data.y_test.numpy()
    keep = np.concatenate([np.flatnonzero(y == c)[: max(1, int((y == c).sum() / (c + 1)))] for c in range(10)])
    data = dataclasses.replace(small_data, x_test=small_data.x_test[keep], y_test=small_data.y_test[keep])
    labels = small_data.y_train.numpy()
    parts = [np.flatnonzero(labels % 3 == r) for r in range(3)]
    run = FederatedRun(build_model("simple_cnn", data.shape, 10), build_algorithm("fedavg"), data, parts,
                       TrainingConfig(rounds=1), {"kind": "disco", "target": "test"}, seed=0)
    counts = np.stack([np.bincount(labels[p], minlength=10) for p in parts])
    test_dist = np.bincount(y[keep], minlength=10) / len(keep)
    np.testing.assert_allclose(run.weighting(np.arange(3)), disco_weights(counts, test_dist, target="test"))


def test_weighting_and_disco_do_not_import_torch() -> None:
    # fedrepro/algorithms/__init__.py discovers the (torch) methods, so load the package as a bare namespace
    # and check what weighting.py and disco.py themselves import.
    src = Path(__file__).resolve().parents[2] / "src"
    code = (
        "import sys, types\n"
        "pkg = types.ModuleType('fedrepro.algorithms')\n"
        f"pkg.__path__ = [{str(src / 'fedrepro' / 'algorithms')!r}]\n"
        "sys.modules['fedrepro.algorithms'] = pkg\n"
        "import fedrepro.algorithms.weighting as w\n"
        "assert w.WEIGHTINGS['disco'].__module__ == 'fedrepro.algorithms.disco'\n"
        "assert 'torch' not in sys.modules, 'torch imported'\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, env={**os.environ, "PYTHONPATH": str(src)})
