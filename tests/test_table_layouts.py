"""Table layouts that differ from the paper's: transposed tables and with/without column pairs still find
the right published cell."""

from __future__ import annotations

import pandas as pd
import pytest
from conftest import REPO

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
