"""The results snapshot (fedrepro.report.snapshot): copies one complete run, refuses a partial or stale one by name."""

import json
from pathlib import Path

import pandas as pd
import pytest

from fedrepro.config import REPO, grid_runs, merge_configfiles, resolve_config
from fedrepro.report.integrity import write_checked_csv
from fedrepro.report.snapshot import main, run_digests, snapshot, snapshot_files, snapshot_problems, stale_runs


@pytest.fixture
def config():
    """The embedded default, resolved: FedDisco's 4 train jobs, 2 tables and 2 figures."""
    return resolve_config(merge_configfiles(REPO / "config/config.yaml"))


def fake_run(root: Path, config: dict) -> None:
    """What a finished run of ``config`` leaves: its artifacts, each job's seeds.json and checkpoint markers, and
    each study's summary.csv (one row a run, with the machine it ran on)."""
    for study, spec in config["studies"].items():
        rows = [{"setting": s, "method": m, "seed": seed, "cpu": "Some CPU", "cpu_capability": "AVX2"}
                for s, m in grid_runs(spec) for seed in spec["seeds"]]
        (root / study).mkdir(parents=True, exist_ok=True)
        write_checked_csv(pd.DataFrame(rows), root / study / "summary.csv")
    for f in snapshot_files(config):
        (root / f).parent.mkdir(parents=True, exist_ok=True)
        (root / f).write_text(f"content of {f}")
    for job, digest in run_digests(config).items():
        study, setting, method = job.split("/")
        runs = [{"dir": f"seed{s}", "seed": s, "status": "complete"} for s in config["studies"][study]["seeds"]]
        folder = root / study / "runs" / setting / method
        folder.mkdir(parents=True)
        (folder / "seeds.json").write_text(json.dumps({"job_seconds": 900.0, "runs": runs}))
        marks = root / study / "checkpoints" / setting / method / digest.split()[0]
        marks.mkdir(parents=True)
        (marks / "seed0.done.json").write_text("{}")


def test_a_complete_run_is_copied_with_where_it_came_from(tmp_path, config):
    fake_run(tmp_path / "results", config)
    out = tmp_path / "snap"
    (out / "old-study").mkdir(parents=True)  # an older snapshot's leftovers go
    written = snapshot(config, tmp_path / "results", out, ["config/x.yaml"], "1 h 30 min", commit="abc123")
    assert sorted(p.relative_to(out).as_posix() for p in written) == sorted(
        ["README.md", "runs.json", *(f.as_posix() for f in snapshot_files(config))])
    assert "feddisco/tables/table1.md" in {p.relative_to(out).as_posix() for p in written}
    assert (out / "feddisco/tables/table1.md").read_text() == "content of feddisco/tables/table1.md"
    assert not (out / "old-study").exists()
    readme = (out / "README.md").read_text()
    assert "`abc123`" in readme and "1 h 30 min" in readme and "`config/x.yaml`" in readme
    assert "Some CPU (AVX2): 12 runs" in readme  # 4 jobs x 3 seeds
    assert "| feddisco | 4 | 1.00 |" in readme and "| all | | 1.00 |" in readme  # 4 x 900 s
    assert "(feddisco/tables/table1.md)" in readme and "(feddisco/figures/curves.png)" in readme
    assert stale_runs(config, json.loads((out / "runs.json").read_text())) == []


def test_a_run_missing_a_figure_or_of_another_spec_is_refused_by_name_and_nothing_is_copied(tmp_path, config):
    fake_run(tmp_path / "results", config)
    (tmp_path / "results/feddisco/figures/curves.png").unlink()
    config["studies"]["feddisco"]["methods"]["scaffold"]["hparams"]["x"] = 1  # the config moved on after the run
    with pytest.raises(SystemExit) as err:
        snapshot(config, tmp_path / "results", tmp_path / "snap", ["c.yaml"], "1 h", commit="abc")
    assert "feddisco/figures/curves.png: missing" in str(err.value)
    assert "checkpoints/niid1/scaffold/" in str(err.value)
    assert "no finished seed of the config's run spec" in str(err.value)
    assert "scaffold-disco" not in str(err.value)
    assert not (tmp_path / "snap").exists()


def test_a_changed_run_spec_or_seed_list_makes_the_snapshot_stale_by_name(config):
    recorded = run_digests(config)
    config["studies"]["feddisco"]["settings"]["niid2"]["partition"]["samples"] = 100
    assert stale_runs(config, recorded) == ["feddisco/niid2/scaffold: its spec changed since the snapshot",
                                            "feddisco/niid2/scaffold-disco: its spec changed since the snapshot"]
    config["studies"]["feddisco"]["seeds"] = [0, 1]
    assert len(stale_runs(config, recorded)) == 4
    assert stale_runs(config, {}) == [f"{job}: not in the snapshot" for job in recorded]


def test_an_empty_wall_time_is_refused_before_anything_is_read(tmp_path, capsys):
    with pytest.raises(SystemExit):
        main(["--configfile", "config/laptop-full.yaml", "--out", str(tmp_path / "snap"), "--wall-time", " "])
    assert "--wall-time is empty" in capsys.readouterr().err
    assert not (tmp_path / "snap").exists()


def test_the_committed_laptop_full_snapshot_is_a_run_of_the_config_as_it_is():
    """docs/results/laptop-full/ holds every table and figure of config/laptop-full.yaml, from train jobs of the
    specs and seeds configured now: a change that moves its numbers fails here until it is regenerated
    (`make snapshot-laptop-full`)."""
    config = resolve_config(merge_configfiles(REPO / "config/config.yaml", REPO / "config/laptop-full.yaml"))
    snap = REPO / "docs/results/laptop-full"
    assert snapshot_problems(config, snap) == []
    assert stale_runs(config, json.loads((snap / "runs.json").read_text())) == []
