"""`average_of` table columns: a paper's "Average" column as the mean of other columns of the same row
(FedGTST's Tables 1-3 and 6-10), shown beside the published Average."""

from __future__ import annotations

import copy
import math
import statistics

import pandas as pd
import pytest
import yaml
from support.common import REPO, laptop_full_config

from fedrepro.checks import average_column_problems
from fedrepro.config import resolve_config
from fedrepro.report.convergence import accuracy_cells
from fedrepro.report.coverage import published_keys, shown_keys
from fedrepro.report.derived import add_derived, metric_key
from fedrepro.report.published import load_published
from fedrepro.report.tables import render_table
from fedrepro.study import ConfigError

# two rows x two settings; the Average names one column by setting, the other by label
SPEC = {
    "name": "t", "caption": "", "paper_table": "Table 1", "metric": "final_acc",
    "rows": [{"method": "a", "label": "A", "paper": "A"}, {"method": "b", "label": "B", "paper": "B"}],
    "columns": [{"setting": "x", "label": "X", "paper": "X"}, {"setting": "y", "label": "Y", "paper": "Y"},
                {"average_of": ["x", "Y"], "label": "Average", "paper": "Average"}],
}
ACC = {("x", "a"): [60.0, 64.0, 62.0], ("y", "a"): [40.0, 38.0, 45.0],
       ("x", "b"): [50.0, 52.0, 51.0], ("y", "b"): [30.0, 31.0, 32.0]}


def summary(acc=ACC, diverged=()):
    rows = []
    for (setting, method), values in acc.items():
        for seed, a in enumerate(values):
            bad = (setting, method, seed) in diverged
            rows.append(dict(study="s", setting=setting, method=method, seed=seed,
                             status="diverged" if bad else "complete", diverged_round=7 if bad else None,
                             final_acc=math.nan if bad else a, best_acc=a, last_k_acc=a, last_k=3))
    return pd.DataFrame(rows)


@pytest.fixture
def published(tmp_path):
    path = tmp_path / "p.csv"
    path.write_text("paper,table,row,column,mean,std,unit\n"
                    "p,Table 1,A,X,61,1,acc%\np,Table 1,A,Y,41,1,acc%\np,Table 1,A,Average,51.0,,acc%\n"
                    "p,Table 1,B,X,50,1,acc%\np,Table 1,B,Y,30,1,acc%\np,Table 1,B,Average,40.0,,acc%\n")
    return load_published(path)


def test_an_average_column_is_the_mean_of_its_rows_cells_beside_the_published_average(tmp_path, published):
    cells = render_table(SPEC, summary(), published, tmp_path / "t", "paper").set_index(["row", "column"])
    for row, method in (("A", "a"), ("B", "b")):
        x, y = ACC[("x", method)], ACC[("y", method)]
        average = cells.loc[(row, "Average")]
        assert average["ours_mean"] == pytest.approx((statistics.mean(x) + statistics.mean(y)) / 2)
        # the ± is over seeds: each seed's mean over the two columns
        assert average["ours_std"] == pytest.approx(statistics.stdev([(u + v) / 2 for u, v in zip(x, y, strict=True)]))
        assert average["n_seeds"] == 3 and average["status"] == "ok" and average["method"] == method
        assert average["diff"] == pytest.approx(average["ours_mean"] - average["paper_mean"])
    assert cells.loc[("A", "Average"), "paper_mean"] == 51.0 and math.isnan(cells.loc[("A", "Average"), "paper_std"])
    md = (tmp_path / "t.md").read_text()
    assert "| Average | Average: paper | Average: Δ |" in md
    # A's Average (62 / 41 -> 51.5) is bold: the best of the column, as in any other column
    assert "| **51.50 ± 1.80** | 51.00 | +0.50 |" in md


def test_an_average_needs_every_cell_and_marks_one_with_diverged_seeds(tmp_path, published):
    acc = {**ACC, ("y", "b"): []}  # B has no run on y: its Average would be over one column, so it has none
    cells = render_table(SPEC, summary(acc, diverged={("x", "a", 2)}), published, tmp_path / "t", "paper")
    cells = cells.set_index(["row", "column"])
    assert cells.loc[("B", "Average"), "status"] == "missing" and math.isnan(cells.loc[("B", "Average"), "diff"])
    a = cells.loc[("A", "Average")]
    assert a["status"] == "partial"
    # the mean of the two cells' means (X over its two surviving seeds), the ± over the seeds both have
    assert a["ours_mean"] == pytest.approx((62.0 + statistics.mean(ACC[("y", "a")])) / 2)
    assert a["ours_std"] == pytest.approx(statistics.stdev([50.0, 51.0])) and a["n_seeds"] == 2
    md = (tmp_path / "t.md").read_text()
    assert "† A, Average: the mean over cells with diverged seeds (X)" in md
    assert "| B | 51.00 ± 1.00 | 50.00 ± 1.00 | +1.00 | — | 30.00 ± 1.00 | — | — | 40.00 | — |" in md


