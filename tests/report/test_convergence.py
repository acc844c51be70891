"""The scorecard's convergence section: plateau rule, seed spread of accuracy cells, chance level."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd

from fedrepro.report.convergence import (
    BEST_OVER_ROUNDS,
    LAST_K_MAX,
    QUARTER_MEAN,
    accuracy_cells,
    chance_level,
    convergence_blocks,
    plateau_check,
    plateau_rules,
    quarter_means,
    run_plateaus,
    study_convergence,
)


def _runs(curves: dict[tuple[str, str, int], list[float]]) -> pd.DataFrame:
    rows = [dict(study="s", setting=s, method=m, seed=seed, round=2 * (i + 1), test_acc=a)
            for (s, m, seed), accs in curves.items() for i, a in enumerate(accs)]
    return pd.DataFrame(rows).sample(frac=1.0, random_state=0)  # the rule must not depend on row order


def _summary(keys, status=None, final=None, classes=10) -> pd.DataFrame:
    return pd.DataFrame([dict(setting=s, method=m, seed=seed, status=(status or {}).get((s, m, seed), "complete"),
                              final_acc=(final or {}).get((s, m, seed), 50.0),
                              per_class_acc=json.dumps([50.0] * classes)) for s, m, seed in keys])


def test_quarter_means_compare_the_last_quarter_with_the_one_before():
    acc = np.array([0, 10, 20, 30, 40, 50, 60, 70, 80, 90], dtype=float)  # 10 evaluations: quarters of 2
    assert quarter_means(acc) == (65.0, 85.0)
    assert quarter_means(np.array([1.0, 2.0, 3.0])) is None


def test_a_climbing_run_misses_the_plateau_and_a_flat_one_meets_it():
    curves = {("a", "climbing", 0): [10, 20, 30, 40, 50, 60, 70, 80],
              ("a", "flat", 0): [10, 60, 70, 71, 71.5, 72, 72.4, 72.2],
              ("a", "diverged", 0): [10, 60, 70, 71, 71.5, 72, 72.4, 72.2],
              ("a", "short", 0): [10, 20, 30]}
    summary = _summary(curves, status={("a", "diverged", 0): "diverged"})
    plateaus, short, _ = run_plateaus(_runs(curves), summary)
    verdict = {r.method: r.at_plateau for r in plateaus}
    assert verdict == {"climbing": False, "flat": True, "diverged": False}
    assert short == [("a", "short", 0)]
    flat = next(r for r in plateaus if r.method == "flat")
    assert flat.quarter_before == np.mean([71.5, 72]) and flat.last_quarter == np.mean([72.4, 72.2])


def test_a_run_that_falls_by_more_than_a_point_is_no_plateau_either():
    curves = {("a", "falling", 0): [50, 80, 80, 80, 80, 80, 70, 70]}
    plateaus, _, _ = run_plateaus(_runs(curves), _summary(curves))
    assert plateaus[0].change == -10 and not plateaus[0].at_plateau


def test_only_accuracy_columns_count_for_the_seed_spread():
    spec = {"name": "t3", "metric": "best_acc",
            "columns": [{"setting": "dir", "label": "Acc"},
                        {"setting": "dir", "label": "MB", "metric": "round_bytes_up", "reduce": "mean"}]}
    cells = pd.DataFrame([
        dict(row="A", column="Acc", n_seeds=3, ours_std=1.5, status="ok"),
        dict(row="A", column="MB", n_seeds=3, ours_std=40.0, status="ok"),
        dict(row="B", column="Acc", n_seeds=3, ours_std=3.5, status="ok"),
        dict(row="B", column="MB", n_seeds=3, ours_std=40.0, status="ok"),
    ])
    spread = accuracy_cells(spec, cells)
    assert [(c.row, c.column, c.sd) for c in spread] == [("A", "Acc", 1.5), ("B", "Acc", 3.5)]


def test_chance_is_one_over_the_classes_of_the_runs():
    keys = [("a", "stuck", 0), ("a", "stuck", 1), ("a", "fine", 0)]
    final = {("a", "stuck", 0): 10.5, ("a", "stuck", 1): 11.0, ("a", "fine", 0): 60.0}
    hits = chance_level(_summary(keys, final=final, classes=10))
    assert [(h.method, h.chance) for h in hits] == [("stuck", 10.0)]
    assert hits[0].final_acc == 10.75
    # with 2 classes chance is 50%: a method at 60% is not at chance, one below chance is
    assert [h.method for h in chance_level(_summary(keys, final=final, classes=2))] == ["stuck"]


def test_the_section_names_the_runs_and_cells_that_miss():
    curves = {("a", "climbing", 0): [10, 20, 30, 40, 50, 60, 70, 80], ("a", "flat", 0): [70] * 8}
    spec = {"name": "t1", "metric": "best_acc", "columns": [{"setting": "a", "label": "A"}]}
    cells = pd.DataFrame([dict(row=m, column="A", n_seeds=3, ours_std=sd, status="ok", method=m, setting="a")
                          for m, sd in (("climbing", 4.0), ("flat", 0.5))])
    conv = study_convergence("s", _runs(curves), _summary(curves), [(spec, cells)])
    statements, tables = convergence_blocks(conv)
    assert "1 of 2 (50%)" in statements[0] and "1 of 2 (50%)" in statements[1]
    (_, _, missed), (_, _, spread) = tables
    assert [r[1] for r in missed] == ["climbing"] and [r[1] for r in spread] == ["climbing"]


# an early spike, then flat at a lower level with a last-quarter dip: the best is set early and never beaten
SPIKED = [20, 84, 70, 70, 72, 72, 70, 70]
RISING = [10, 20, 30, 40, 50, 60, 70, 80]
# the max over a window stays put while the mean of the window climbs
SAWTOOTH = [10, 40, 50, 60, 60, 75, 74, 75.5]


def test_best_over_rounds_compares_the_best_with_the_best_of_the_first_three_quarters():
    best = plateau_check(np.array(SPIKED, dtype=float), BEST_OVER_ROUNDS)
    assert (best.before, best.last, best.passes) == (84.0, 84.0, True)
    quarter = plateau_check(np.array(SPIKED, dtype=float), QUARTER_MEAN)
    assert (quarter.before, quarter.last, quarter.passes) == (72.0, 70.0, False)
    rising = plateau_check(np.array(RISING, dtype=float), BEST_OVER_ROUNDS)
    assert (rising.before, rising.last, rising.passes) == (60.0, 80.0, False)
    assert rising.text() == "best 80.00 vs 60.00 before (+20.00, best-over-rounds)"


def test_last_k_max_compares_the_max_of_the_last_quarter_with_the_quarter_before():
    window = plateau_check(np.array(SAWTOOTH, dtype=float), LAST_K_MAX)
    assert (window.before, window.last, window.passes) == (75.0, 75.5, True)
    assert not plateau_check(np.array(SAWTOOTH, dtype=float), QUARTER_MEAN).passes  # means 67.5 -> 74.75
    assert not plateau_check(np.array(RISING, dtype=float), LAST_K_MAX).passes  # 60 -> 80


def _cells(spec: dict, shown: list[tuple[str, str]]) -> pd.DataFrame:
    """A table's tidy cells, row-major, each showing the runs of (method, setting)."""
    return pd.DataFrame([dict(row=m, column=s, n_seeds=1, ours_std=np.nan, status="ok", method=m, setting=s)
                         for m, s in shown])


