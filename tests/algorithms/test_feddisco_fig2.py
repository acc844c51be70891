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
TEST = np.full(10, 100)  # the test set's class counts (only Disco's target 'test' reads them)


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
    weigh = make_weighting({"kind": "pair", "pair": 0, "r": 0.3}, COUNTS, TEST)
    w = weigh(np.arange(6))
    assert w.tolist() == pytest.approx([0.3, 0.7, 0, 0, 0, 0])  # A = client 1, B = client 0
    pure = make_weighting({"kind": "pair", "pair": 1, "r": 1.0}, COUNTS, TEST)
    assert pure(np.arange(6)).tolist() == [0, 0, 0, 1, 0, 0]
    pure = make_weighting({"kind": "pair", "pair": 1, "r": 0.0}, COUNTS, TEST)
    assert pure(np.arange(6)).tolist() == [0, 0, 1, 0, 0, 0]


def test_single_weights_are_one_hot() -> None:
    w = make_weighting({"kind": "single", "client": 4}, COUNTS, TEST)(np.arange(6))
    assert w.tolist() == [0, 0, 0, 0, 1, 0]


def test_probe_weightings_refuse_bad_options_at_set_up_and_unsampled_clients() -> None:
    with pytest.raises(ValueError, match="pair 3 does not exist"):
        make_weighting({"kind": "pair", "pair": 3, "r": 0.5}, COUNTS, TEST)
    with pytest.raises(ValueError, match="r must lie in"):
        make_weighting({"kind": "pair", "pair": 0, "r": 1.5}, COUNTS, TEST)
    with pytest.raises(ValueError, match="pair weighting"):
        make_weighting({"kind": "pair", "r": 0.5}, COUNTS, TEST)  # no pair
    with pytest.raises(ValueError, match="client 6 does not exist"):
        make_weighting({"kind": "single", "client": 6}, COUNTS, TEST)
    weigh = make_weighting({"kind": "single", "client": 4}, COUNTS, TEST)
    with pytest.raises(ValueError, match=r"client\(s\) \[4\] were not sampled"):
        weigh(np.array([0, 1, 2]))


def test_schema_takes_each_kinds_own_options_only() -> None:
    from fedrepro.config import validate
    from fedrepro.study import ConfigError

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


# ---------------------------------------------------------------- the study file


@pytest.fixture(scope="module")
def study() -> dict:
    from support.common import REPO

    from fedrepro.config import load_yaml, resolve_config

    return resolve_config(load_yaml(REPO / "config" / "paper.yaml"))["studies"]["feddisco"]


def test_paper_study_runs_33_pair_and_10_single_one_round_probes_on_cifar10_niid1(study) -> None:
    from fedrepro.report.figure_kinds import weight_probe_cells
    from fedrepro.study import grid_runs, run_spec

    probes = [(s, m) for s, m in grid_runs(study) if m.startswith(("fedavg-pair-", "fedavg-single-"))]
    assert len(probes) == 43 and {s for s, _ in probes} == {"c10-niid1"}
    spec = run_spec(study, "c10-niid1", "fedavg-pair-pair2-r0.7")
    assert spec["weighting"] == {"kind": "pair", "pair": 2, "r": 0.7}
    assert spec["training"]["rounds"] == 1 and spec["training"]["local_epochs"] == 10
    assert spec["training"]["join_ratio"] == 1
    assert run_spec(study, "c10-niid1", "fedavg-single-client9")["weighting"] == {"kind": "single", "client": 9}
    cells = weight_probe_cells(study, study["figures"]["fig2"])
    assert len(cells["pairs"]) == 33 and sorted({c["r"] for c in cells["pairs"]}) == [i / 10 for i in range(11)]
    assert [c["client"] for c in cells["clients"]] == list(range(10))
    assert cells["seeds"] == study["seeds"]


def _study_with(raw_edit) -> None:
    import copy

    from support.common import REPO

    from fedrepro.config import load_yaml, resolve_config

    raw = load_yaml(REPO / "config" / "studies" / "feddisco.yaml")
    raw = copy.deepcopy(raw)
    raw_edit(raw)
    resolve_config({"scale": "paper", "results_dir": "results/paper", "studies": {"feddisco": raw}})


def test_probe_runs_that_may_miss_their_clients_or_name_absent_ones_are_refused() -> None:
    from fedrepro.study import ConfigError

    def partial(raw):
        raw["methods"]["fedavg-single"]["training"]["join_ratio"] = 0.5

    def too_many(raw):
        raw["methods"]["fedavg-single"]["sweep"]["weighting.client"] = [0, 10]

    def no_such_pair(raw):
        raw["methods"]["fedavg-pair"]["sweep"]["weighting.pair"] = [0, 5]

    def wrong_sweep(raw):
        raw["figures"]["fig2"]["single_sweep"] = "fedavg-pair"

    for edit, message in ((partial, "join_ratio 1"), (too_many, "client 10 does not exist"),
                          (no_such_pair, "pair 5 does not exist"), (wrong_sweep, "single_sweep sweeps exactly")):
        with pytest.raises(ConfigError, match=message):
            _study_with(edit)


# ---------------------------------------------------------------- the figure