def test_an_averages_metric_is_its_columns_and_it_derives_nothing_itself():
    spec = {**SPEC, "metric": "best_acc", "target_acc": 50,
            "columns": [{"setting": "x", "label": "X", "metric": "rounds_to_acc"},
                        {"setting": "y", "label": "Y", "metric": "rounds_to_acc"},
                        {"average_of": ["X", "Y"], "label": "Average"}]}
    assert metric_key(spec, spec["columns"][2]) == "rounds_to_50"
    runs = pd.DataFrame([dict(study="s", setting=s, method=m, seed=k, round=r, test_acc=40 + 10 * r)
                         for (s, m), values in ACC.items() for k in range(len(values)) for r in (1, 2)])
    out = add_derived(spec, summary(), runs)
    assert list(out["rounds_to_50"].unique()) == [1.0]


def test_the_convergence_sds_leave_average_columns_out(tmp_path):
    cells = render_table(SPEC, summary(), None, tmp_path / "t", "paper")
    assert {c.column for c in accuracy_cells(SPEC, cells)} == {"X", "Y"}


@pytest.mark.parametrize("column, expected", [
    ({"average_of": ["x", "again"], "label": "Average"}, []),
    ({"average_of": ["x", "w"], "label": "Average"}, ["average_of: 'w' must name exactly one"]),
    ({"average_of": ["x", "again"]}, ["needs a `label`"]),
    ({"average_of": ["x", "again"], "label": "Average", "setting": "x"}, ["exactly one of `setting`"]),
    ({"label": "Average"}, ["exactly one of `setting`"]),
    ({"average_of": ["x", "again"], "label": "Average", "metric": "best_acc"}, ["takes 'metric' from the columns"]),
    ({"average_of": ["x", "best"], "label": "Average"}, ["show different kinds of numbers"]),
    ({"average_of": ["x", "Average"], "label": "Average"}, ["'Average' must name exactly one (non-averaging)"]),
    ({"average_of": ["x", "y"], "label": "Average"}, ["'y' must name exactly one (non-averaging) column of the "
                                                      "table, it names 2 (name them by their labels)"]),
])
def test_average_columns_are_checked(column, expected):
    table = {"columns": [{"setting": "x"}, {"setting": "y"}, {"setting": "z", "label": "best", "metric": "best_acc"},
                         {"setting": "y", "label": "again"}, column]}
    problems = average_column_problems(table, column)
    assert len(problems) == len(expected) and all(e in p for e, p in zip(expected, problems, strict=True))


def test_the_study_file_refuses_a_bad_average_column_by_its_key():
    config = laptop_full_config()
    table = config["studies"]["fedgtst"]["tables"]["table1"]
    mixed = copy.deepcopy(config)
    mixed["studies"]["fedgtst"]["tables"]["table1"]["columns"] = [
        {**table["columns"][0], "label": "last"}, {"setting": "k10", "label": "best", "metric": "best_target_acc"},
        {"average_of": ["last", "best"], "label": "Average"}]
    with pytest.raises(ConfigError, match=r"fedgtst.tables.table1.columns.2: average_of: the columns"):
        resolve_config(mixed)
    table["columns"].append({"average_of": ["k10", "k11"], "label": "Average"})
    with pytest.raises(ConfigError, match=r"fedgtst.tables.table1.columns.1: average_of: 'k11' must name exactly "
                                          r"one \(non-averaging\) column of the table, it names 0 \(did you mean "
                                          r"'k10'\?\)"):
        resolve_config(config)


def test_fedgtst_shows_every_published_average_at_paper_scale():
    study = yaml.safe_load((REPO / "config" / "studies" / "fedgtst.yaml").read_text())
    published = published_keys(REPO / "config" / "paper" / "fedgtst.csv")
    averages = {k for k in published if k[2] == "Average"}
    assert len(averages) == 27 and averages <= shown_keys(study)
