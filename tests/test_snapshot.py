"""The results snapshot (fedrepro.report.snapshot): copies one complete run, refuses a partial one by name."""

import json
from pathlib import Path

import pytest

from fedrepro.report.snapshot import snapshot, snapshot_files

CONFIG = {"studies": {
    "alpha": {"tables": {"table1": {"caption": "Table 1: accuracy"}}, "figures": {"curves": {"caption": None}}},
    "beta": {"tables": {"table5": {"caption": None}}, "figures": {}},
}}


def fake_run(root: Path) -> None:
    for f in snapshot_files(CONFIG):
        (root / f).parent.mkdir(parents=True, exist_ok=True)
        (root / f).write_text(f"content of {f}")
    for study, seconds in (("alpha", 3600.0), ("beta", 1800.0)):
        job = root / study / "runs" / "s1" / "m1"
        runs = [{"dir": f"seed{i}", "seed": i, "status": "complete"} for i in range(2)]
        job.mkdir(parents=True)
        (job / "seeds.json").write_text(json.dumps({"job_seconds": seconds, "runs": runs}))
        for run in runs:
            (job / run["dir"]).mkdir()
            (job / run["dir"] / "summary.json").write_text(json.dumps(
                {"device": "cpu", "machine": {"cpu": "Some CPU", "cpu_capability": "AVX2"}}))


def test_a_complete_run_is_copied_with_where_it_came_from(tmp_path):
    fake_run(tmp_path / "results")
    out = tmp_path / "snap"
    (out / "old-study").mkdir(parents=True)  # an older snapshot's leftovers go
    written = snapshot(CONFIG, tmp_path / "results", out, ["config/x.yaml"], "1 h 30 min", commit="abc123")
    assert sorted(p.relative_to(out).as_posix() for p in written) == [
        "README.md", "alpha/figures/curves.png", "alpha/tables/table1.md", "beta/tables/table5.md", "scorecard.md"]
    assert (out / "alpha/tables/table1.md").read_text() == "content of alpha/tables/table1.md"
    assert not (out / "old-study").exists()
    readme = (out / "README.md").read_text()
    assert "`abc123`" in readme and "1 h 30 min" in readme and "`config/x.yaml`" in readme
    assert "Some CPU (AVX2), cpu: 4 runs" in readme
    assert "| alpha | 1 | 1.00 |" in readme and "| beta | 1 | 0.50 |" in readme and "| all | | 1.50 |" in readme
    assert "[Table 1: accuracy](alpha/tables/table1.md)" in readme and "(alpha/figures/curves.png)" in readme


def test_a_run_missing_a_table_or_a_figure_is_refused_by_name_and_nothing_is_copied(tmp_path):
    fake_run(tmp_path / "results")
    (tmp_path / "results/alpha/figures/curves.png").unlink()
    (tmp_path / "results/beta/tables/table5.md").unlink()
    with pytest.raises(SystemExit) as err:
        snapshot(CONFIG, tmp_path / "results", tmp_path / "snap", ["c.yaml"], "1 h", commit="abc")
    assert "beta/tables/table5.md: missing" in str(err.value)
    assert "alpha/figures/curves.png: missing" in str(err.value)
    assert not (tmp_path / "snap").exists()
