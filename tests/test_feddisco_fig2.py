"""FedDisco Fig. 2's probes (issue #16): the `pair` and `single` weighting kinds, their schema, the study's
sweeps and the `weight_probe` figure kind."""

from __future__ import annotations

import numpy as np
import pytest

from fedrepro.algorithms.weighting import client_discrepancy, client_pairs, make_weighting

# six clients of 10 classes: sizes 100, 100, 104, 100, 60, 200; discrepancy to uniform from 0 (client 0)
# to a single class (client 1)
COUNTS = np.array([
    [10] * 10,                       # 100, uniform: d = 0
    [100] + [0] * 9,                 # 100, one class: the largest d
    [52, 52] + [0] * 8,              # 104, two classes
    [20] * 5 + [0] * 5,              # 100, five classes
    [6] * 10,                        # 60, uniform
    [20] * 10,                       # 200, uniform
])


def test_discrepancy_is_l2_to_uniform() -> None:
    d = client_discrepancy(COUNTS)
    assert d[0] == pytest.approx(0.0) and d[4] == pytest.approx(0.0)
    assert d[1] == pytest.approx(np.sqrt(0.9**2 + 9 * 0.01))
    assert d[1] > d[2] > d[3] > d[0]


def test_pairs_are_similar_in_size_largest_discrepancy_gap_first_and_disjoint() -> None:
    pairs = client_pairs(COUNTS)
    # similar-size (within 10%) pairs among 0..3, by gap: (0, 1) 0.95, (1, 3) ... -> greedy disjoint:
    # (1, 0) first (A = the one farther from uniform), then the best pair of 2 and 3
    assert pairs[0] == (1, 0)
    assert pairs[1] == (2, 3)
    # the dissimilar-size clients 4 (60) and 5 (200) pair last
    assert pairs[2] == (4, 5) or pairs[2] == (5, 4)
    assert sorted(c for p in pairs for c in p) == list(range(6))
    # the same counts give the same pairs (no randomness)
    assert client_pairs(COUNTS.copy()) == pairs


def test_a_wider_size_tolerance_admits_more_pairs() -> None:
    # within 70%, client 2 (two classes) may pair with the uniform client 4 (60 samples, 42% fewer), a larger
    # discrepancy gap than client 3's; client 3 is left with client 5 (50% larger)
    assert client_pairs(COUNTS, size_tolerance=0.7) == [(1, 0), (2, 4), (3, 5)]


def test_pair_weights_put_1_minus_r_on_a_and_r_on_b() -> None:
    weigh = make_weighting({"kind": "pair", "pair": 0, "r": 0.3}, COUNTS)
    w = weigh(np.arange(6))
    assert w.tolist() == pytest.approx([0.3, 0.7, 0, 0, 0, 0])  # A = client 1, B = client 0
    assert make_weighting({"kind": "pair", "pair": 1, "r": 1.0}, COUNTS)(np.arange(6)).tolist() == [0, 0, 0, 1, 0, 0]
    assert make_weighting({"kind": "pair", "pair": 1, "r": 0.0}, COUNTS)(np.arange(6)).tolist() == [0, 0, 1, 0, 0, 0]


def test_single_weights_are_one_hot() -> None:
    w = make_weighting({"kind": "single", "client": 4}, COUNTS)(np.arange(6))
    assert w.tolist() == [0, 0, 0, 0, 1, 0]


def test_probe_weightings_refuse_bad_options_at_set_up_and_unsampled_clients() -> None:
    with pytest.raises(ValueError, match="pair 3 does not exist"):
        make_weighting({"kind": "pair", "pair": 3, "r": 0.5}, COUNTS)
    with pytest.raises(ValueError, match="r must lie in"):
        make_weighting({"kind": "pair", "pair": 0, "r": 1.5}, COUNTS)
    with pytest.raises(ValueError, match="pair weighting"):
        make_weighting({"kind": "pair", "r": 0.5}, COUNTS)  # no pair
    with pytest.raises(ValueError, match="client 6 does not exist"):
        make_weighting({"kind": "single", "client": 6}, COUNTS)
    weigh = make_weighting({"kind": "single", "client": 4}, COUNTS)
    with pytest.raises(ValueError, match=r"client\(s\) \[4\] were not sampled"):
        weigh(np.array([0, 1, 2]))


def test_schema_takes_each_kinds_own_options_only() -> None:
    from fedrepro.config import ConfigError, validate

    def method(weighting: dict) -> dict:
        return {"settings": {"s": {"dataset": "d", "model": "m", "partition": {"kind": "iid", "clients": 2}}},
                "methods": {"m": {"algorithm": "fedavg", "weighting": weighting}},
                "grid": [{"settings": ["s"], "methods": ["m"]}]}

    validate(method({"kind": "pair", "pair": 1, "r": 0.2}), "study", "t")
    validate(method({"kind": "single", "client": 3}), "study", "t")
    with pytest.raises(ConfigError, match="weighting"):
        validate(method({"kind": "single", "r": 0.2}), "study", "t")
    with pytest.raises(ConfigError, match="weighting"):
        validate(method({"kind": "disco", "client": 1}), "study", "t")
    with pytest.raises(ConfigError, match="weighting"):
        validate(method({"kind": "size", "a": 0.5}), "study", "t")
    with pytest.raises(ConfigError, match="weighting"):
        validate(method({"kind": "pair", "pair": 0, "r": 1.2}), "study", "t")