def test_each_run_is_judged_by_the_metric_of_the_tables_and_figures_that_report_it():
    curves = {("a", "spiked", 0): SPIKED, ("a", "sawtooth", 0): SAWTOOTH, ("a", "both", 0): SPIKED,
              ("a", "diverged", 0): SPIKED, ("a", "gridded", 0): SPIKED, ("a", "final-grid", 0): SPIKED,
              ("a", "curve-only", 0): RISING, ("a", "curve-only", 1): RISING}
    best = {"name": "t1", "metric": "best_acc", "columns": [{"setting": "a", "label": "A"}]}
    last_max = {"name": "t2", "metric": "last_k_max_acc", "columns": [{"setting": "a", "label": "A"}]}
    final = {"name": "t3", "metric": "final_acc", "columns": [{"setting": "a", "label": "A"}]}
    tables = [(best, _cells(best, [("spiked", "a"), ("both", "a"), ("diverged", "a")])),
              (last_max, _cells(last_max, [("sawtooth", "a")])), (final, _cells(final, [("both", "a")]))]
    # figure job specs: a heatmap of best-over-rounds gains and one of final accuracies report their runs' numbers;
    # a curve reports none, and a run drawn only there has no number to settle
    figures = [{"kind": "gain_grid", "metric": "best_acc", "drawn_runs": [["a", "gridded"], ["a", "spiked"]]},
               {"kind": "gain_grid", "metric": "final_acc", "drawn_runs": [["a", "final-grid"]]},
               {"kind": "curve", "drawn_runs": [["a", "curve-only"], ["a", "spiked"]]}]
    conv = study_convergence("s", _runs(curves), _summary(curves, status={("a", "diverged", 0): "diverged"}), tables,
                             figures)
    runs = {r.method: r for r in conv.runs}
    assert {m: r.at_plateau for m, r in runs.items()} == {
        "spiked": True, "sawtooth": True, "both": False, "diverged": False, "gridded": True, "final-grid": False}
    assert [c.rule for c in runs["both"].checks] == [BEST_OVER_ROUNDS, QUARTER_MEAN]  # must meet each
    assert [c.rule for c in runs["sawtooth"].checks] == [LAST_K_MAX]
    assert [c.rule for c in runs["spiked"].checks] == [BEST_OVER_ROUNDS]  # a table's and a figure's, one rule
    assert [c.rule for c in runs["gridded"].checks] == [BEST_OVER_ROUNDS]  # in no table: its figure's number
    assert [c.rule for c in runs["final-grid"].checks] == [QUARTER_MEAN]
    assert conv.unjudged == [("a", "curve-only", 0), ("a", "curve-only", 1)]  # never counted as at a plateau
    statements, tables_out = convergence_blocks(conv)
    assert "**3 of 6 (50%)**" in statements[0]
    assert "Runs judged by quarter-mean: 2, best-over-rounds: 4, last-k-max: 1." in statements[0]
    assert "Not judged, as no table or figure reports a number of theirs" in statements[-1]
    assert "2 runs, curve-only on a (2 seeds)." in statements[-1]
    (_, head, missed), = [t for t in tables_out if t[0] == "Runs that miss the plateau rule"]
    rows = {r[1]: r[4] for r in missed}
    assert rows["both"] == "mean 70.00 vs 72.00 before (-2.00, quarter-mean)"  # the rule it misses, only
    # a diverged run is kept apart from the runs still moving: named in a list of its own, with why
    assert "diverged" not in rows and "Diverged: **1 of 6 (17%)**" in statements[0]
    (_, head, diverged), = [t for t in tables_out if t[0] == "Runs that diverged"]
    assert diverged == [["a", "diverged", "0", "", "not recorded (a run written before diagnoses were kept)"]]


