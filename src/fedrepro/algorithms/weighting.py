"""Aggregation-weight policies: which share of the update each sampled client gets."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np


def size_weights(sizes: np.ndarray, class_counts: np.ndarray) -> np.ndarray:
    """p_k proportional to the client's number of samples (FedAvg's default)."""
    sizes = np.asarray(sizes, dtype=np.float64)
    return sizes / sizes.sum()


def equal_weights(sizes: np.ndarray, class_counts: np.ndarray) -> np.ndarray:
    """p_k = 1/K (FedDisco Table 13's baseline)."""
    return np.full(len(sizes), 1.0 / len(sizes))


WEIGHTINGS: dict[str, Callable[..., np.ndarray]] = {"size": size_weights, "equal": equal_weights}


def make_weighting(spec: dict) -> Callable[[np.ndarray, np.ndarray], np.ndarray]:
    """A policy from its config ``{"kind": ..., **options}``; called with the sampled clients' sizes
    and class counts ([m, C]) each round."""
    spec = dict(spec)
    kind = spec.pop("kind")
    if kind not in WEIGHTINGS:
        raise ValueError(f"unknown weighting kind {kind!r}; known: {sorted(WEIGHTINGS)}")
    fn = WEIGHTINGS[kind]
    return lambda sizes, counts: fn(sizes, counts, **spec)