def probe_inputs(seeds=(0, 1)):
    """A weight_probe spec, summary and partition stats of 6 clients (COUNTS, rows rotated per seed)."""
    import pandas as pd

    pairs = [{"method": f"pair{p}-r{r}", "pair": p, "r": r} for p in (0, 1) for r in (0.0, 0.5, 1.0)]
    clients = [{"method": f"single{k}", "client": k} for k in range(6)]
    spec = {"name": "fig2", "kind": "weight_probe", "caption": "Fig. 2 (synthetic)", "metric": "final_acc",
            "setting": "s", "pairs": pairs, "clients": clients, "seeds": list(seeds), "seed": seeds[0]}
    stats = {seed: {"clients": 6, "num_classes": 10, "class_counts": np.roll(COUNTS, seed, axis=0).tolist()}
             for seed in seeds}
    rows = []
    for seed in seeds:
        d = client_discrepancy(np.roll(COUNTS, seed, axis=0))
        for c in clients:  # accuracy falls with discrepancy
            rows.append({"setting": "s", "method": c["method"], "seed": seed, "status": "complete",
                         "final_acc": 60.0 - 30.0 * d[c["client"]]})
        for c in pairs:  # peaks at r = 0.5 for pair 0, at r = 1 for pair 1
            peak = 0.5 if c["pair"] == 0 else 1.0
            rows.append({"setting": "s", "method": c["method"], "seed": seed, "status": "complete",
                         "final_acc": 50.0 - 20.0 * abs(c["r"] - peak) + seed})
    rows.append({"setting": "s", "method": "single0", "seed": 7, "status": "complete", "final_acc": 1.0})  # no stats
    return spec, pd.DataFrame(rows), stats


def test_weight_probe_tables_follow_each_seeds_pairs_and_clients() -> None:
    from fedrepro.report.figures_feddisco import weight_probe_tables

    spec, summary, stats = probe_inputs()
    pairs, clients = weight_probe_tables(spec, summary, stats)
    assert len(pairs) == 2 * 3 * 2 and len(clients) == 6 * 2  # seed 7 has no partition stats: left out
    seed1 = pairs[(pairs["seed"] == 1) & (pairs["pair"] == 0)].iloc[0]
    rolled = client_pairs(np.roll(COUNTS, 1, axis=0))[0]
    assert (seed1["a"], seed1["b"]) == rolled and seed1["disc_gap"] > 0
    row = clients[(clients["seed"] == 0) & (clients["client"] == 5)].iloc[0]
    assert row["relative_size"] == pytest.approx(200 / 664)


def test_render_weight_probe_from_synthetic_inputs(tmp_path) -> None:
    from matplotlib.image import imread

    from fedrepro.report.figures_feddisco import render_weight_probe, spearman

    spec, summary, stats = probe_inputs()
    render_weight_probe(spec, summary, stats, tmp_path / "fig2")
    assert (tmp_path / "fig2.pdf").read_bytes()[:5] == b"%PDF-"
    assert imread(tmp_path / "fig2.png").std() > 0.01
    assert spearman(np.arange(5), -np.arange(5) ** 3) == pytest.approx(-1.0)


def test_weight_probe_without_any_matching_run_says_so(tmp_path) -> None:
    from fedrepro.report.figures_feddisco import render_weight_probe

    spec, summary, stats = probe_inputs()
    with pytest.raises(ValueError, match="no finished probe run"):
        render_weight_probe({**spec, "setting": "other"}, summary, stats, tmp_path / "fig2")


def test_pipeline_figure_reads_summary_then_one_stats_file_per_seed(tmp_path) -> None:
    from fedrepro.io import atomic_write_json
    from fedrepro.pipeline import figure
    from fedrepro.report.captions import figure_caption
    from fedrepro.report.integrity import write_checked_csv

    spec, summary, stats = probe_inputs()
    write_checked_csv(summary, tmp_path / "summary.csv")  # as the aggregation writes it
    inputs = [tmp_path / "summary.csv"]
    for seed in spec["seeds"]:
        atomic_write_json(tmp_path / f"seed{seed}.json", stats[seed], checksum=True)  # as save_partition writes
        inputs.append(tmp_path / f"seed{seed}.json")
    figure(spec, inputs, tmp_path / "out", log=lambda _: None)
    assert (tmp_path / "out.png").exists()
    assert "(1 - r) w\\_A + r w\\_B" in figure_caption(spec, "paper")["shows"]


# ---------------------------------------------------------------- one round in the engine


def test_one_round_with_pair_weights_is_the_pairs_mix_and_single_is_the_clients_own_model(small_data) -> None:
    import dataclasses

    import torch
    from support.common import dirichlet_clients
    from support.engine import CFG, make_run

    parts = dirichlet_clients(small_data.y_train.numpy(), n_clients=4)
    one_round = dataclasses.replace(CFG, rounds=1)
    run = make_run(small_data, parts, cfg=one_round, weighting={"kind": "pair", "pair": 0, "r": 0.3})
    a, b = client_pairs(run.class_counts)[0]
    w0 = run.flat.w.clone()
    local = {cid: run.train_client(cid, 1, w0)[0]["delta"] + w0 for cid in (a, b)}
    run.run()
    assert torch.allclose(run.flat.w, 0.7 * local[a] + 0.3 * local[b], atol=1e-6)
    single = make_run(small_data, parts, cfg=one_round, weighting={"kind": "single", "client": b})
    single.run()
    assert torch.allclose(single.flat.w, local[b], atol=1e-6)