def test_a_run_that_diverges_before_its_fourth_evaluation_counts_as_a_miss():
    # SCAFFOLD on the default's NIID-2 diverged at round 6 (3 evaluations): left out, it made 8 of 10 of 8 of 12
    curves = {("a", "early", 0): [10, 40, 57], ("a", "flat", 0): [10, 60, 70, 71, 71.5, 72, 72.4, 72.2]}
    plateaus, short, _ = run_plateaus(_runs(curves), _summary(curves, status={("a", "early", 0): "diverged"}))
    assert short == []
    early = next(r for r in plateaus if r.method == "early")
    assert early.status == "diverged" and not early.at_plateau and early.evaluations == 3


def test_a_fine_tuning_cell_from_the_best_pre_trained_model_is_judged_by_the_best_over_rounds():
    from fedrepro.report.table_sources import table_spec
    from fedrepro.study import TRAINING_KEYS

    # SPIKED: its best comes early and the last quarter's mean falls; its best-over-rounds is still at plateau
    curves = {("a", "kept", 0): SPIKED, ("a", "last", 0): SPIKED}
    study = {"seeds": [0], "settings": {"a": {"label": "A", "target": {"dataset": "t"}}},
             "methods": {"kept": {"label": "K", "training": {"keep_best": True}}, "last": {"label": "L"}},
             "defaults": {}, "tables": {"t": {"source": "finetune", "metric": "target_acc",
                                             "rows": [{"method": "kept"}, {"method": "last"}],
                                             "columns": [{"setting": "a"}]}}}
    study["defaults"] = dict.fromkeys(TRAINING_KEYS, 1)
    spec = table_spec(study, "t")
    assert spec["kept_best_runs"] == [["a", "kept"]]
    cells = _cells(spec, [("kept", "a"), ("last", "a")])
    conv = study_convergence("s", _runs(curves), _summary(curves), [(spec, cells)])
    runs = {r.method: r for r in conv.runs}
    assert [c.rule for c in runs["kept"].checks] == [BEST_OVER_ROUNDS] and runs["kept"].at_plateau
    assert [c.rule for c in runs["last"].checks] == [QUARTER_MEAN] and not runs["last"].at_plateau


