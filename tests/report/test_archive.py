"""The runs' archive (fedrepro.report.archive): a study's finished seeds saved into the repository and restored on a
machine whose results root is gone, so that Snakemake trains none of them again and rebuilds the same choices and
tables; a damaged seed is refused by name, a seed of an older spec leaves the archive."""

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from fedrepro.config import REPO, command_config, resolve_config
from fedrepro.report.archive import INDEX, archive_problems, finished_seeds, restore, save

STUDY = REPO / "tests/data/tuning_study.yaml"


def snakemake(root: Path) -> None:
    proc = subprocess.run([sys.executable, "-m", "snakemake", "-s", str(REPO / "Snakefile"), "--cores", "2",
                           "--directory", str(root), "--configfile", str(root / "config.yaml")],
                          cwd=REPO, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]


def config_of(root: Path) -> dict:
    return resolve_config({"studies": {"tiny": yaml.safe_load((root / "study.yaml").read_text())}})


def train_logs(results: Path) -> dict[str, str]:
    return {p.relative_to(results).as_posix(): p.read_text() for p in sorted(results.glob("*/logs/train/*/*.log"))}


@pytest.fixture(scope="module")
def finished(tmp_path_factory) -> Path:
    """tests/data/tuning_study.yaml run through Snakemake: two tuning stages (4 seeds of 4 jobs) and the study's own
    2 jobs of 2 seeds."""
    root = tmp_path_factory.mktemp("archive")
    shutil.copy(STUDY, root / "study.yaml")
    (root / "config.yaml").write_text(yaml.safe_dump({"studies": {"tiny": str(root / "study.yaml")}}))
    snakemake(root)
    return root


@pytest.mark.slow
def test_a_restored_archive_trains_nothing_again_and_rebuilds_the_same_choices_and_tables(finished, tmp_path):
    config = config_of(finished)
    results = finished / "results"
    archive = tmp_path / "archive"
    outcome = save(config, results, archive)
    assert len(outcome.copied) == 8 and not outcome.refused  # 4 grid points x 1 seed, 2 jobs x 2 seeds
    assert json.loads((archive / INDEX).read_text())["count"] == 8
    assert archive_problems(config, archive) == []
    assert save(config, results, archive).unchanged == outcome.copied  # a second save changes nothing

    # a new machine: the checkout, no results root
    machine = tmp_path / "machine"
    machine.mkdir()
    for name in ("study.yaml", "config.yaml"):
        shutil.copy(finished / name, machine / name)
    (machine / "config.yaml").write_text(yaml.safe_dump({"studies": {"tiny": str(machine / "study.yaml")}}))
    assert len(restore(config, archive, machine / "results").copied) == 8
    snakemake(machine)
    logs = train_logs(machine / "results")
    assert len(logs) == 6
    for name, log in logs.items():
        assert "not trained again" in log and "clients, model" not in log, name  # no seed trained
    for f in ("tiny/tuning/clients.json", "tiny/tuning/prox.json", "tiny/tuning/prox.csv", "tiny/tables/t1.md"):
        assert (machine / "results" / f).read_text() == (results / f).read_text(), f


@pytest.mark.slow
def test_a_damaged_seed_is_refused_by_name_and_a_finished_one_is_never_overwritten(finished, tmp_path):
    config = config_of(finished)
    archive = tmp_path / "archive"
    save(config, finished / "results", archive)
    seeds = finished_seeds(config, archive)
    damaged = next(s for s in seeds if s.job == "tiny/iid/fedavg" and s.seed == 0)
    metrics = archive / damaged.run / "metrics.csv"
    metrics.write_text(metrics.read_text().replace("complete", "partial", 1) + "1,2\n")
    problems = archive_problems(config, archive)
    assert problems[0] == f"{metrics}: its sha256 is not the one {archive / damaged.marker} records"
    assert sorted(problems[1:]) == sorted(f"{f}: no finished seed of the config's current specs holds it" for f in (
        archive / damaged.marker, metrics, archive / damaged.run / "summary.json"))
    results = tmp_path / "results"
    outcome = restore(config, archive, results)
    assert outcome.refused == [f"{metrics}: its sha256 is not the one {archive / damaged.marker} records"]
    assert len(outcome.copied) == 7 and not (results / damaged.marker).exists()
    # a results root's own finished seed that differs is kept, not overwritten
    other = next(s for s in seeds if s.job == "tiny/iid/fedprox" and s.seed == 1)
    (results / other.run / "metrics.csv").write_text("its own run\n")
    again = restore(config, archive, results)
    assert again.differing == ["tiny/iid/fedprox seed 1"] and len(again.unchanged) == 6
    assert (results / other.run / "metrics.csv").read_text() == "its own run\n"


@pytest.mark.slow
def test_a_save_after_the_spec_changed_drops_the_older_specs_seeds(finished, tmp_path):
    config = config_of(finished)
    archive = tmp_path / "archive"
    save(config, finished / "results", archive)
    config["studies"]["tiny"]["methods"]["fedprox"]["label"] = "FedProx"  # not in the run spec: the same jobs
    assert archive_problems(config, archive) == []
    config["studies"]["tiny"]["seeds"] = [0]  # seed 1 is no longer a run of the study
    problems = archive_problems(config, archive)
    assert any("tiny/runs/iid/fedavg/seed1/metrics.csv: no finished seed" in p for p in problems)
    assert f"{archive / INDEX}: lists tiny/iid/fedavg seed 1, which the archive does not hold" in problems
    save(config, finished / "results", archive)
    assert archive_problems(config, archive) == []
    assert json.loads((archive / INDEX).read_text())["seeds"]["tiny/iid/fedavg"] == [0]
    assert not (archive / "tiny/runs/iid/fedavg/seed1").exists()


COMMITTED = sorted(p.name for p in (REPO / "docs/results/runs").iterdir() if p.is_dir()) \
    if (REPO / "docs/results/runs").is_dir() else []


@pytest.mark.skipif(not COMMITTED, reason="no archive of runs is committed under docs/results/runs")
@pytest.mark.parametrize("name", COMMITTED)
def test_a_committed_archive_holds_only_whole_seeds_of_its_config_as_it_is(name):
    """docs/results/runs/<config>/ (`make runs-save RUNS_CONFIG=config/<config>.yaml`): every seed whole and of the
    config's current specs, so a restore puts back exactly what trains nothing again."""
    config = command_config([f"config/{name}.yaml"])
    assert archive_problems(config, REPO / "docs/results/runs" / name) == []
