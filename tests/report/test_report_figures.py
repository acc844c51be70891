"""Tests for the FedDisco figure kinds (fedrepro.report.figures_feddisco) and per_class_acc collection."""

from __future__ import annotations

import json
import math
import statistics
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from matplotlib.image import imread
from support.report import make_run

from fedrepro.report.collect import collect_runs
from fedrepro.report.figures import sweep_points
from fedrepro.report.figures_feddisco import (
    class_matrix,
    gain_grid_matrix,
    gain_table,
    head_middle_tail,
    paired_differences,
    per_class_table,
    render_class_histogram,
    render_gain_grid,
    render_gain_lines,
    render_partition,
    render_per_class,
)
from fedrepro.report.integrity import write_checked_csv


def assert_written(stem: Path) -> None:
    png, pdf = stem.parent / (stem.name + ".png"), stem.parent / (stem.name + ".pdf")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert pdf.read_bytes()[:5] == b"%PDF-"
    assert imread(png).std() > 0.01  # not a blank canvas


def summary_frame(values: dict[tuple[str, str], list[float | None]], **extra) -> pd.DataFrame:
    """One row per (setting, method, seed); None marks a diverged seed."""
    rows = []
    for (setting, method), vals in values.items():
        for seed, v in enumerate(vals):
            rows.append(
                {
                    "study": "feddisco",
                    "setting": setting,
                    "method": method,
                    "seed": seed,
                    "status": "diverged" if v is None else "complete",
                    "best_acc": 10.0 if v is None else v,  # a diverged run's number must be ignored
                    **{k: f(setting, method, seed) for k, f in extra.items()},
                }
            )
    return pd.DataFrame(rows)


# ---------------------------------------------------------------- gains


GAINS = summary_frame(
    {
        ("s1", "base"): [60.0, 62.0, 64.0],
        ("s1", "disco"): [61.0, 65.0, 64.5],  # d = 1, 3, 0.5
        ("s2", "base"): [50.0, 51.0, 52.0],
        ("s2", "disco"): [55.0, None, 53.0],  # seed 1 diverged: d = 5, 1
        ("s3", "base"): [40.0, None],
        ("s3", "disco"): [None, 45.0],  # no seed finished both
    }
)


def test_gain_table_pairs_by_seed() -> None:
    d = paired_differences(GAINS, "best_acc", "s1", "base", "disco")
    assert d.index.tolist() == [0, 1, 2] and d.tolist() == [1.0, 3.0, 0.5]
    mean, sd, n = gain_table(GAINS, "best_acc", "s1", "base", "disco")
    assert n == 3
    assert mean == pytest.approx(1.5)
    assert sd == pytest.approx(statistics.stdev([1.0, 3.0, 0.5]))  # 1.3229, the paired sd
    # Pairing by seed, not by row order: shuffling rows changes nothing.
    shuffled = GAINS.sample(frac=1.0, random_state=0)
    assert gain_table(shuffled, "best_acc", "s1", "base", "disco") == pytest.approx((mean, sd, n))


def test_gain_table_drops_diverged_seeds() -> None:
    mean, sd, n = gain_table(GAINS, "best_acc", "s2", "base", "disco")
    assert (n, mean, sd) == (2, pytest.approx(3.0), pytest.approx(math.sqrt(8.0)))
    mean, sd, n = gain_table(GAINS, "best_acc", "s3", "base", "disco")
    assert n == 0 and math.isnan(mean) and math.isnan(sd)
    one = summary_frame({("s", "b"): [1.0], ("s", "m"): [3.5]})
    mean, sd, n = gain_table(one, "best_acc", "s", "b", "m")
    assert (mean, n) == (2.5, 1) and math.isnan(sd)


def test_gain_table_errors_name_missing_inputs() -> None:
    with pytest.raises(ValueError, match=r"fig4: no runs of method 'nope' on setting 's1'"):
        gain_table(GAINS, "best_acc", "s1", "base", "nope", what="fig4")
    with pytest.raises(ValueError, match=r"method 'nobase' on setting 's1'"):
        gain_table(GAINS, "best_acc", "s1", "nobase", "disco")
    with pytest.raises(ValueError, match=r"on setting 'zz'"):
        gain_table(GAINS, "best_acc", "zz", "base", "disco")
    with pytest.raises(ValueError, match="final_acc"):
        gain_table(GAINS, "final_acc", "s1", "base", "disco")
    twice = pd.concat([GAINS, GAINS.iloc[[0]]])
    with pytest.raises(ValueError, match=r"seeds \[0\] twice"):
        gain_table(twice, "best_acc", "s1", "base", "disco")