def test_laptop_full_judges_figure_only_runs_by_their_figures_number_or_not_at_all():
    from support.common import laptop_full_config

    from fedrepro.config import REPO, command_config, resolve_config
    from fedrepro.report.figure_kinds import figure_spec
    from fedrepro.report.table_sources import table_spec

    studies = resolve_config(laptop_full_config())["studies"]
    studies |= command_config([str(REPO / "config" / "laptop-feddle-table5.yaml")])["studies"]

    def rules(name):
        study = studies[name]
        tables = [(spec := table_spec(study, t), _cells(spec, [(r["method"], c["setting"]) for r in spec["rows"]
                                                                for c in spec["columns"] if "setting" in c]))
                  for t in study["tables"]]
        return plateau_rules(tables, [figure_spec(study, f) for f in study["figures"]])

    # FedDisco's Fig. 4 heatmap of best-over-rounds gains: its sweep's runs are in no table
    disco = rules("feddisco")
    grid = [k for k in disco if k[1].startswith("fedavg-disco-grid-")]
    assert len(grid) == 4 and all(disco[k] == [BEST_OVER_ROUNDS] for k in grid)
    # Feddle's Fig. 2 draws update cosines of its no-delay runs over 16 rounds: no number of theirs is reported
    feddle = rules("feddle-table5")
    assert not [k for k in feddle if k[0].endswith("-sync")]
    assert feddle[("fm-d01-n5", "fedavg")] == [LAST_K_MAX]


def test_a_run_ended_by_early_stopping_is_named_apart():
    # stopped 2 evaluations after its best: the best lies before its last quarter, so the rule holds by construction
    curves = {("a", "stopped", 0): [10, 40, 20, 60, 30, 80, 35, 45], ("a", "stopped", 1): RISING,
              ("a", "full", 0): [70] * 8}
    summary = _summary(curves).assign(stopped_round=[16, 16, None])
    spec = {"name": "t1", "metric": "best_acc", "columns": [{"setting": "a", "label": "A"}]}
    conv = study_convergence("s", _runs(curves), summary, [(spec, _cells(spec, [("stopped", "a"), ("full", "a")]))])
    runs = {(r.method, r.seed): r for r in conv.runs}
    assert runs[("stopped", 0)].at_plateau and runs[("stopped", 0)].stopped_round == 16
    assert runs[("full", 0)].stopped_round is None
    statements, tables = convergence_blocks(conv)
    assert any(t.startswith("Ended by early stopping: 2 runs, 1 of them counted at their plateau") for t in statements)
    (_, _, missed), = [t for t in tables if t[0] == "Runs that miss the plateau rule"]
    assert missed[0][:3] == ["a", "stopped", "1"] and missed[0][5] == "complete (early stop at round 16)"
