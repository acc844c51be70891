"""Table layouts that differ from the paper's: transposed tables and with/without column pairs still find
the right published cell."""

from __future__ import annotations

import pandas as pd
import pytest
from support.common import REPO

from fedrepro.report.published import load_published
from fedrepro.report.tables import cell_method, paper_key, render_table


def summary(rows):
    return pd.DataFrame([dict(study="s", setting=s, method=m, seed=k, status="complete", diverged_round=None,
                              final_acc=a, best_acc=a, last_k_acc=a - 1, last_k=3, seconds=1.0)
                         for s, m, k, a in rows])


def test_paper_key_defaults_and_formats():
    row, col = {"method": "fedavg", "paper": "FedAvg"}, {"setting": "x", "paper": "Without Disco"}
    assert paper_key({}, row, col) == ("FedAvg", "Without Disco")
    assert paper_key({"paper_key": {"row": "{col[paper]}", "column": "{row[paper]}"}}, row, col) == (
        "Without Disco", "FedAvg")
    assert paper_key({}, row, {"setting": "x", "paper": None}) is None  # no published number for this cell


def test_transposed_table_with_method_suffix_finds_table9_cells(tmp_path):
    spec = {
        "name": "t9", "caption": "", "paper_table": "Table 9", "metric": "best_acc",
        "paper_key": {"row": "{col[paper]}", "column": "{row[paper]}"},
        "rows": [{"method": "fedavg", "label": "FedAvg", "paper": "FedAvg"}],
        "columns": [{"setting": "rho10", "label": "w/o", "paper": "Without Disco"},
                    {"setting": "rho10", "label": "with", "method_suffix": "-disco", "paper": "With Disco"}],
    }
    assert cell_method(spec["rows"][0], spec["columns"][1]) == "fedavg-disco"
    data = summary([("rho10", "fedavg", 0, 50.0), ("rho10", "fedavg", 1, 52.0),
                    ("rho10", "fedavg-disco", 0, 55.0), ("rho10", "fedavg-disco", 1, 57.0)])
    published = load_published(REPO / "config" / "paper" / "feddisco.csv")
    cells = render_table(spec, data, published, tmp_path / "t9", "paper").set_index("column")
    expected = published[(published["table"] == "Table 9") & (published["column"] == "FedAvg")].set_index("row")
    assert cells.loc["w/o", "ours_mean"] == pytest.approx(51.0)
    assert cells.loc["with", "ours_mean"] == pytest.approx(56.0)
    assert cells.loc["w/o", "paper_mean"] == pytest.approx(expected.loc["Without Disco", "mean"])
    assert cells.loc["with", "paper_mean"] == pytest.approx(expected.loc["With Disco", "mean"])


def test_a_column_can_show_another_accuracy_summary(tmp_path):
    spec = {"name": "t", "caption": "", "paper_table": None, "metric": "best_acc",
            "rows": [{"method": "fedavg", "label": "FedAvg"}],
            "columns": [{"setting": "a", "label": "best"}, {"setting": "a", "label": "last", "metric": "last_k_acc"}]}
    cells = render_table(spec, summary([("a", "fedavg", 0, 60.0)]), None, tmp_path / "t", "embedded")
    assert list(cells["ours_mean"]) == [60.0, 59.0]


def test_rounds_to_target_and_metric_at_round_are_derived_from_the_curves(tmp_path):
    from fedrepro.report.derived import add_derived, metric_key

    runs = pd.DataFrame([dict(study="s", setting="a", method="m", seed=k, round=r, test_acc=acc, client_acc_var=v)
                         for k, curve in enumerate([[(1, 40, 9.0), (2, 56, 7.0), (3, 60, 5.0)],
                                                    [(1, 30, 8.0), (2, 50, 6.0), (3, 58, 4.0)],
                                                    [(1, 20, 3.0), (2, 30, 2.0), (3, 40, 1.0)]])
                         for r, acc, v in curve])
    data = summary([("a", "m", 0, 60.0), ("a", "m", 1, 58.0), ("a", "m", 2, 40.0)])
    spec = {"name": "t3", "caption": "", "paper_table": None, "metric": "best_acc", "target_acc": 55,
            "rows": [{"method": "m", "label": "M"}],
            "columns": [{"setting": "a", "label": "rounds", "metric": "rounds_to_acc"},
                        {"setting": "a", "label": "var@2", "metric": "client_acc_var", "round": 2}]}
    assert [metric_key(spec, c) for c in spec["columns"]] == ["rounds_to_55", "client_acc_var@2"]
    derived = add_derived(spec, data, runs)
    assert list(derived["rounds_to_55"].fillna(-1)) == [2.0, 3.0, -1]  # seed 2 never reaches 55
    assert list(derived["client_acc_var@2"]) == [7.0, 6.0, 2.0]
    cells = render_table(spec, derived, None, tmp_path / "t3", "embedded").set_index("column")
    assert cells.loc["rounds", "ours_mean"] == pytest.approx(2.5) and cells.loc["rounds", "n_seeds"] == 2
    assert cells.loc["var@2", "ours_mean"] == pytest.approx(5.0)


