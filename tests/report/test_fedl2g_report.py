"""FedL2G's report artifacts from tiny synthetic runs: Table 3's warm-up seconds (the paper's brackets) beside
the per-round seconds after the warm-up, Fig. 1's negative effect and Fig. 4's panels per FedL2G variant."""

from __future__ import annotations

import math
import warnings

import pandas as pd
import pytest
from support.common import REPO, laptop_full_config

from fedrepro.report.derived import add_derived, metric_key
from fedrepro.report.integrity import write_checked_csv
from fedrepro.report.published import load_published
from fedrepro.report.tables import render_table

PUBLISHED = REPO / "config" / "paper" / "fedl2g.csv"


def summary(methods: list[str], seeds: int = 2) -> pd.DataFrame:
    return pd.DataFrame([dict(study="fedl2g", setting="c100-dir", method=m, seed=k, status="complete",
                              diverged_round=None, final_acc=40.0, best_acc=40.0, last_k_acc=40.0, last_k=3,
                              seconds=1.0) for m in methods for k in range(seeds)])


def cost_rows(method: str, seed: int, seconds: list[float], warmup: int | None) -> list[dict]:
    """One evaluation row per round; ``warmup``: the method's warm-up rounds (None: it logs no flag)."""
    return [dict(study="fedl2g", setting="c100-dir", method=method, seed=seed, round=r, test_acc=40.0,
                 client_seconds=s, **({} if warmup is None else {"warmup": float(r <= warmup)}))
            for r, s in enumerate(seconds, start=1)]


TABLE3 = {
    "name": "table3", "caption": "", "paper_table": "Table 3", "metric": "best_acc",
    "rows": [{"method": "fedproto", "label": "FedProto", "paper": "FedProto"},
             {"method": "fedl2g_f", "label": "FedL2G-f", "paper": "FedL2G-f"}],
    "columns": [
        {"setting": "c100-dir", "label": "all", "metric": "client_seconds", "reduce": "mean", "paper": None},
        {"setting": "c100-dir", "label": "Client s", "metric": "client_seconds", "reduce": "mean",
         "phase": "regular", "paper": "Computation (s) | Client"},
        {"setting": "c100-dir", "label": "Client s (warm-up)", "metric": "client_seconds", "reduce": "mean",
         "phase": "warmup", "paper": "Computation (s) | Client | warm-up (in brackets)"},
    ],
}


def test_table3_splits_client_seconds_at_fedl2gs_warm_up_and_shows_the_bracketed_cells(tmp_path):
    # FedL2G-f: 2 warm-up rounds at 1 s (feedback only), then 3 rounds at 4 s (training); FedProto: no warm-up
    runs = pd.DataFrame(cost_rows("fedl2g_f", 0, [1, 1, 4, 4, 4], warmup=2)
                        + cost_rows("fedl2g_f", 1, [2, 2, 6, 6, 6], warmup=2)
                        + cost_rows("fedproto", 0, [3, 3, 3, 3, 5], warmup=None)
                        + cost_rows("fedproto", 1, [3, 3, 3, 3, 5], warmup=None))
    runs.loc[runs["method"] == "fedproto", "warmup"] = float("nan")  # runs.csv: an empty cell for other methods
    keys = [metric_key(TABLE3, c) for c in TABLE3["columns"]]
    assert keys == ["client_seconds@mean", "client_seconds@mean[regular]", "client_seconds@mean[warmup]"]
    derived = add_derived(TABLE3, summary(["fedproto", "fedl2g_f"]), runs).set_index(["method", "seed"])
    assert derived.loc[("fedl2g_f", 0), keys].tolist() == pytest.approx([2.8, 4.0, 1.0])
    assert derived.loc[("fedl2g_f", 1), keys].tolist() == pytest.approx([4.4, 6.0, 2.0])
    assert derived.loc[("fedproto", 0), keys[:2]].tolist() == pytest.approx([3.4, 3.4])  # all rows regular
    assert pd.isna(derived.loc[("fedproto", 0), keys[2]])  # no warm-up: no number
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # FedProto's empty warm-up cell is not in the paper, and that is no typo
        cells = render_table(TABLE3, derived.reset_index(), load_published(PUBLISHED), tmp_path / "t3", "paper")
    cells = cells.set_index(["method", "column"])
    assert cells.loc[("fedl2g_f", "Client s (warm-up)"), "ours_mean"] == pytest.approx(1.5)
    assert cells.loc[("fedl2g_f", "Client s (warm-up)"), "paper_mean"] == pytest.approx(2.24)
    assert cells.loc[("fedl2g_f", "Client s"), "paper_mean"] == pytest.approx(8.84)
    assert cells.loc[("fedproto", "Client s (warm-up)"), "status"] == "missing"
    proto_line = next(line for line in (tmp_path / "t3.md").read_text().splitlines() if line.startswith("| FedProto"))
    assert proto_line.endswith("| 6.65 | -3.25 | — | — | — |")  # warm-up: ours, the paper's, the difference


