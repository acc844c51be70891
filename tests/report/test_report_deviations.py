"""docs/deviations.md and the links to its rows that tables' and figures' captions carry."""

from __future__ import annotations

import copy
import os
import re

import pandas as pd
import pytest
import yaml
from support.common import REPO

from fedrepro.config import resolve_config
from fedrepro.report.captions import figure_caption, table_caption
from fedrepro.report.deviations import deviation_href, deviation_ids
from fedrepro.report.figures import figure_title
from fedrepro.report.tables import render_table
from fedrepro.study import ConfigError

KNOWN = "D-feddisco-feddc-no-correction"


@pytest.fixture
def config() -> dict:
    return yaml.safe_load((REPO / "config" / "config.yaml").read_text())


def test_the_page_is_one_table_whose_ids_carry_their_lower_cased_anchor():
    text = (REPO / "docs" / "deviations.md").read_text()
    assert text.count("| id | what differs | why | tables touched | expected direction |") == 1
    rows = [line for line in text.splitlines() if line.startswith("| <a id=")]
    assert len(rows) == len(deviation_ids()) >= 5
    for line in rows:
        anchor, name = re.match(r'\| <a id="([^"]+)"></a>(D-\S+) \|', line).groups()
        assert anchor == name.lower() and line.count(" | ") == 4  # five cells


def test_tables_and_figures_may_name_only_rows_of_the_page(config):
    assert KNOWN in deviation_ids()
    ok = copy.deepcopy(config)
    ok["studies"]["feddisco"]["figures"]["curves"]["deviations"] = [KNOWN]
    assert resolve_config(ok)["studies"]["feddisco"]["figures"]["curves"]["deviations"] == [KNOWN]
    bad = copy.deepcopy(config)
    bad["studies"]["feddisco"]["tables"]["table1"]["deviations"] = ["D-feddisco-no-such-row"]
    with pytest.raises(ConfigError, match=r"studies\.feddisco\.tables\.table1\.deviations: unknown deviation "
                                          r"'D-feddisco-no-such-row'.*not a row of docs/deviations\.md"):
        resolve_config(bad)
    bad = copy.deepcopy(config)
    bad["studies"]["feddisco"]["tables"]["table1"]["rows"][0]["deviations"] = ["D-feddisco-no-such-row"]
    with pytest.raises(ConfigError, match=r"tables\.table1\.rows\.0\.deviations: unknown deviation "
                                          r"'D-feddisco-no-such-row'"):
        resolve_config(bad)
    bad = copy.deepcopy(config)
    bad["studies"]["feddisco"]["figures"]["curves"]["deviations"] = ["not an id"]
    with pytest.raises(ConfigError, match="figures.curves.deviations.0"):
        resolve_config(bad)


def test_tables_link_each_deviation_in_md_and_html_and_name_it_in_tex(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # the working directory (the checkout); tables lie under its results root
    summary = pd.DataFrame({"study": "s", "setting": "niid1", "method": ["fedavg", "fedprox"], "seed": 0,
                            "status": "complete", "diverged_round": float("nan"), "final_acc": [50.0, 60.0]})
    spec = {"name": "t1", "caption": "T", "paper_table": None, "metric": "final_acc", "deviations": [KNOWN],
            "rows": [{"method": "fedavg", "label": "FedAvg"}, {"method": "fedprox", "label": "FedProx"}],
            "columns": [{"setting": "niid1", "label": "NIID-1"}]}
    for root in ("results", "results/paper"):
        render_table(spec, summary, None, tmp_path / root / "s" / "tables" / "t1", "paper")
        up = "../" * (3 if root == "results" else 4)
        href = f"{up}docs/deviations.md#{KNOWN.lower()}"
        out = tmp_path / root / "s" / "tables"
        assert f"Deviations from the paper: [{KNOWN}]({href})." in (out / "t1.md").read_text()
        assert f'<a href="{href}">{KNOWN}</a>' in (out / "t1.html").read_text()
        assert f"{KNOWN} (docs/deviations.md\\#{KNOWN.lower()})" in (out / "t1.tex").read_text()
        assert os.path.normpath(out / href.split("#")[0]) == str(tmp_path / "docs" / "deviations.md")
    render_table({**spec, "deviations": []}, summary, None, tmp_path / "plain", "paper")
    assert "Deviations" not in (tmp_path / "plain.md").read_text()
    # a row's own deviations are linked after the table's
    rows = [spec["rows"][0], {**spec["rows"][1], "deviations": ["D-feddle-vit-in1k", KNOWN]}]
    render_table({**spec, "rows": rows}, summary, None, tmp_path / "rows", "paper")
    assert (f"Deviations from the paper: [{KNOWN}](" in (tmp_path / "rows.md").read_text()
            and "), [D-feddle-vit-in1k](" in (tmp_path / "rows.md").read_text())


def test_report_and_figure_captions_link_each_deviation():
    import docutils.core

    spec = {"name": "t1", "caption": "T", "paper_table": "Table 1", "metric": "best_acc", "columns": [],
            "deviations": [KNOWN, "D-feddle-vit-in1k"]}
    for cap in (table_caption(spec, "paper", "results/paper"),
                figure_caption({"name": "f", "kind": "curve", "deviations": spec["deviations"]}, "paper",
                               "results/paper")):
        html = docutils.core.publish_parts(cap["deviations"], writer="html")["body"]
        assert f'<a class="reference external" href="../../docs/deviations.md#{KNOWN.lower()}">{KNOWN}</a>' in html
        assert 'href="../../docs/deviations.md#d-feddle-vit-in1k"' in html
    assert table_caption({**spec, "deviations": []}, "paper")["deviations"] == ""
    assert figure_title({"caption": "Fig. 1", "deviations": [KNOWN]}) == (
        f"Fig. 1\nDeviations from the paper: {KNOWN} (docs/deviations.md#{KNOWN.lower()}).")
    assert deviation_href(KNOWN) == f"docs/deviations.md#{KNOWN.lower()}"