# Fig. 4 grid: a in {0.2, 0.5} x b in {0.05, 0.1}; (0.5, 0.1) not run, (0.2, 0.1) all diverged.
GRID = summary_frame(
    {
        ("c10", "fedavg"): [60.0, 62.0],
        ("c10", "d_a0.2_b0.05"): [61.0, 63.0],  # +1
        ("c10", "d_a0.5_b0.05"): [64.0, 63.0],  # +4, +1 -> 2.5
        ("c10", "d_a0.2_b0.1"): [None, None],
    }
)


def grid_spec(**overrides) -> dict:
    spec = {
        "name": "fig4",
        "caption": "Disco gain over (a, b)",
        "kind": "gain_grid",
        "metric": "best_acc",
        "setting": "c10",
        "baseline": "fedavg",
        "cells": [
            {"method": "d_a0.2_b0.05", "x": 0.2, "y": 0.05},
            {"method": "d_a0.5_b0.05", "x": 0.5, "y": 0.05},
            {"method": "d_a0.2_b0.1", "x": 0.2, "y": 0.1},
        ],
        "x_label": "a",
        "y_label": "b",
    }
    return spec | overrides


def test_gain_grid_matrix_and_render(tmp_path: Path) -> None:
    xs, ys, gain, n = gain_grid_matrix(grid_spec(), GRID)
    assert (xs, ys) == ([0.2, 0.5], [0.05, 0.1])
    np.testing.assert_allclose(gain, [[1.0, 2.5], [np.nan, np.nan]])
    assert n.tolist() == [[2, 2], [0, 0]]
    render_gain_grid(grid_spec(), GRID, tmp_path / "g" / "fig4")
    assert_written(tmp_path / "g" / "fig4")


def test_gain_grid_errors(tmp_path: Path) -> None:
    bad_cells = [{"method": "missing_variant", "x": 0.7, "y": 0.4}]
    with pytest.raises(ValueError, match=r"figure fig4: no runs of method 'missing_variant' on setting 'c10'"):
        render_gain_grid(grid_spec(cells=grid_spec()["cells"] + bad_cells), GRID, tmp_path / "e")
    with pytest.raises(ValueError, match=r"figure fig4: no runs of method 'fedavgm'"):
        render_gain_grid(grid_spec(baseline="fedavgm"), GRID, tmp_path / "e")
    with pytest.raises(ValueError, match="no cell has a finished pair"):
        render_gain_grid(grid_spec(cells=grid_spec()["cells"][2:]), GRID, tmp_path / "e")
    spec = grid_spec()
    del spec["baseline"]
    with pytest.raises(ValueError, match=r"figure fig4: spec lacks \['baseline'\]"):
        render_gain_grid(spec, GRID, tmp_path / "e")


def lines_spec(**overrides) -> dict:
    spec = {
        "name": "fig5a",
        "caption": "Gain vs global imbalance",
        "kind": "gain_lines",
        "metric": "best_acc",
        "x_label": "ρ",
        "points": [{"setting": "rho10", "x": 10}, {"setting": "rho1", "x": 1}],
        "series": [
            {"label": "FedAvg", "baseline": "fedavg", "method": "fedavg_disco"},
            {"label": "FedDyn", "baseline": "feddyn", "method": "feddyn_disco"},
        ],
    }
    return spec | overrides


LINES = summary_frame(
    {
        ("rho1", "fedavg"): [70.0, 71.0, 72.0],
        ("rho1", "fedavg_disco"): [71.0, 71.5, 74.0],
        ("rho10", "fedavg"): [55.0, 56.0, 57.0],
        ("rho10", "fedavg_disco"): [58.0, 60.0, 59.0],
        ("rho1", "feddyn"): [72.0, 73.0, 74.0],
        ("rho1", "feddyn_disco"): [72.0, 74.0, 74.5],
        ("rho10", "feddyn"): [60.0, 61.0, 62.0],
        ("rho10", "feddyn_disco"): [62.0, 61.0, None],
    }
)