def test_a_misspelt_published_column_still_warns(tmp_path):
    spec = {**TABLE3, "columns": [{**TABLE3["columns"][2], "paper": "Computation (s) | Clinet"}]}
    runs = pd.DataFrame(cost_rows("fedl2g_f", 0, [1, 4], warmup=1) + cost_rows("fedl2g_f", 1, [1, 4], warmup=1)
                        + cost_rows("fedproto", 0, [3, 3], warmup=None) + cost_rows("fedproto", 1, [3, 3], None))
    derived = add_derived(spec, summary(["fedproto", "fedl2g_f"]), runs)
    with pytest.warns(UserWarning, match="no published cell") as caught:
        render_table(spec, derived, load_published(PUBLISHED), tmp_path / "t", "paper")
    assert any("Computation (s) | Clinet" in str(w.message) for w in caught)  # the warning names the column


def test_a_phase_needs_a_mean_over_rows():
    from fedrepro.config import resolve_config
    from fedrepro.study import ConfigError

    config = laptop_full_config()
    columns = config["studies"]["fedl2g"]["tables"]["table3"]["columns"]
    assert [c.get("phase") for c in columns if c.get("metric") == "client_seconds"] == ["regular", "warmup"]
    columns.append({"setting": "dir", "label": "x", "metric": "client_seconds", "round": 3, "phase": "warmup"})
    with pytest.raises(ConfigError, match="reduce"):
        resolve_config(config)


def embeddings(space: str, dim: int, classes: int = 3, clients: int = 2, seed: int = 0) -> dict:
    """A seed's embeddings.npz content: ``classes`` anchors and 4 samples per class and client near them."""
    import numpy as np

    rng = np.random.default_rng(seed)
    anchors = rng.normal(size=(classes, dim)) * 5
    labels = np.repeat(np.arange(classes), 4 * clients)
    return {"anchors": anchors.astype(np.float32), "space": np.array(space),
            "features": (anchors[labels] + rng.normal(size=(len(labels), dim))).astype(np.float32),
            "labels": labels, "clients": np.tile(np.repeat(np.arange(clients), 4), classes)}


def test_fig4_shows_one_tsne_panel_per_fedl2g_variant(tmp_path, monkeypatch):
    """The paper's Fig. 4 has (a) FedL2G-l, logit space, and (b) FedL2G-f, feature space: one figure job reads
    both runs' embeddings (seed 1 of each) through the pipeline and draws a panel for each."""
    import json

    import numpy as np

    from fedrepro import pipeline
    from fedrepro.hetero.job import EMBEDDINGS
    from fedrepro.report import figures_fedl2g

    indexes = []
    for method, space, dim in [("fedl2g_l", "logit", 3), ("fedl2g_f", "feature", 8)]:
        for seed in (0, 1):
            run = tmp_path / method / f"seed{seed}"
            run.mkdir(parents=True)
            np.savez(run / EMBEDDINGS, **embeddings(space, dim, seed=seed))
        (tmp_path / method / "seeds.json").write_text(json.dumps(
            {"runs": [{"seed": s, "dir": f"seed{s}"} for s in (0, 1)]}))
        indexes.append(tmp_path / method / "seeds.json")
    drawn = []
    monkeypatch.setattr(figures_fedl2g, "save_figure", lambda fig, stem: drawn.append(fig))
    spec = {"name": "fig4", "kind": "tsne", "caption": "Fig. 4", "setting": "c10-dir", "setting_label": "C10",
            "seed": 1, "methods": [{"method": "fedl2g_l", "label": "FedL2G-l"},
                                   {"method": "fedl2g_f", "label": "FedL2G-f"}]}
    pipeline.figure(spec, indexes, tmp_path / "fig4", log=lambda _: None)
    (fig,) = drawn
    titles = [ax.get_title() for ax in fig.axes]
    assert titles == ["(a) FedL2G-l, logit space: 24 samples of 2 clients",
                      "(b) FedL2G-f, feature space: 24 samples of 2 clients"]
    for ax in fig.axes:  # circles for the samples, diamonds for the 3 guiding vectors
        circles, diamonds = ax.collections
        assert len(circles.get_offsets()) == 24 and len(diamonds.get_offsets()) == 3
    # a method whose run wrote no embeddings (FedProto) names the method and the missing file
    (tmp_path / "fedl2g_f" / "seed1" / EMBEDDINGS).unlink()
    with pytest.raises(ValueError, match=r"fedl2g_f.*guiding vectors"):
        pipeline.figure(spec, indexes, tmp_path / "fig4", log=lambda _: None)


