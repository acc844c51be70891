"""Aggregation-weight policies: which share of the round's update each sampled client gets.

A policy sees the sampled clients' class counts ([m, C]; sizes are their row sums) and the test set's
class distribution (Disco's target "test"), so size-, equal- and discrepancy-aware (Disco) weights share
one signature and any method can use any of them.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from fedrepro.algorithms.disco import disco_weights


def size_weights(counts: np.ndarray, test_dist: np.ndarray) -> np.ndarray:
    """p_k proportional to the client's number of samples (FedAvg's default)."""
    sizes = counts.sum(axis=1).astype(np.float64)
    return sizes / sizes.sum()


def equal_weights(counts: np.ndarray, test_dist: np.ndarray) -> np.ndarray:
    """p_k = 1/m (FedDisco Table 13's baseline)."""
    return np.full(len(counts), 1.0 / len(counts))


WEIGHTINGS: dict[str, Callable[..., np.ndarray]] = {
    "size": size_weights,
    "equal": equal_weights,
    "disco": disco_weights,  # FedDisco, Eq. 3: options a, b, metric, target (see disco.py)
}


def make_weighting(spec: dict, class_counts: np.ndarray,
                   test_counts: np.ndarray) -> Callable[[np.ndarray], np.ndarray]:
    """A policy from its config ``{"kind": ..., **options}`` over clients with ``class_counts`` ([K, C]),
    tested on a set with ``test_counts`` ([C]); the result maps the sampled client ids of a round to their
    weights (summing to 1)."""
    options = dict(spec)
    kind = options.pop("kind")
    if kind not in WEIGHTINGS:
        raise ValueError(f"unknown weighting kind {kind!r}; known: {sorted(WEIGHTINGS)}")
    fn = WEIGHTINGS[kind]
    counts = np.asarray(class_counts, dtype=np.float64)
    test = np.asarray(test_counts, dtype=np.float64)
    test_dist = test / test.sum() if test.sum() > 0 else test  # no test set: only target "test" refuses it
    fn(counts, test_dist, **options)  # bad options fail here, at set-up, not in the first round
    return lambda sampled: fn(counts[sampled], test_dist, **options)