def test_render_gain_lines(tmp_path: Path) -> None:
    render_gain_lines(lines_spec(), LINES, tmp_path / "fig5a")
    assert_written(tmp_path / "fig5a")
    with pytest.raises(ValueError, match=r"figure fig5a: no runs of method 'fedavg_disco' on setting 'rho50'"):
        render_gain_lines(lines_spec(points=[{"setting": "rho50", "x": 50}]), LINES, tmp_path / "e")
    with pytest.raises(ValueError, match="share an x"):
        render_gain_lines(lines_spec(points=[{"setting": "rho1", "x": 1}] * 2), LINES, tmp_path / "e")


# ---------------------------------------------------------------- partitions


def stats_dict(counts: list[list[int]]) -> dict:
    return {
        "clients": len(counts),
        "sizes": [sum(c) for c in counts],
        "class_counts": counts,
        "num_classes": len(counts[0]),
        "dropped": 0,
    }


RNG = np.random.default_rng(0)
STATS = {
    "niid1": stats_dict(RNG.integers(0, 500, size=(10, 10)).tolist()),
    "niid2": stats_dict(
        [[300 if c in (2 * i % 10, (2 * i + 1) % 10) else 0 for c in range(10)] for i in range(5)] + [[60] * 10]
    ),
    "rho20": stats_dict((np.outer(np.ones(10), 500 * 20.0 ** (-np.arange(10) / 9))).astype(int).tolist()),
}
PARTITION_SPEC = {
    "name": "fig6",
    "caption": "Class-by-client partitions",
    "kind": "partition",
    "settings": [
        {"setting": "niid1", "label": "CIFAR-10 NIID-1"},
        {"setting": "niid2", "label": "CIFAR-10 NIID-2"},
        {"setting": "rho20", "label": "ρ = 20"},
    ],
}


def test_class_matrix_checks_shape() -> None:
    m = class_matrix(STATS["niid2"])
    assert m.shape == (6, 10) and m[:5].sum(axis=1).tolist() == [600.0] * 5
    with pytest.raises(ValueError, match="shape"):
        class_matrix({"class_counts": [[1, 2], [3, 4]], "num_classes": 3})
    with pytest.raises(ValueError, match="class_counts"):
        class_matrix({"clients": 2, "num_classes": 3})
    with pytest.raises(ValueError, match="3 clients"):
        class_matrix({"clients": 3, "class_counts": [[1, 2], [3, 4]], "num_classes": 2})


def test_render_partition_and_histogram(tmp_path: Path) -> None:
    render_partition(PARTITION_SPEC, STATS, tmp_path / "fig6")
    assert_written(tmp_path / "fig6")
    # Past 30 clients or classes a panel is a heatmap (bubbles would shrink to dots).
    wide = STATS | {"k60": stats_dict(RNG.integers(0, 100, size=(60, 10)).tolist())}
    spec = PARTITION_SPEC | {"settings": [*PARTITION_SPEC["settings"], {"setting": "k60", "label": "60 clients"}]}
    render_partition(spec, wide, tmp_path / "fig6_wide")
    assert_written(tmp_path / "fig6_wide")
    hist_spec = PARTITION_SPEC | {"name": "fig7", "kind": "class_histogram"}
    render_class_histogram(hist_spec, STATS, tmp_path / "fig7")
    assert_written(tmp_path / "fig7")
    # Stats keyed by the settings' labels are accepted too.
    by_label = {s["label"]: STATS[s["setting"]] for s in PARTITION_SPEC["settings"]}
    render_class_histogram(hist_spec, by_label, tmp_path / "fig7b")
    assert_written(tmp_path / "fig7b")


def test_partition_figures_name_missing_setting(tmp_path: Path) -> None:
    spec = PARTITION_SPEC | {"settings": [*PARTITION_SPEC["settings"], {"setting": "ham", "label": "HAM"}]}
    for render in (render_partition, render_class_histogram):
        with pytest.raises(ValueError, match=r"figure fig6: no partition stats for setting 'ham'"):
            render(spec, STATS, tmp_path / "e")
    broken = STATS | {"niid1": {"class_counts": [[1, 2]], "num_classes": 10}}
    with pytest.raises(ValueError, match=r"figure fig6, setting 'niid1': class_counts has shape"):
        render_partition(PARTITION_SPEC, broken, tmp_path / "e")


