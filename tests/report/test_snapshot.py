"""The results snapshot (fedrepro.report.snapshot): copies one complete run, refuses a partial or stale one by name."""

import copy
import json
import math
import shutil
from pathlib import Path

import pandas as pd
import pytest
import yaml
from support.common import laptop_full_config
from support.report import make_run

from fedrepro.config import REPO, command_config, merge_configfiles, resolve_config
from fedrepro.report.archive import archive_problems
from fedrepro.report.integrity import write_checked_csv
from fedrepro.report.scorecard import render_markdown, score_table
from fedrepro.report.snapshot import (
    finished_seeds_folder,
    main,
    parts_problems,
    prune,
    refresh,
    relinked,
    run_digests,
    snapshot,
    snapshot_files,
    snapshot_parts,
    snapshot_problems,
    splice_scorecard,
    stale_runs,
)
from fedrepro.study import grid_runs


@pytest.fixture
def config():
    """The embedded default, resolved: FedDisco's 2 train jobs, 2 tables and 2 figures."""
    return resolve_config(merge_configfiles(REPO / "config/config.yaml"))


def fake_run(root: Path, config: dict, tag: str = "", seconds: float = 900.0, cpu: str = "Some CPU") -> None:
    """What a finished run of ``config`` leaves: its artifacts (a scorecard with a section per study), each job's
    seeds.json and checkpoint markers, and each study's summary.csv (one row a run, with the machine it ran on)."""
    for study, spec in config["studies"].items():
        rows = [{"setting": s, "method": m, "seed": seed, "cpu": cpu, "cpu_capability": "AVX2"}
                for s, m in grid_runs(spec) for seed in spec["seeds"]]
        (root / study).mkdir(parents=True, exist_ok=True)
        write_checked_csv(pd.DataFrame(rows), root / study / "summary.csv")
    for f in snapshot_files(config):
        if f.suffix == ".json" and (root / f).is_file():
            continue  # a tuning stage's choice, written by finish_stage: the runs trained with it
        (root / f).parent.mkdir(parents=True, exist_ok=True)
        (root / f).write_text(f"content of {f} {tag}")
    n = len(config["studies"])
    sections = [[f"## {study}", "", "Published cells shown: 1 / 10.", "", f"cells of {study} {tag}", "",
                 "### Convergence", "", f"plateaus of {study} {tag}", ""] for study in config["studies"]]
    (root / "scorecard.md").write_text("\n".join(
        ["# Scorecard", "", f"Published cells shown, all studies (embedded scale): {n} / {10 * n}.", "",
         *(line for section in sections for line in section)]))
    for job in run_digests(config):
        study, setting, method = job.split("/")
        runs = [{"dir": f"seed{s}", "seed": s, "status": "complete"} for s in config["studies"][study]["seeds"]]
        folder = root / study / "runs" / setting / method
        folder.mkdir(parents=True)
        (folder / "seeds.json").write_text(json.dumps({"job_seconds": seconds, "runs": runs}))
        marks = finished_seeds_folder(config, root, job)  # a tuned run's: under its stages' choices
        marks.mkdir(parents=True)
        (marks / "seed0.done.json").write_text("{}")


def test_a_complete_run_is_copied_with_where_it_came_from(tmp_path, config):
    fake_run(tmp_path / "results", config)
    out = tmp_path / "snap"
    (out / "old-study").mkdir(parents=True)  # an older snapshot's leftovers go
    written = snapshot(config, tmp_path / "results", out, ["config/x.yaml"], "1 h 30 min", commit="abc123")
    assert sorted(p.relative_to(out).as_posix() for p in written) == sorted(
        ["README.md", "runs.json", "provenance.json", *(f.as_posix() for f in snapshot_files(config))])
    assert "feddisco/tables/table1.md" in {p.relative_to(out).as_posix() for p in written}
    assert (out / "feddisco/tables/table1.md").read_text() == "content of feddisco/tables/table1.md "
    assert not (out / "old-study").exists()
    readme = (out / "README.md").read_text()
    assert "`abc123`" in readme and "1 h 30 min" in readme and "`config/x.yaml`" in readme
    assert "Some CPU (AVX2): 6 runs" in readme  # 2 jobs x 3 seeds
    assert "| feddisco | 2 | 0.50 |" in readme and "| all | | 0.50 |" in readme  # 2 x 900 s
    assert "(feddisco/tables/table1.md)" in readme and "(feddisco/figures/curves.png)" in readme
    assert stale_runs(config, json.loads((out / "runs.json").read_text()), out) == []


