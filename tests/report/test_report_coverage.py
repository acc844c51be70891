"""Published cells shown: of each paper's published cells, those set beside one of our table cells."""

from __future__ import annotations

import copy
import subprocess
import sys

import pandas as pd
import yaml
from support.common import REPO

from fedrepro.config import merge_configfiles, resolve_config
from fedrepro.report.coverage import Coverage, config_coverage, shown_keys, study_coverage
from fedrepro.report.scorecard import build_scorecard


def embedded() -> dict:
    return yaml.safe_load((REPO / "config" / "config.yaml").read_text())


def test_a_published_cell_counts_once_when_a_table_cell_maps_to_it(tmp_path):
    (tmp_path / "p.csv").write_text("paper,table,row,column,mean,std,unit\n"
                                    "p,Table 1,A,X,1,,acc%\np,Table 1,B,X,2,,acc%\np,Table 1,A,Y,3,,acc%\n"
                                    "p,Table 2,A,X,4,,acc%\n")
    table = {"paper_table": "Table 1", "rows": [{"method": "a", "paper": "A"}, {"method": "b", "paper": None}],
             "columns": [{"setting": "x", "paper": "X"}, {"setting": "z", "paper": "Z"}]}
    study = {"paper": "p", "tables": {"t": table, "again": copy.deepcopy(table),
                                      "unmapped": {**table, "paper_table": None}}}
    assert shown_keys(study) == {("Table 1", "A", "X"), ("Table 1", "A", "Z")}
    assert study_coverage(study, tmp_path) == Coverage(1, 4)  # (A, Z) is no published cell; B has no paper row
    assert str(Coverage(1, 4)) == "published cells shown: 1 / 4"
    assert study_coverage({"paper": None, "tables": {"t": table}}, tmp_path) == Coverage(0, 0)


def test_the_shipped_configs_show_part_of_every_paper():
    paper = yaml.safe_load((REPO / "config" / "paper.yaml").read_text())
    counts = {"embedded": config_coverage(resolve_config(embedded())),
              "paper": config_coverage(resolve_config(paper))}
    for scale, coverage in counts.items():
        for study, c in coverage.items():
            total = len(pd.read_csv(REPO / "config" / "paper" / f"{study}.csv"))
            assert 0 < c.shown <= c.total == total, (scale, study, c)
    for study, c in counts["embedded"].items():  # paper scale declares at least the embedded tables' cells
        assert c.shown <= counts["paper"][study].shown


def test_cli_prints_per_study_and_overall_counts():
    proc = subprocess.run([sys.executable, "-m", "fedrepro.report.coverage", "--configfile",
                           str(REPO / "config" / "paper.yaml")], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert [line.split()[0] for line in lines] == ["feddisco", "fedgtst", "fedl2g", "feddle", "all"]
    shown = [int(line.split("shown: ")[1].split(" / ")[0]) for line in lines]
    assert sum(shown[:-1]) == shown[-1] and lines[-1].endswith("(paper scale)")


def test_the_scorecard_prints_the_counts_per_study_and_overall(tmp_path):
    spec = {"name": "t", "caption": "t", "paper_table": "Table 1", "metric": "final_acc", "claims": [],
            "rows": [{"method": "a", "label": "A"}], "columns": [{"setting": "x", "label": "X"}]}
    cells = tmp_path / "t.csv"
    pd.DataFrame([{"row": "A", "column": "X", "n_seeds": 1, "ours_mean": 50.0, "ours_std": 0.0,
                   "paper_mean": 60.0, "paper_std": float("nan"), "diff": -10.0, "status": "ok", "method": "a",
                   "setting": "x", "n_diverged": 0}]).to_csv(cells, index=False)
    build_scorecard([("s1", spec, cells), ("s2", spec, cells)], "paper", tmp_path / "sc.md", tmp_path / "sc.html",
                    {"s1": (1, 10), "s2": (3, 5)})
    md = (tmp_path / "sc.md").read_text()
    assert "Published cells shown, all studies (paper scale): 4 / 15." in md
    assert "## s1\n\nPublished cells shown: 1 / 10." in md and "## s2\n\nPublished cells shown: 3 / 5." in md
    assert "Published cells shown: 3 / 5." in (tmp_path / "sc.html").read_text()


def test_a_study_of_ones_own_counts_no_published_cells_and_heads_its_claims_as_its_own(tmp_path):
    own = resolve_config(merge_configfiles(REPO / "config" / "config.yaml", REPO / "config" / "examples" /
                                           "own-study.yaml"))
    assert config_coverage(own) == {}  # paper: null
    named = copy.deepcopy(own["studies"]["own"])
    named["paper"] = "feddisco"  # names a paper but mirrors none of its tables
    assert config_coverage({"studies": {"own": named}}) == {}
    spec = {"name": "t", "caption": "t", "paper_table": None, "metric": "final_acc",
            "claims": [{"better": "b", "than": "a"}],
            "rows": [{"method": "a", "label": "A"}, {"method": "b", "label": "B"}],
            "columns": [{"setting": "x", "label": "X"}]}
    cells = tmp_path / "t.csv"
    pd.DataFrame([{"row": r, "column": "X", "n_seeds": 3, "ours_mean": m, "ours_std": 0.5,
                   "paper_mean": float("nan"), "paper_std": float("nan"), "diff": float("nan"), "status": "ok",
                   "method": r.lower(), "setting": "x", "n_diverged": 0}
                  for r, m in (("A", 50.0), ("B", 60.0))]).to_csv(cells, index=False)
    build_scorecard([("own", spec, cells)], "embedded", tmp_path / "sc.md", tmp_path / "sc.html", {})
    md = (tmp_path / "sc.md").read_text()
    assert "Published cells shown" not in md
    assert "Ranking claims of this study (its own, no paper's): 1 of 1 hold" in md