# ---------------------------------------------------------------- per class

PER_CLASS = {
    ("c10", "fedavg"): [[90, 85, 80, 75, 60, 50, 40, 20, 10, 0], [92, 83, 80, 77, 60, 52, 38, 22, 8, 0]],
    ("c10", "fedavg_disco"): [[88, 84, 79, 75, 60, 50, 44, 30, 20, 15], [88, 84, 79, 75, 62, 50, 44, 30, 20, 15]],
}
PER_CLASS_SUMMARY = summary_frame(
    {k: [70.0] * len(v) for k, v in PER_CLASS.items()},
    per_class_acc=lambda s, m, seed: json.dumps(PER_CLASS[(s, m)][seed]),
)
PER_CLASS_SPEC = {
    "name": "fig8",
    "caption": "Per-class accuracy, CIFAR-10 ρ = 10",
    "kind": "per_class",
    "setting": "c10",
    "methods": [{"method": "fedavg", "label": "FedAvg"}, {"method": "fedavg_disco", "label": "FedAvg+Disco"}],
}


def test_per_class_table_and_head_middle_tail() -> None:
    mean, sd, n = per_class_table(PER_CLASS_SUMMARY, "c10", "fedavg")
    assert n == 2
    np.testing.assert_allclose(mean, [91, 84, 80, 76, 60, 51, 39, 21, 9, 0])
    assert sd[0] == pytest.approx(statistics.stdev([90, 92]))
    groups = head_middle_tail(mean)
    # C = 10 splits 4 / 3 / 3 (head = classes 0-3), as the paper's Fig. 8.
    assert groups["head"] == pytest.approx((91 + 84 + 80 + 76) / 4)
    assert groups["middle"] == pytest.approx((60 + 51 + 39) / 3)
    assert groups["tail"] == pytest.approx((21 + 9 + 0) / 3)
    assert groups["avg"] == pytest.approx(mean.mean())
    assert groups["sd"] == pytest.approx(statistics.pstdev(mean.tolist()))
    reversed_order = head_middle_tail(mean, list(range(9, -1, -1)))
    assert reversed_order["head"] == pytest.approx((0 + 9 + 21 + 39) / 4)
    with pytest.raises(ValueError, match="permutation"):
        head_middle_tail(mean, [0, 1, 2])


def test_render_per_class(tmp_path: Path) -> None:
    render_per_class(PER_CLASS_SPEC, PER_CLASS_SUMMARY, tmp_path / "fig8")
    assert_written(tmp_path / "fig8")
    # The column survives a CSV round trip (what the report rule reads), "" -> NaN included.
    csv = tmp_path / "summary.csv"
    extra = PER_CLASS_SUMMARY.iloc[[0]].assign(seed=5, per_class_acc="")
    pd.concat([PER_CLASS_SUMMARY, extra]).to_csv(csv, index=False)
    render_per_class(PER_CLASS_SPEC | {"class_order": list(range(9, -1, -1))}, pd.read_csv(csv), tmp_path / "f8")
    assert_written(tmp_path / "f8")


def test_per_class_errors(tmp_path: Path) -> None:
    spec = PER_CLASS_SPEC | {"methods": [*PER_CLASS_SPEC["methods"], {"method": "moon", "label": "MOON"}]}
    with pytest.raises(ValueError, match=r"figure fig8: no runs of method 'moon' on setting 'c10'"):
        render_per_class(spec, PER_CLASS_SUMMARY, tmp_path / "e")
    with pytest.raises(ValueError, match=r"figure fig8: no runs of method 'fedavg' on setting 'c100'"):
        render_per_class(PER_CLASS_SPEC | {"setting": "c100"}, PER_CLASS_SUMMARY, tmp_path / "e")
    with pytest.raises(ValueError, match=r"figure fig8: summary has no per_class_acc column"):
        render_per_class(PER_CLASS_SPEC, PER_CLASS_SUMMARY.drop(columns="per_class_acc"), tmp_path / "e")
    empty = PER_CLASS_SUMMARY.assign(per_class_acc="")
    with pytest.raises(ValueError, match=r"no finished run of method 'fedavg' on setting 'c10' has per_class_acc"):
        render_per_class(PER_CLASS_SPEC, empty, tmp_path / "e")
    with pytest.raises(ValueError, match=r"figure fig8: class_order"):
        render_per_class(PER_CLASS_SPEC | {"class_order": [0, 1, 2]}, PER_CLASS_SUMMARY, tmp_path / "e")


