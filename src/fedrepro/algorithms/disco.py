"""FedDisco's discrepancy-aware aggregation weights (Ye et al., ICML 2023, Eq. 3); numpy only.

    p_k = ReLU(n_k - a * d_k + b) / sum_m ReLU(n_m - a * d_m + b),   d_k = e(D_k, T)

over the clients sampled in a round: n_k is the client's share of the round's samples, D_k its class
distribution, T the target distribution: uniform 1/C, or, when training and test data are both imbalanced
(the paper's Table 5, "the real global distribution"), the test set's class distribution, which is what the
official code uses (main.py there: ``global_dist`` is the long-tailed test distribution when ``test_imb``
is set, else uniform), not the pooled training distribution. As in the official code (``disco.py`` there):
KL is KL(D_k || T) with 0 log 0 = 0, normalised over the sampled clients to sum to 1; L1, L2 and the cosine
distance 1 - cos(D_k, T) are used as they are.

Deviation: when every ReLU term is zero the official code fails (its ``new_weight`` is never assigned, an
UnboundLocalError); here the weights fall back to the size weights n_k, i.e. FedAvg's.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

__all__ = ["METRICS", "TARGETS", "disco_weights", "discrepancy"]


def _kl(dist: np.ndarray, target: np.ndarray) -> np.ndarray:
    if np.any((dist > 0) & (target <= 0)):
        raise ValueError("disco: KL(D_k || T) is infinite: a client holds a class the target gives no mass")
    safe_target = np.where(target > 0, target, 1.0)
    with np.errstate(divide="ignore", invalid="ignore"):
        terms = np.where(dist > 0, dist * np.log(dist / safe_target), 0.0)  # 0 log 0 = 0
    kl = terms.sum(axis=1)
    total = kl.sum()
    return np.zeros_like(kl) if total == 0 else kl / total


def _cosine(dist: np.ndarray, target: np.ndarray) -> np.ndarray:
    return 1.0 - dist @ target / (np.linalg.norm(dist, axis=1) * np.linalg.norm(target))


METRICS: dict[str, Callable[[np.ndarray, np.ndarray], np.ndarray]] = {
    "kl": _kl,
    "l1": lambda dist, target: np.abs(dist - target).sum(axis=1),
    "l2": lambda dist, target: np.sqrt(((dist - target) ** 2).sum(axis=1)),
    "cosine": _cosine,
}
TARGETS = ("uniform", "test")
# target names no longer accepted -> why (configs and callers get this instead of a bare "unknown")
RENAMED_TARGETS = {"global": "renamed 'test': T is the test set's class distribution, as in the official "
                             "code, not the clients' pooled training distribution the old name meant"}


def _choice(what: str, value: str, choices) -> None:
    if what == "target" and value in RENAMED_TARGETS:
        raise ValueError(f"disco target {value!r} was {RENAMED_TARGETS[value]}")
    if value not in choices:
        raise ValueError(f"unknown disco {what} {value!r}; choices: {sorted(choices)}")


def discrepancy(counts: np.ndarray, target: np.ndarray, metric: str = "kl") -> np.ndarray:
    """d_k = e(D_k, T) for each row of ``counts`` ([m, C] class counts) against ``target`` ([C])."""
    _choice("metric", metric, METRICS)
    counts = np.asarray(counts, dtype=np.float64)
    sizes = counts.sum(axis=1)
    if np.any(sizes <= 0):
        raise ValueError("disco: a sampled client holds no samples, so it has no class distribution")
    return METRICS[metric](counts / sizes[:, None], np.asarray(target, dtype=np.float64))


def disco_weights(
    counts: np.ndarray,
    test_dist: np.ndarray,
    a: float = 0.5,
    b: float = 0.1,
    metric: str = "kl",
    target: str = "uniform",
) -> np.ndarray:
    """Eq. 3 for the sampled clients' class counts ``counts`` ([m, C]); weights [m], >= 0, summing to 1.

    ``target`` "uniform" compares each client with 1/C, "test" with ``test_dist`` (the test set's class
    distribution, or counts; normalised here). Defaults a=0.5, b=0.1 are the official code's (the paper
    recommends a in 0.4..0.6, b=0.1).
    """
    _choice("metric", metric, METRICS)
    _choice("target", target, TARGETS)
    counts = np.asarray(counts, dtype=np.float64)
    if counts.ndim != 2 or len(counts) == 0:
        raise ValueError(f"disco: counts must be a non-empty [clients, classes] array, got {counts.shape}")
    n_classes = counts.shape[1]
    if target == "uniform":
        t = np.full(n_classes, 1.0 / n_classes)
    else:
        t = np.asarray(test_dist, dtype=np.float64)
        if t.shape != (n_classes,) or t.sum() <= 0:
            raise ValueError(f"disco: target 'test' needs the test set's class distribution, a non-zero "
                             f"[{n_classes}] vector; got shape {t.shape}, sum {t.sum()}")
        t = t / t.sum()
    d = discrepancy(counts, t, metric)
    sizes = counts.sum(axis=1)
    n = sizes / sizes.sum()
    p = np.maximum(n - a * d + b, 0.0)
    total = p.sum()
    return n if total <= 0 else p / total
