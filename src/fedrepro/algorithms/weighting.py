"""Aggregation-weight policies: which share of the round's update each sampled client gets.

A policy sees the sampled clients' class counts ([m, C]; sizes are their row sums) and the test set's
class distribution (Disco's target "test"), so size-, equal- and discrepancy-aware (Disco) weights share
one signature and any method can use any of them.

Two probes of FedDisco's Fig. 2 weight clients by who they are instead: ``pair`` aggregates
(1 - r) w_A + r w_B of one pair of clients chosen by a fixed rule from the partition (``client_pairs``),
``single`` keeps one client's model alone (a one-hot weight). Both see every client's class counts and
the sampled client ids, and need every client they name sampled (join_ratio 1).
"""

from __future__ import annotations

import itertools
from collections.abc import Callable

import numpy as np

from fedrepro.algorithms.disco import disco_weights, discrepancy


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

# Fig. 2 measures discrepancy as the l2 distance of a client's class distribution to the uniform one
PROBE_METRIC = "l2"
PAIR_SIZE_TOLERANCE = 0.1


def client_discrepancy(class_counts: np.ndarray) -> np.ndarray:
    """Each client's l2 distance from the uniform class distribution (FedDisco Sec. 3, Fig. 2(d))."""
    counts = np.asarray(class_counts, dtype=np.float64)
    return discrepancy(counts, np.full(counts.shape[1], 1.0 / counts.shape[1]), PROBE_METRIC)


def client_pairs(class_counts: np.ndarray, size_tolerance: float = PAIR_SIZE_TOLERANCE) -> list[tuple[int, int]]:
    """Disjoint pairs (A, B) of clients of similar size, most different in discrepancy first (Fig. 2(b)).

    A pair is similar in size when its sizes differ by at most ``size_tolerance`` of the larger one; those
    come first, by discrepancy gap (largest first), then the rest by size gap (smallest first), ties by
    client ids. Pairs are taken greedily in that order, skipping any that shares a client with one taken,
    so the trials are independent. Within a pair A is the client farther from uniform: the paper's
    model B, the better one, gets weight r.
    """
    counts = np.asarray(class_counts, dtype=np.float64)
    sizes, disc = counts.sum(axis=1), client_discrepancy(counts)

    def order(pair: tuple[int, int]) -> tuple:
        a, b = pair
        size_gap = abs(sizes[a] - sizes[b]) / max(sizes[a], sizes[b])
        similar = size_gap <= size_tolerance
        return (not similar, -abs(disc[a] - disc[b]) if similar else size_gap, a, b)

    taken: list[tuple[int, int]] = []
    used: set[int] = set()
    for a, b in sorted(itertools.combinations(range(len(counts)), 2), key=order):
        if a in used or b in used:
            continue
        used |= {a, b}
        taken.append((a, b) if disc[a] >= disc[b] else (b, a))
    return taken


def _ids_sampled(needed: list[int], sampled: np.ndarray, kind: str) -> None:
    missing = sorted(set(needed) - set(np.asarray(sampled).tolist()))
    if missing:
        raise ValueError(f"{kind} weighting: client(s) {missing} were not sampled this round; "
                         "it needs every client it weights in every round (join_ratio 1)")


def pair_weights(sampled: np.ndarray, class_counts: np.ndarray, pair: int, r: float,
                 size_tolerance: float = PAIR_SIZE_TOLERANCE) -> np.ndarray:
    """1 - r on client A and r on client B of the ``pair``-th pair of ``client_pairs``, 0 elsewhere."""
    if not 0.0 <= r <= 1.0:
        raise ValueError(f"pair weighting: r must lie in [0, 1], got {r}")
    pairs = client_pairs(class_counts, size_tolerance)
    if not 0 <= pair < len(pairs):
        raise ValueError(f"pair weighting: pair {pair} does not exist; {len(class_counts)} clients make "
                         f"{len(pairs)} disjoint pairs (0..{len(pairs) - 1})")
    a, b = pairs[pair]
    _ids_sampled([a, b], sampled, "pair")
    ids = np.asarray(sampled).tolist()
    weights = np.zeros(len(ids))
    weights[ids.index(a)] += 1.0 - r
    weights[ids.index(b)] += r
    return weights


def single_weights(sampled: np.ndarray, class_counts: np.ndarray, client: int) -> np.ndarray:
    """All weight on ``client``: the aggregate is that client's own model (Fig. 2(c, d))."""
    if not 0 <= client < len(class_counts):
        raise ValueError(f"single weighting: client {client} does not exist (clients 0..{len(class_counts) - 1})")
    _ids_sampled([client], sampled, "single")
    weights = np.zeros(len(sampled))
    weights[np.asarray(sampled).tolist().index(client)] = 1.0
    return weights


# policies that weight clients by id: (sampled ids, every client's class counts, **options)
ID_WEIGHTINGS: dict[str, Callable[..., np.ndarray]] = {"pair": pair_weights, "single": single_weights}


def make_weighting(spec: dict, class_counts: np.ndarray,
                   test_counts: np.ndarray) -> Callable[[np.ndarray], np.ndarray]:
    """A policy from its config ``{"kind": ..., **options}`` over clients with ``class_counts`` ([K, C]),
    tested on a set with ``test_counts`` ([C]); the result maps the sampled client ids of a round to their
    weights (summing to 1)."""
    options = dict(spec)
    kind = options.pop("kind")
    counts = np.asarray(class_counts, dtype=np.float64)
    if kind in ID_WEIGHTINGS:
        by_id = ID_WEIGHTINGS[kind]
        try:
            by_id(np.arange(len(counts)), counts, **options)  # bad options fail here, at set-up
        except TypeError as err:  # an option missing or unknown
            raise ValueError(f"{kind} weighting {spec}: {err}") from None
        return lambda sampled: by_id(sampled, counts, **options)
    if kind not in WEIGHTINGS:
        raise ValueError(f"unknown weighting kind {kind!r}; known: {sorted([*WEIGHTINGS, *ID_WEIGHTINGS])}")
    fn = WEIGHTINGS[kind]
    test = np.asarray(test_counts, dtype=np.float64)
    test_dist = test / test.sum() if test.sum() > 0 else test  # no test set: only target "test" refuses it
    fn(counts, test_dist, **options)  # bad options fail here, at set-up, not in the first round
    return lambda sampled: fn(counts[sampled], test_dist, **options)