# ---------------------------------------------------------------- collect


def test_collect_carries_per_class_acc(tmp_path: Path) -> None:
    with_acc = make_run(tmp_path, "c10", "fedavg", 0, [50.0, 60.0])
    summary = json.loads((with_acc / "summary.json").read_text())
    (with_acc / "summary.json").write_text(json.dumps(summary | {"per_class_acc": [80.0, 40.5, None]}))
    without = make_run(tmp_path, "c10", "fedavg", 1, [50.0, 61.0])
    _, frame = collect_runs([with_acc, without])
    assert frame["per_class_acc"].tolist() == ["[80.0, 40.5, null]", ""]
    mean, _, n = per_class_table(frame, "c10", "fedavg")
    assert n == 1 and mean[:2].tolist() == [80.0, 40.5] and math.isnan(mean[2])

    _, plain = collect_runs([without])
    assert "per_class_acc" not in plain.columns  # unchanged frame when no run records it

    bad = make_run(tmp_path, "c10", "fedprox", 0, [1.0])
    (bad / "summary.json").write_text(json.dumps(summary | {"method": "fedprox", "per_class_acc": "80"}))
    with pytest.raises(ValueError, match=r"summary\.json.*per_class_acc"):
        collect_runs([bad])


def test_curves_tick_whole_rounds_only(tmp_path: Path, monkeypatch) -> None:
    import fedrepro.report.figures as figures

    runs = pd.DataFrame([{"setting": "s", "method": m, "seed": seed, "round": r, "test_acc": 10.0 * r + seed}
                         for m in ("fedavg", "fedprox") for seed in (0, 1) for r in (1, 2)])
    drawn = []
    monkeypatch.setattr(figures, "save_figure", lambda fig, stem: drawn.append(fig))
    figures.render_curves({"name": "c", "settings": [{"setting": "s", "label": "S"}],
                           "methods": [{"method": "fedavg", "label": "FedAvg"},
                                       {"method": "fedprox", "label": "FedProx"}]}, runs, tmp_path / "c")
    ticks = [t for t in drawn[0].axes[0].get_xticks() if 1 <= t <= 2]
    assert ticks and all(float(t).is_integer() for t in ticks)


@pytest.mark.parametrize("config", ["config/config.yaml", "config/laptop-full.yaml", "config/paper.yaml"])
def test_every_figure_of_every_study_gives_its_methods_distinct_colours(config: str) -> None:
    from fedrepro.config import merge_configfiles, resolve_config
    from fedrepro.report.style import method_color
    from fedrepro.study import label_of

    studies = resolve_config(merge_configfiles("config/config.yaml", config))["studies"]
    checked = 0
    for name, study in studies.items():
        for fig_name, fig in study["figures"].items():
            methods = fig.get("methods") or [s["method"] for s in fig.get("series", [])]
            colours = [method_color(label_of(study, "methods", m)) for m in methods]
            assert len(set(colours)) == len(colours), (name, fig_name, dict(zip(methods, colours, strict=True)))
            checked += len(methods) > 1
    assert checked
    # a method keeps its colour across studies
    assert method_color("FedAvg") == method_color("fedavg") == method_color("Fed-Avg")


# ---------------------------------------------------------------- sweep lines (Feddle Figs. 8, 9)

SWEEP_SPEC = {
    "name": "fig8", "caption": "accuracy vs lambda", "kind": "sweep_line", "metric": "best_acc", "setting": "c10",
    "x_label": "λ", "x_scale": "categorical", "x_values": [0, 0.001, 0.01],
    "lines": [{"label": "In-Domain", "methods": ["f", "f-1", "f-2"]},
              {"label": "Out-of-Domain", "methods": ["f-ood", "f-1-ood", "f-2-ood"]}],
}