def test_the_paper_studys_fig4_reads_both_fedl2g_runs_and_a_tsne_takes_method_or_methods():
    import copy

    from fedrepro.config import resolve_config
    from fedrepro.report.figure_kinds import figure_runs_methods
    from fedrepro.study import ConfigError

    config = laptop_full_config()
    config["studies"]["fedl2g"] = str(REPO / "config" / "studies" / "fedl2g.yaml")
    paper = resolve_config(copy.deepcopy(config))["studies"]["fedl2g"]
    assert figure_runs_methods(paper["figures"]["fig4"]) == ["fedl2g_l", "fedl2g_f"]
    assert figure_runs_methods({"kind": "tsne", "setting": "x", "method": "fedl2g_f"}) == ["fedl2g_f"]
    both = laptop_full_config()
    both["studies"]["fedl2g"]["figures"]["fig4"]["method"] = "fedl2g_f"
    with pytest.raises(ConfigError, match="fig4"):
        resolve_config(both)
    unknown = laptop_full_config()
    unknown["studies"]["fedl2g"]["figures"]["fig4"]["methods"] = ["fedl2g_l", "fedl2g"]
    with pytest.raises(ConfigError, match="fig4"):
        resolve_config(unknown)


def test_negative_effect_is_the_largest_rise_above_the_lowest_earlier_loss():
    from fedrepro.report.figures_fedl2g import negative_effect

    assert negative_effect([3.0, 2.0, 2.5, 1.0, 1.8, 1.2]) == pytest.approx(0.8)  # 1.8 - 1.0, not 2.5 - 2.0
    assert negative_effect([3.0, 2.0, 1.0]) == 0.0  # never rises
    assert negative_effect([None, float("nan"), 2.0, 2.4]) == pytest.approx(0.4)  # warm-up rounds: no loss
    assert math.isnan(negative_effect([float("nan"), 2.0]))


def test_fig1_bars_the_negative_effect_and_best_accuracy_per_method(tmp_path, monkeypatch):
    from fedrepro import pipeline
    from fedrepro.report import figures_fedl2g

    curves = {  # (method, seed): (train_ce per round, test_acc per round)
        ("fed_distill", 0): ([2.0, 1.5, 2.1, 1.2], [10, 20, 30, 40]),
        ("fed_distill", 1): ([2.0, 1.5, 1.9, 1.2], [10, 20, 30, 44]),
        ("fedl2g_f", 0): ([None, 2.0, 1.6, 1.7], [5, 15, 46, 45]),
        ("fedl2g_f", 1): ([None, 2.0, 1.6, 1.5], [5, 15, 48, 47]),
        ("fedproto", 0): ([2.0, 1.0, 1.0, 1.0], [10, 10, 10, 10]),  # another setting: not drawn
    }
    runs = pd.DataFrame([dict(study="fedl2g", setting="other" if m == "fedproto" else "c100-dir", method=m,
                              seed=k, round=r, train_ce=ce, test_acc=acc)
                         for (m, k), (ces, accs) in curves.items()
                         for r, (ce, acc) in enumerate(zip(ces, accs, strict=True), start=1)])
    write_checked_csv(runs, tmp_path / "runs.csv")  # as the aggregation writes it
    spec = {"name": "fig1", "kind": "negative_effect", "caption": "Fig. 1", "y": "train_ce",
            "setting": "c100-dir", "setting_label": "Cifar100 Dirichlet",
            "methods": [{"method": "fed_distill", "label": "FedDistill"}, {"method": "fedl2g_f", "label": "FedL2G-f"}]}
    per_seed = figures_fedl2g.negative_effects(spec, runs).set_index(["method", "seed"])
    assert per_seed["negative_effect"].tolist() == pytest.approx([0.6, 0.4, 0.1, 0.0])
    assert per_seed["best_acc"].tolist() == [40, 44, 46, 48]
    drawn = []
    monkeypatch.setattr(figures_fedl2g, "save_figure", lambda fig, stem: drawn.append(fig))
    pipeline.figure(spec, [tmp_path / "runs.csv"], tmp_path / "fig1", log=lambda _: None)
    (fig,) = drawn
    effect, accuracy = fig.axes
    assert [t.get_text() for t in effect.get_xticklabels()] == ["FedDistill", "FedL2G-f"]
    assert [b.get_height() for b in effect.patches] == pytest.approx([0.5, 0.05])  # mean over seeds
    assert [b.get_height() for b in accuracy.patches] == pytest.approx([42.0, 47.0])
    with pytest.raises(ValueError, match="no runs"):
        figures_fedl2g.negative_effects({**spec, "setting": "c10-dir"}, runs)


def test_fig1_is_declared_at_both_scales_and_needs_a_loss():
    import copy

    from fedrepro.config import resolve_config
    from fedrepro.study import ConfigError

    config = laptop_full_config()
    embedded = resolve_config(copy.deepcopy(config))["studies"]["fedl2g"]["figures"]["fig1"]
    assert (embedded["kind"], embedded["paper_figure"], embedded["y"]) == ("negative_effect", "Figure 1", "train_ce")
    paper = copy.deepcopy(config)
    paper["studies"]["fedl2g"] = str(REPO / "config" / "studies" / "fedl2g.yaml")
    fig1 = resolve_config(paper)["studies"]["fedl2g"]["figures"]["fig1"]
    assert fig1["setting"] == "c100-dir" and fig1["methods"] == ["fed_distill", "fedproto", "fedl2g_f"]
    config["studies"]["fedl2g"]["figures"]["fig1"]["y"] = "test_acc"
    with pytest.raises(ConfigError, match=r"fig1.y: a negative effect is the rise of a loss"):
        resolve_config(config)
