"""The scorecard's convergence section: plateau rule, seed spread of accuracy cells, chance level."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd

from fedrepro.report.convergence import (
    accuracy_cells,
    chance_level,
    convergence_blocks,
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
    plateaus, short = run_plateaus(_runs(curves), summary)
    verdict = {r.method: r.at_plateau for r in plateaus}
    assert verdict == {"climbing": False, "flat": True, "diverged": False}
    assert short == [("a", "short", 0)]
    flat = next(r for r in plateaus if r.method == "flat")
    assert flat.quarter_before == np.mean([71.5, 72]) and flat.last_quarter == np.mean([72.4, 72.2])


def test_a_run_that_falls_by_more_than_a_point_is_no_plateau_either():
    curves = {("a", "falling", 0): [50, 80, 80, 80, 80, 80, 70, 70]}
    plateaus, _ = run_plateaus(_runs(curves), _summary(curves))
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
    cells = pd.DataFrame([dict(row="climbing", column="A", n_seeds=3, ours_std=4.0, status="ok"),
                          dict(row="flat", column="A", n_seeds=3, ours_std=0.5, status="ok")])
    conv = study_convergence("s", _runs(curves), _summary(curves), [(spec, cells)])
    statements, tables = convergence_blocks(conv)
    assert "1 of 2 (50%)" in statements[0] and "1 of 2 (50%)" in statements[1]
    (_, _, missed), (_, _, spread) = tables
    assert [r[1] for r in missed] == ["climbing"] and [r[1] for r in spread] == ["climbing"]