def test_sweep_points_are_the_seed_mean_and_sd_of_each_swept_run():
    summary = summary_frame({("c10", "f"): [50.0, 54.0], ("c10", "f-1"): [60.0, None], ("c10", "f-2"): [70.0],
                             ("c10", "f-ood"): [30.0, 34.0], ("c100", "f-1-ood"): [99.0]})
    lines = sweep_points(SWEEP_SPEC, summary)
    ind, ood = lines["In-Domain"], lines["Out-of-Domain"]
    assert list(ind["x"]) == [0, 0.001, 0.01] and list(ind["method"]) == ["f", "f-1", "f-2"]
    assert list(ind["mean"]) == [52.0, 60.0, 70.0]  # the diverged seed of f-1 is left out
    assert ind["sd"].iloc[0] == pytest.approx(statistics.stdev([50.0, 54.0])) and math.isnan(ind["sd"].iloc[1])
    assert list(ind["n"]) == [2, 1, 1]
    # another setting's run is not this figure's point: a gap in the line
    assert ood["mean"].iloc[0] == 32.0 and ood["mean"].iloc[1:].isna().all() and list(ood["n"]) == [2, 0, 0]


@pytest.mark.parametrize("x_scale, x_values", [("categorical", [0, 0.001, 0.01]), ("log", [5, 10, 20]),
                                               ("linear", [1, 2, 3])])
def test_render_sweep_line_writes_a_figure_on_each_axis_kind(tmp_path, x_scale, x_values):
    from fedrepro.report.figures import render_sweep_line

    spec = {**SWEEP_SPEC, "x_scale": x_scale, "x_values": x_values}
    summary = summary_frame({("c10", m): [40.0 + i, 44.0 + i] for i, m in enumerate(["f", "f-1", "f-2", "f-ood"])})
    render_sweep_line(spec, summary, tmp_path / "fig8")
    assert_written(tmp_path / "fig8")


def test_render_sweep_line_refuses_a_figure_without_runs_or_a_log_axis_through_zero(tmp_path):
    from fedrepro.report.figures import render_sweep_line

    summary = summary_frame({("c10", "f"): [40.0]})
    with pytest.raises(ValueError, match="fig8: a log x axis needs positive x_values"):
        render_sweep_line({**SWEEP_SPEC, "x_scale": "log"}, summary, tmp_path / "fig8")
    with pytest.raises(ValueError, match="fig8: no finished runs for any of its points"):
        render_sweep_line(SWEEP_SPEC, summary_frame({("c100", "f"): [40.0]}), tmp_path / "fig8")


def test_the_figure_job_derives_last_k_max_acc_from_the_curves_for_a_sweep_line(tmp_path, monkeypatch):
    from fedrepro.pipeline import figure
    from fedrepro.report import figures

    curves = {("f", 0): [10, 50, 40], ("f", 1): [10, 30, 60], ("f-1", 0): [10, 70, 20]}
    runs = pd.DataFrame([{"study": "s", "setting": "c10", "method": m, "seed": k, "round": r + 1, "test_acc": a}
                         for (m, k), accs in curves.items() for r, a in enumerate(accs)])
    summary = pd.DataFrame([{"study": "s", "setting": "c10", "method": m, "seed": k, "status": "complete",
                             "best_acc": max(accs), "last_k": 2} for (m, k), accs in curves.items()])
    write_checked_csv(runs, tmp_path / "runs.csv")  # as the aggregation writes them
    write_checked_csv(summary, tmp_path / "summary.csv")
    spec = {**SWEEP_SPEC, "metric": "last_k_max_acc", "x_values": [0, 0.001],
            "lines": [{"label": "In-Domain", "methods": ["f", "f-1"]}]}
    seen = {}
    render = figures.render_sweep_line

    def capture(spec, summary, out_stem):
        seen["summary"] = summary
        render(spec, summary, out_stem)

    monkeypatch.setattr(figures, "render_sweep_line", capture)
    figure(spec, [tmp_path / "summary.csv", tmp_path / "runs.csv"], tmp_path / "fig8", log=lambda _: None)
    assert_written(tmp_path / "fig8")
    # the max over each run's last 2 evaluations, not its best over all rounds
    assert list(seen["summary"]["last_k_max_acc"]) == [50.0, 60.0, 70.0]
    assert list(sweep_points(spec, seen["summary"])["In-Domain"]["mean"]) == [55.0, 70.0]