def test_a_copied_tables_links_out_of_the_run_still_reach_their_files(tmp_path, config, monkeypatch):
    """A table links docs/deviations.md relative to where it was rendered (results/<root>/<study>/tables/); its copy
    sits elsewhere (docs/results/<root>/...), so the link is rewritten to reach the same file from there."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs/deviations.md").write_text("rows")
    results = tmp_path / "results/root"
    fake_run(results, config)
    table = results / "feddisco/tables/table1.md"
    table.write_text("[D-x](../../../../docs/deviations.md#d-x), [plain](https://example.org/a.md), "
                     "[sibling](table2.md), ![fig](../figures/curves.png)")
    assert (table.parent / "../../../../docs/deviations.md").resolve().is_file()
    out = tmp_path / "docs/results/root"
    snapshot(config, results, out, ["c.yaml"], "1 h", commit="abc")
    copied = (out / "feddisco/tables/table1.md").read_text()
    assert copied == ("[D-x](../../../../deviations.md#d-x), [plain](https://example.org/a.md), "
                      "[sibling](table2.md), ![fig](../figures/curves.png)")
    assert (out / "feddisco/tables/../../../../deviations.md").resolve().is_file()
    assert relinked(copied, out / "feddisco/tables", out / "feddisco/tables", out) == copied  # already in place


def test_a_run_missing_a_figure_or_of_another_spec_is_refused_by_name_and_nothing_is_copied(tmp_path, config):
    fake_run(tmp_path / "results", config)
    (tmp_path / "results/feddisco/figures/curves.png").unlink()
    config["studies"]["feddisco"]["methods"]["fedavg"]["hparams"]["x"] = 1  # the config moved on after the run
    with pytest.raises(SystemExit) as err:
        snapshot(config, tmp_path / "results", tmp_path / "snap", ["c.yaml"], "1 h", commit="abc")
    assert "feddisco/figures/curves.png: missing" in str(err.value)
    assert "checkpoints/niid2/fedavg/" in str(err.value)
    assert "no finished seed of the config's run spec" in str(err.value)
    assert "fedavg-disco" not in str(err.value)
    assert not (tmp_path / "snap").exists()


def test_a_changed_run_spec_or_seed_list_makes_the_snapshot_stale_by_name(config):
    recorded = run_digests(config)
    config["studies"]["feddisco"]["settings"]["niid2"]["partition"]["samples"] = 100
    assert stale_runs(config, recorded) == ["feddisco/niid2/fedavg: its spec changed since the snapshot",
                                            "feddisco/niid2/fedavg-disco: its spec changed since the snapshot"]
    config["studies"]["feddisco"]["seeds"] = [0, 1]
    assert len(stale_runs(config, recorded)) == 2
    assert stale_runs(config, {}) == [f"{job}: not in the snapshot" for job in recorded]


@pytest.fixture
def tuned_config():
    """tests/data/tuning_study.yaml resolved: study "tiny", stages clients (FedAvg's lr) and prox (FedProx's mu)."""
    return resolve_config({"studies": {"tiny": yaml.safe_load((REPO / "tests/data/tuning_study.yaml").read_text())}})


def finish_stage(root: Path, config: dict, stage: str, tag: str = "") -> None:
    """What a finished tuning stage leaves in a results root: its choice (the first grid point's), table and
    scores, and its runs' markers (where its runs leave them, under the choices they trained with), seeds.json
    and summary.csv (fake_run's)."""
    name = f"tiny--tune-{stage}"
    variant = next(v for variants in config["tuning_studies"][name]["sweeps"].values() for v in variants)
    (root / "tiny/tuning").mkdir(parents=True, exist_ok=True)
    chosen = {stage_method: {"variant": variant["method"], "values": variant["values"], "score": 50.0}
              for stage_method in config["tuning_studies"][name]["sweeps"]}
    (root / f"tiny/tuning/{stage}.json").write_text(json.dumps({"chosen": chosen}))
    for suffix in (".md", ".csv"):
        (root / f"tiny/tuning/{stage}{suffix}").write_text(f"{stage}{suffix} {tag}")
    fake_run(root, {"studies": {name: config["tuning_studies"][name]}, "tuning_studies": {}})


def test_a_stages_snapshot_copies_the_finished_stages_and_adds_later_ones_to_them(tmp_path, tuned_config):
    """A study run in parts: the first call copies the one finished stage; the next, from a results root that no
    longer has it (another machine), adds the stage finished since and keeps the first."""
    out = tmp_path / "snap"
    with pytest.raises(SystemExit, match="no tuning stage .* has finished"):
        snapshot_parts(tuned_config, tmp_path / "empty", out, ["c.yaml"], commit="abc")
    finish_stage(tmp_path / "first", tuned_config, "clients")
    (tmp_path / "first/tiny/tuning/prox.md").parent.mkdir(parents=True, exist_ok=True)
    (tmp_path / "first/tiny/tuning/prox.md").write_text("a table without its runs is no finished stage")
    written = snapshot_parts(tuned_config, tmp_path / "first", out, ["c.yaml"], commit="abc")
    assert sorted(p.relative_to(out).as_posix() for p in written) == [
        "README.md", "provenance.json", "runs.json", "tiny/tuning/clients.csv", "tiny/tuning/clients.json",
        "tiny/tuning/clients.md"]
    assert "Stages not yet finished: `tiny/prox`." in (out / "README.md").read_text()
    assert parts_problems(tuned_config, out) == []

    (tmp_path / "second/tiny/tuning").mkdir(parents=True)  # the clients' choice, not its runs: no finished stage
    shutil.copyfile(tmp_path / "first/tiny/tuning/clients.json", tmp_path / "second/tiny/tuning/clients.json")
    finish_stage(tmp_path / "second", tuned_config, "prox")
    snapshot_parts(tuned_config, tmp_path / "second", out, ["c.yaml"], commit="def")
    assert (out / "tiny/tuning/clients.md").read_text() == "clients.md "  # kept from the first call
    snapshot_parts(tuned_config, tmp_path / "second", out, ["c.yaml"], commit="ghi")
    stages = json.loads((out / "provenance.json").read_text())["stages"]  # the same runs keep where they came from
    assert (stages["tiny--tune-clients"]["commit"], stages["tiny--tune-prox"]["commit"]) == ("abc", "def")
    assert sorted(json.loads((out / "provenance.json").read_text())["stages"]) == ["tiny--tune-clients",
                                                                                 "tiny--tune-prox"]
    readme = (out / "README.md").read_text()
    assert "Every stage has finished." in readme and "`abc`" in readme and "`def`" in readme
    assert parts_problems(tuned_config, out) == []


def test_a_stages_snapshot_of_a_grid_changed_since_is_refused_by_the_check_and_dropped_by_the_next_call(
        tmp_path, tuned_config):
    out = tmp_path / "snap"
    finish_stage(tmp_path / "results", tuned_config, "clients")
    snapshot_parts(tuned_config, tmp_path / "results", out, ["c.yaml"], commit="abc")
    edited = copy.deepcopy(tuned_config)  # the clients' tuning setting changes after the snapshot
    edited["tuning_studies"]["tiny--tune-clients"]["settings"]["iid"]["partition"]["clients"] = 4
    assert parts_problems(edited, out) == [f"tiny--tune-clients/iid/fedavg-lr{lr}: its spec, or a choice it trains "
                                           "with, changed since the snapshot" for lr in ("0.001", "0.1")]
    (tmp_path / "later/tiny/tuning").mkdir(parents=True)  # the clients' choice, not its runs of the new spec
    shutil.copyfile(tmp_path / "results/tiny/tuning/clients.json", tmp_path / "later/tiny/tuning/clients.json")
    finish_stage(tmp_path / "later", edited, "prox")  # prox trained with a choice of the old spec: not finished
    with pytest.raises(SystemExit, match="no tuning stage .* has finished"):
        snapshot_parts(edited, tmp_path / "later", out, ["c.yaml"], commit="def")
    finish_stage(tmp_path / "again", edited, "clients", tag="again")  # the clients' stage run at the new spec
    snapshot_parts(edited, tmp_path / "again", out, ["c.yaml"], commit="ghi")
    assert (out / "tiny/tuning/clients.md").read_text() == "clients.md again"  # the old spec's copy replaced
    assert parts_problems(edited, out) == []
    (out / "tiny/tuning/clients.csv").unlink()
    assert parts_problems(edited, out) == [f"{out / 'tiny/tuning/clients.csv'}: missing"]


def test_a_stage_run_again_with_another_choice_drops_the_stages_that_trained_with_the_old_one(tmp_path, tuned_config):
    """The clients' stage, widened after prox's runs trained with its first choice, chooses another point: prox's
    runs are of the config's spec still, but not of the choice the snapshot now holds, so the check names them
    and the next call drops prox until it is run again."""
    results, out = tmp_path / "results", tmp_path / "snap"
    finish_stage(results, tuned_config, "clients")
    finish_stage(results, tuned_config, "prox")
    snapshot_parts(tuned_config, results, out, ["c.yaml"], commit="abc")
    assert parts_problems(tuned_config, out) == []
    choice = json.loads((out / "tiny/tuning/clients.json").read_text())
    choice["chosen"]["fedavg"] |= {"variant": "fedavg-lr0.1", "values": {"training.lr": 0.1}}
    (out / "tiny/tuning/clients.json").write_text(json.dumps(choice))  # as if copied from the stage run again
    assert parts_problems(tuned_config, out) == [
        f"tiny--tune-prox/iid/fedprox-mu{mu}: its spec, or a choice it trains with, changed since the snapshot"
        for mu in ("0.0", "1.0")]
    again = tmp_path / "again"  # the clients' stage run again, choosing lr 0.1; prox not yet
    shutil.copytree(results, again)
    (again / "tiny/tuning/clients.json").write_text(json.dumps(choice))
    snapshot_parts(tuned_config, again, out, ["c.yaml"], commit="def")
    assert sorted(json.loads((out / "provenance.json").read_text())["stages"]) == ["tiny--tune-clients"]
    assert not (out / "tiny/tuning/prox.json").exists() and parts_problems(tuned_config, out) == []


def test_a_parts_snapshot_renders_each_table_from_the_jobs_finished_so_far(tmp_path, tuned_config):
    """tiny's table t1 (FedAvg, FedProx): with only FedAvg's job finished, its progress table shows FedAvg's cell,
    a dash for FedProx's and how many of its jobs it holds, and runs.json holds FedAvg's job, checked."""
    results, out = tmp_path / "results", tmp_path / "snap"
    finish_stage(results, tuned_config, "clients")
    for seed, accs in ((0, [40.0, 60.0, 70.0]), (1, [42.0, 58.0, 72.0])):
        make_run(results, "iid", "fedavg", seed, accs, study="tiny")
    (results / "tiny/runs/iid/fedavg/seeds.json").write_text(json.dumps(
        {"runs": [{"seed": s, "dir": f"seed{s}", "status": "complete"} for s in (0, 1)]}))
    marks = finished_seeds_folder(tuned_config, results, "tiny/iid/fedavg")
    marks.mkdir(parents=True)
    (marks / "seed0.done.json").write_text("{}")
    snapshot_parts(tuned_config, results, out, ["c.yaml"], commit="abc")
    assert not (out / "tiny/progress/t1.md").exists()  # seed 1 has not finished: FedAvg's job has not
    (marks / "seed1.done.json").write_text("{}")
    snapshot_parts(tuned_config, results, out, ["c.yaml"], commit="abc")
    table = (out / "tiny/progress/t1.md").read_text()
    assert "In progress: 1 of the table's 2 train jobs have finished" in table
    cells = pd.read_csv(out / "tiny/progress/t1.csv").set_index("method")
    assert cells.loc["fedavg", "ours_mean"] == pytest.approx(71.0) and cells.loc["fedavg", "n_seeds"] == 2
    assert cells.loc["fedprox", "n_seeds"] == 0
    assert "| [tiny/t1](tiny/progress/t1.md) | 1 of 2 |" in (out / "README.md").read_text()
    assert "tiny/iid/fedavg" in json.loads((out / "runs.json").read_text())
    assert parts_problems(tuned_config, out) == []
    tuned_config["studies"]["tiny"]["settings"]["iid"]["partition"]["clients"] = 4  # the study's runs move on
    assert ("tiny/iid/fedavg: its spec, or a choice it trains with, changed since the snapshot"
            in parts_problems(tuned_config, out))


def test_a_complete_snapshot_of_a_tuned_study_holds_its_choices_and_the_runs_trained_with_them(tmp_path, tuned_config):
    """A complete run of a study with tuning stages: the snapshot copies each stage's table and choice, and holds each
    tuned job with the choices it trained with, so a choice changed since is named by the check."""
    results, out = tmp_path / "results", tmp_path / "snap"
    finish_stage(results, tuned_config, "clients")
    finish_stage(results, tuned_config, "prox")
    fake_run(results, {**tuned_config, "tuning_studies": {}})
    snapshot(tuned_config, results, out, ["c.yaml"], "1 h", commit="abc")
    assert json.loads((out / "tiny/tuning/clients.json").read_text()) == json.loads(
        (results / "tiny/tuning/clients.json").read_text())
    held = json.loads((out / "runs.json").read_text())
    assert " tuned " in held["tiny/iid/fedprox"] and stale_runs(tuned_config, held, out) == []
    choice = json.loads((out / "tiny/tuning/prox.json").read_text())
    choice["chosen"]["fedprox"] |= {"variant": "fedprox-mu1.0", "values": {"hparams.mu": 1.0}}
    (out / "tiny/tuning/prox.json").write_text(json.dumps(choice))
    assert stale_runs(tuned_config, held, out) == [f"tiny/{s}/fedprox: its spec changed since the snapshot"
                                                   for s in tuned_config["studies"]["tiny"]["settings"]]


def test_an_empty_wall_time_is_refused_before_anything_is_read(tmp_path, capsys):
    with pytest.raises(SystemExit):
        main(["--configfile", "config/laptop-full.yaml", "--out", str(tmp_path / "snap"), "--wall-time", " "])
    assert "--wall-time is empty" in capsys.readouterr().err
    assert not (tmp_path / "snap").exists()


@pytest.mark.parametrize("name", ["laptop-full", "laptop-feddle-600"])
def test_the_committed_snapshot_is_a_run_of_the_config_as_it_is(name):
    """docs/results/<name>/ holds every table and figure of config/<name>.yaml, from train jobs of the specs and
    seeds configured now: a change that moves its numbers fails here until it is regenerated (laptop-full: `make
    snapshot-laptop-full`; README)."""
    config = resolve_config(merge_configfiles("config/config.yaml", f"config/{name}.yaml", root=REPO))
    snap = REPO / "docs/results" / name
    assert snapshot_problems(config, snap) == []
    assert stale_runs(config, json.loads((snap / "runs.json").read_text()), snap) == []
    provenance = json.loads((snap / "provenance.json").read_text())
    assert sorted(provenance) == sorted(config["studies"])


def test_the_committed_parts_snapshot_of_feddles_table5_is_of_the_config_as_it_is():
    """docs/results/laptop-feddle-table5/ holds the tuning stages of config/laptop-feddle-table5.yaml finished so far
    (`make snapshot-laptop-feddle-table5-parts`), each from runs of the specs configured now: a change to a stage's
    grid, settings or seeds fails here until the stage is run and copied again."""
    config = resolve_config(merge_configfiles("config/config.yaml", "config/laptop-feddle-table5.yaml", root=REPO))
    snap = REPO / "docs/results/laptop-feddle-table5"
    assert json.loads((snap / "provenance.json").read_text())["stages"], "no stage recorded"
    assert parts_problems(config, snap) == []


def scores_of(study: str, ours: list[float]) -> list:
    """One scored table of ``study``: rows a, b, c in one column, 3 seeds each, with the claim "a is best"."""
    spec = {"name": "t", "caption": "T", "paper_table": "Table 1", "metric": "best_acc",
            "rows": [{"method": m, "label": m.upper()} for m in "abc"], "columns": [{"setting": "s", "label": "S"}],
            "claims": [{"best": "a", "text": "a is best"}]}
    cells = pd.DataFrame([{"row": m.upper(), "column": "S", "method": m, "setting": "s", "n_seeds": 3,
                           "ours_mean": v, "ours_std": 0.5, "paper_mean": 72.0 - i, "paper_std": math.nan,
                           "status": "ok"} for i, (m, v) in enumerate(zip("abc", ours, strict=True))])
    return [score_table(study, spec, cells)]


def test_a_spliced_scorecard_equals_the_one_rendered_from_every_study_at_once():
    old_x, new_x, y = scores_of("x", [71, 70, 69]), scores_of("x", [74, 76, 75]), scores_of("y", [60, 61, 62])
    old = render_markdown(old_x + y, "embedded", {"x": (1, 3), "y": (2, 5)})
    alone = render_markdown(new_x, "embedded", {"x": (3, 3)})  # the refreshed study's run: its section only
    spliced = splice_scorecard(old, alone, ["x"])
    assert spliced == render_markdown(new_x + y, "embedded", {"x": (3, 3), "y": (2, 5)})
    assert "all studies (embedded scale): 5 / 8." in spliced and spliced != old
    with pytest.raises(SystemExit, match="no section for 'y'"):
        splice_scorecard(old, alone, ["y"])


def test_a_refresh_replaces_one_studys_files_and_keeps_every_other_studys_run(tmp_path):
    config = resolve_config(laptop_full_config())
    fake_run(tmp_path / "all", config, tag="first")
    out = tmp_path / "snap"
    snapshot(config, tmp_path / "all", out, ["config/laptop-full.yaml"], "4 h", commit="old")
    (out / "feddisco/tables/older.md").write_text("a table the study no longer has")
    only = {**config, "studies": {"feddisco": config["studies"]["feddisco"]}}
    fake_run(tmp_path / "disco", only, tag="second", seconds=1800.0, cpu="Other CPU")
    refresh(config, tmp_path / "disco", out, ["feddisco"], ["config/laptop-full.yaml"], "2 h", commit="new")
    assert (out / "feddisco/tables/table1.md").read_text().endswith("second")
    assert (out / "fedl2g/tables/table1.md").read_text().endswith("first")
    assert not (out / "feddisco/tables/older.md").exists()
    card = (out / "scorecard.md").read_text()
    assert "cells of feddisco second" in card and "plateaus of feddisco first" not in card
    assert "cells of fedl2g first" in card and "all studies (embedded scale): 4 / 40." in card
    readme = (out / "README.md").read_text()
    assert "- feddisco: commit `new`\n  - wall time: 2 h" in readme
    assert "- fedl2g, fedgtst, feddle-fmnist: commit `old`\n  - wall time: 4 h" in readme
    jobs = len(run_digests(only))
    assert f"| feddisco | {jobs} | {jobs * 0.5:.2f} |" in readme and "Other CPU (AVX2): 123 runs" in readme
    assert stale_runs(config, json.loads((out / "runs.json").read_text()), out) == []


def test_a_prune_drops_the_studies_the_config_no_longer_has_and_keeps_every_other_run(tmp_path):
    config = resolve_config(laptop_full_config())
    fake_run(tmp_path / "all", config, tag="first")
    out = tmp_path / "snap"
    snapshot(config, tmp_path / "all", out, ["config/laptop-full.yaml"], "4 h", commit="old")
    kept = {p: p.read_bytes() for p in out.rglob("*") if p.is_file() and p.parts[len(out.parts)] == "fedl2g"}
    fewer = {**config, "studies": {s: v for s, v in config["studies"].items() if s != "fedgtst"}}
    prune(fewer, out, ["config/laptop-full.yaml"])
    assert not (out / "fedgtst").exists()
    assert {p: p.read_bytes() for p in out.rglob("*") if p.is_file() and p.parts[len(out.parts)] == "fedl2g"} == kept
    card = (out / "scorecard.md").read_text()
    n = len(fewer["studies"])
    assert "## fedgtst" not in card and "## fedl2g" in card
    assert f"all studies (embedded scale): {n} / {10 * n}." in card
    assert sorted(json.loads((out / "provenance.json").read_text())) == sorted(fewer["studies"])
    assert stale_runs(fewer, json.loads((out / "runs.json").read_text()), out) == []
    assert not any(job.startswith("fedgtst/") for job in json.loads((out / "runs.json").read_text()))
    assert "fedgtst" not in (out / "README.md").read_text()
    with pytest.raises(SystemExit, match="nothing to drop"):
        prune(fewer, out, ["config/laptop-full.yaml"])


def test_a_prune_of_a_snapshot_missing_a_kept_file_changes_nothing(tmp_path):
    config = resolve_config(laptop_full_config())
    fake_run(tmp_path / "all", config)
    out = tmp_path / "snap"
    snapshot(config, tmp_path / "all", out, ["config/laptop-full.yaml"], "4 h", commit="old")
    (out / "fedl2g/tables/table1.md").unlink()
    before = {p: p.read_bytes() for p in out.rglob("*") if p.is_file()}
    fewer = {**config, "studies": {s: v for s, v in config["studies"].items() if s != "fedgtst"}}
    with pytest.raises(SystemExit, match="fedl2g/tables/table1.md: missing"):
        prune(fewer, out, ["c.yaml"])
    assert {p: p.read_bytes() for p in out.rglob("*") if p.is_file()} == before


def test_a_refresh_from_an_incomplete_run_changes_nothing_and_names_what_is_missing(tmp_path):
    config = resolve_config(laptop_full_config())
    fake_run(tmp_path / "all", config, tag="first")
    out = tmp_path / "snap"
    snapshot(config, tmp_path / "all", out, ["config/laptop-full.yaml"], "4 h", commit="old")
    before = {p: p.read_bytes() for p in out.rglob("*") if p.is_file()}
    only = {**config, "studies": {"feddisco": config["studies"]["feddisco"]}}
    fake_run(tmp_path / "disco", only, tag="second")
    (tmp_path / "disco/feddisco/figures/fig4.png").unlink()
    with pytest.raises(SystemExit, match="feddisco/figures/fig4.png: missing"):
        refresh(config, tmp_path / "disco", out, ["feddisco"], ["c.yaml"], "2 h", commit="new")
    with pytest.raises(SystemExit, match="unknown study 'feddiscoo'"):
        refresh(config, tmp_path / "disco", out, ["feddiscoo"], ["c.yaml"], "2 h", commit="new")
    assert {p: p.read_bytes() for p in out.rglob("*") if p.is_file()} == before


COMMITTED = sorted(p.name for p in (REPO / "docs/results/runs").iterdir() if p.is_dir()) \
    if (REPO / "docs/results/runs").is_dir() else []


@pytest.mark.skipif(not COMMITTED, reason="no archive of runs is committed under docs/results/runs")
@pytest.mark.parametrize("name", COMMITTED)
def test_a_committed_archive_holds_only_whole_seeds_of_its_config_as_it_is(name):
    """docs/results/runs/<config>/ (`make runs-save RUNS_CONFIG=config/<config>.yaml`): every seed whole and of the
    config's current specs, so a restore puts back exactly what trains nothing again."""
    config = command_config([f"config/{name}.yaml"])
    assert archive_problems(config, REPO / "docs/results/runs" / name) == []