def test_lower_is_better_columns_bold_the_minimum(tmp_path):
    from fedrepro.report.derived import add_derived

    runs = pd.DataFrame([dict(study="s", setting="a", method=m, seed=0, round=r, test_acc=acc)
                         for m, curve in [("fast", [(1, 60)]), ("slow", [(1, 10), (2, 60)])] for r, acc in curve])
    data = summary([("a", "fast", 0, 60.0), ("a", "slow", 0, 60.0)])
    spec = {"name": "t", "caption": "", "paper_table": None, "metric": "best_acc", "target_acc": 55,
            "rows": [{"method": "fast", "label": "fast"}, {"method": "slow", "label": "slow"}],
            "columns": [{"setting": "a", "label": "rounds", "metric": "rounds_to_acc"}]}
    render_table(spec, add_derived(spec, data, runs), None, tmp_path / "t", "embedded")
    md = (tmp_path / "t.md").read_text()
    assert "| fast | **1.00" in md and "| slow | 2.00" in md


def test_small_measured_costs_keep_three_significant_digits():
    """FedL2G's Table 3 at laptop scale: MB and seconds per round of ~0.001 must not print as 0.00, while
    accuracies keep the papers' two decimals."""
    from fedrepro.report.tables import _pm, _signed

    assert _pm(0.001234, 0.0002, " ± ") == "0.00123 ± 0.00020"
    assert _pm(85.456, 0.3, " ± ") == "85.46 ± 0.30" and _pm(0.0, None, " ± ") == "0.00"
    assert _signed(-0.0004567) == "-0.000457" and _signed(3.14159) == "+3.14"


def test_a_cells_method_puts_another_run_in_a_rows_cells_and_beside_its_published_number(tmp_path):
    # FedDisco's Table 1 row is FedDyn + Disco, but SCAFFOLD + Disco on Fashion-MNIST (89.74 there)
    row = {"method": "feddyn-disco", "label": "FedDisco", "paper": "FedDisco",
           "cells": [{"columns": ["fmnist-niid1"], "method": "scaffold-disco"}]}
    spec = {"name": "t1", "caption": "", "paper_table": "Table 1", "metric": "best_acc", "rows": [row],
            "columns": [{"setting": "c10-niid1", "label": "c10", "paper": "CIFAR-10 | NIID-1"},
                        {"setting": "fmnist-niid1", "label": "fmnist", "paper": "Fashion-MNIST | NIID-1"},
                        {"setting": "fmnist-niid1", "label": "fmnist w/o", "method_suffix": "-x"}]}
    assert [cell_method(row, c) for c in spec["columns"]] == ["feddyn-disco", "scaffold-disco", "scaffold-disco-x"]
    data = summary([("c10-niid1", "feddyn-disco", 0, 72.0), ("fmnist-niid1", "feddyn-disco", 0, 10.0),
                    ("fmnist-niid1", "scaffold-disco", 0, 89.0)])
    published = load_published(REPO / "config" / "paper" / "feddisco.csv")
    cells = render_table(spec, data, published, tmp_path / "t1", "paper").set_index("column")
    assert cells.loc["fmnist", "method"] == "scaffold-disco"
    assert cells.loc["fmnist", "ours_mean"] == pytest.approx(89.0)
    assert cells.loc["fmnist", "paper_mean"] == pytest.approx(89.74)
    assert cells.loc["c10", "ours_mean"] == pytest.approx(72.0)


def test_a_not_applicable_cell_is_a_dash_even_where_the_grid_runs_its_method(tmp_path):
    # FedL2G's LG-FedAvg cannot run on HtM10; were its run there made for another table, the cell stays a dash
    from fedrepro.study import table_runs

    row = {"method": "lg_fedavg", "label": "LG-FedAvg", "paper": "LG-FedAvg",
           "cells": [{"columns": ["htm10"], "not_applicable": True}]}
    spec = {"name": "t2", "caption": "", "metric": "best_acc", "rows": [row],
            "columns": [{"setting": "htfe8", "label": "HtFE8"}, {"setting": "htm10", "label": "HtM10"}]}
    assert table_runs(spec) == [("htfe8", "lg_fedavg")]
    data = summary([("htfe8", "lg_fedavg", 0, 40.0), ("htm10", "lg_fedavg", 0, 30.0)])
    cells = render_table(spec, data, None, tmp_path / "t2", "paper").set_index("column")
    assert cells.loc["HtFE8", "ours_mean"] == pytest.approx(40.0)
    assert pd.isna(cells.loc["HtM10", "ours_mean"])
    assert "| LG-FedAvg | 40.00 | — |" in (tmp_path / "t2.md").read_text()


def test_table10_sd_column_is_the_spread_over_a_runs_last_k_rounds_beside_the_papers_pm(tmp_path):
    from fedrepro.report.derived import add_derived, last_k_sd

    # two seeds: seed 0 alternates 50/54 over its last 3 rounds, seed 1 is flat at 60 (sd 0)
    curves = {0: [40, 50, 54, 50], 1: [30, 60, 60, 60]}
    runs = pd.DataFrame([dict(study="s", setting="p", method="fedavg", seed=k, round=r + 1, test_acc=a)
                         for k, accs in curves.items() for r, a in enumerate(accs)])
    assert last_k_sd(runs[runs["seed"] == 0], 3) == pytest.approx(pd.Series([50, 54, 50]).std())
    data = summary([("p", "fedavg", 0, 54.0), ("p", "fedavg", 1, 60.0)])
    spec = {"name": "t10", "caption": "", "paper_table": "Table 10", "metric": "last_k_acc",
            "rows": [{"method": "fedavg", "label": "FedAvg", "paper": "FedAvg"}],
            "columns": [{"setting": "p", "label": "acc", "paper": "Mean ± std (%) | Without Disco"},
                        {"setting": "p", "label": "sd", "metric": "last_k_sd_acc", "paper_value": "std",
                         "paper": "Mean ± std (%) | Without Disco"}]}
    derived = add_derived(spec, data, runs)
    published = load_published(REPO / "config" / "paper" / "feddisco.csv")
    cells = render_table(spec, derived, published, tmp_path / "t10", "paper").set_index("column")
    seed0 = pd.Series([50, 54, 50]).std()
    assert cells.loc["sd", "ours_mean"] == pytest.approx(seed0 / 2)  # mean over seeds of the per-run sd
    assert cells.loc["sd", "paper_mean"] == pytest.approx(3.44) and pd.isna(cells.loc["sd", "paper_std"])
    assert cells.loc["acc", "paper_mean"] == pytest.approx(54.27)  # the mean column keeps the published mean


def test_a_cells_setting_fills_several_columns_with_one_run_beside_the_papers_single_value(tmp_path):
    # Feddle's Table 5 Center: one run per data set (its D(0.1),N(20) setting) fills the data set's columns,
    # beside the paper's one "all settings" number; the other rows keep their own column's run and number
    center = {"method": "center", "label": "Center", "paper": "Center", "cells": [
        {"setting": "c10-d01-n20", "columns": ["c10-d01-n20", "c10-d01-n5"],
         "paper_column": "CIFAR-10 | CNN | all settings (single value)"}]}
    fedavg = {"method": "fedavg", "label": "FedAvg", "paper": "FedAvg"}
    spec = {"name": "t5", "caption": "", "paper_table": "Table 5", "metric": "best_acc", "rows": [center, fedavg],
            "columns": [{"setting": "c10-d01-n20", "label": "N(20)", "paper": "CIFAR-10 | CNN | D(0.1),N(20)"},
                        {"setting": "c10-d01-n5", "label": "N(5)", "paper": "CIFAR-10 | CNN | D(0.1),N(5)"}]}
    data = summary([("c10-d01-n20", "center", 0, 40.0), ("c10-d01-n20", "center", 1, 44.0),
                    ("c10-d01-n20", "fedavg", 0, 30.0), ("c10-d01-n5", "fedavg", 0, 35.0)])
    published = load_published(REPO / "config" / "paper" / "feddle.csv")
    cells = render_table(spec, data, published, tmp_path / "t5", "paper").set_index(["row", "column"])
    for column in ("N(20)", "N(5)"):
        assert cells.loc[("Center", column), "setting"] == "c10-d01-n20"
        assert cells.loc[("Center", column), "ours_mean"] == pytest.approx(42.0)
        assert cells.loc[("Center", column), "paper_mean"] == pytest.approx(42.1)
    assert cells.loc[("FedAvg", "N(5)"), "ours_mean"] == pytest.approx(35.0)
    assert cells.loc[("FedAvg", "N(5)"), "setting"] == "c10-d01-n5"
    assert "Center: one run (setting c10-d01-n20) fills N(20), N(5)" in (tmp_path / "t5.md").read_text()
    # without `columns` an entry fills every column
    assert paper_key({}, {**center, "cells": [{"setting": "c10-d01-n20", "paper_column": "all"}]},
                     spec["columns"][1]) == ("Center", "all")
