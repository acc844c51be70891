"""fedrepro.jobs: a part of a study's train jobs as Snakemake targets, so a long study runs a few hours at a time
(Feddle's Table 5: `make laptop-feddle-table5-d01`, `-d03`)."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys

import pytest
import yaml
from support.common import REPO

from fedrepro.config import resolve_config
from fedrepro.jobs import job_outputs, main, part_jobs
from fedrepro.study import ConfigError

STUDY = REPO / "tests" / "data" / "tuning_study.yaml"


def config() -> dict:
    study = yaml.safe_load(STUDY.read_text())
    study["settings"]["iid2"] = {**study["settings"]["iid"], "label": "digits IID, 4 clients",
                                 "partition": {"kind": "iid", "clients": 4}}
    study["grid"] = [{"settings": ["iid", "iid2"], "methods": ["fedavg", "fedprox"]}]
    return resolve_config({"studies": {"tiny": study}})


def test_a_part_is_the_jobs_of_its_methods_grid_points_included_and_settings():
    cfg = config()
    assert part_jobs(cfg, "tiny", methods=["fedprox"]) == [("iid", "fedprox"), ("iid2", "fedprox")]
    assert part_jobs(cfg, "tiny", settings=["iid2"]) == [("iid2", "fedavg"), ("iid2", "fedprox")]
    assert part_jobs(cfg, "tiny--tune-clients", methods=["fedavg"]) == [("iid", "fedavg-lr0.001"),
                                                                         ("iid", "fedavg-lr0.1")]
    assert part_jobs(cfg, "tiny", table="t1") == [("iid", "fedavg"), ("iid", "fedprox")]  # t1 shows iid only
    assert job_outputs(cfg, "tiny", [("iid2", "fedprox")]) == ["results/tiny/runs/iid2/fedprox/seeds.json"]


@pytest.mark.parametrize("kwargs, message", [
    ({"study_name": "tiny--tune-prx"}, "--study: unknown study 'tiny--tune-prx' (did you mean 'tiny--tune-prox'?)"),
    ({"study_name": "tiny", "methods": ["fedprx"]}, "--methods: unknown method of tiny's jobs 'fedprx'"),
    ({"study_name": "tiny--tune-prox", "methods": ["fedavg"]}, "--methods: unknown method of tiny--tune-prox's jobs"),
    ({"study_name": "tiny", "settings": ["iid3"]}, "--settings: unknown setting of tiny's jobs 'iid3'"),
    ({"study_name": "tiny", "table": "t2"}, "--table: unknown table 't2'"),
])
def test_a_name_the_part_does_not_have_is_refused_naming_it(kwargs, message):
    with pytest.raises(ConfigError, match=re.escape(message)):
        part_jobs(config(), **kwargs)


def test_snakemake_given_a_parts_targets_schedules_its_jobs_and_what_they_need_and_nothing_else(tmp_path):
    """The second tuning stage's grid as a part: its two points, and the first stage's runs and choice that they
    train with; none of the study's own runs. (The targets go before --configfile, which takes every word after it.)"""
    root = tmp_path / "part"
    root.mkdir()
    shutil.copy(STUDY, root / "study.yaml")
    (root / "config.yaml").write_text(yaml.safe_dump({"studies": {"tiny": str(root / "study.yaml")}}))
    targets = subprocess.run([sys.executable, "-m", "fedrepro.jobs", "--configfile", str(root / "config.yaml"),
                              "--study", "tiny--tune-prox", "--methods", "fedprox"],
                             cwd=REPO, capture_output=True, text=True, check=True).stdout.split()
    assert targets == [f"results/tiny--tune-prox/runs/iid/fedprox-mu{mu}/seeds.json" for mu in ("0.0", "1.0")]
    proc = subprocess.run([sys.executable, "-m", "snakemake", "-s", str(REPO / "Snakefile"), "-n", "--cores", "1",
                           "--directory", str(root), *targets, "--configfile", str(root / "config.yaml")],
                          cwd=REPO, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    trained = sorted(set(re.findall(r"output: (results/[^\s,]+/seeds\.json)", proc.stdout)))
    assert trained == sorted([*targets, "results/tiny--tune-clients/runs/iid/fedavg-lr0.001/seeds.json",
                              "results/tiny--tune-clients/runs/iid/fedavg-lr0.1/seeds.json"])
    assert "rule choose_tuning" in proc.stdout and "results/tiny/runs/" not in proc.stdout


def test_a_parts_cost_is_its_jobs_share_of_the_studys_estimate(tmp_path, capsys, monkeypatch):
    """The part's core-hours are fedrepro.cost's for the same jobs: a whole stage's equal the study row's."""
    from fedrepro import cost

    monkeypatch.setattr(cost, "cpu_seconds_per_flop", lambda: 1e-4)  # a slow machine: hours to compare
    (tmp_path / "config.yaml").write_text(yaml.safe_dump({"studies": {"tiny": str(STUDY)}}))
    main(["--configfile", str(tmp_path / "config.yaml"), "--study", "tiny--tune-clients", "--cost"])
    printed = capsys.readouterr().out
    row = next(r for r in cost.estimate(config(), cost.GPU_TFLOPS, cost.STEP_FLOOR_MS, 1e-4)
               if r["study"] == "tiny--tune-clients")
    hours = row["cpu_hours"] + row["server_cpu_hours"]
    assert hours > 1 and printed.startswith(f"tiny--tune-clients: 2 train jobs, 2 runs, ~{hours:.1f} CPU core-hours")


def test_a_tuned_jobs_cost_counts_the_choices_its_stages_wrote(tmp_path, capsys, monkeypatch):
    """A job trains with its earlier stages' choices, so it is costed with them once they are written (here the
    clients' stage chose 3 local epochs: the prox stage's client steps triple); before, with the study file's
    values, and --cost says how many jobs that was."""
    from fedrepro import cost

    monkeypatch.setattr(cost, "cpu_seconds_per_flop", lambda: 1e-4)
    monkeypatch.chdir(tmp_path)
    (tmp_path / "config.yaml").write_text(yaml.safe_dump({"studies": {"tiny": str(STUDY)}}))

    def prox_stage() -> tuple[dict, list[str]]:
        main(["--configfile", str(tmp_path / "config.yaml"), "--study", "tiny--tune-prox", "--cost"])
        row = next(r for r in cost.estimate(resolve_config({"studies": {"tiny": str(STUDY)}}), cost.GPU_TFLOPS,
                                            cost.STEP_FLOOR_MS, 1e-4) if r["study"] == "tiny--tune-prox")
        return row, capsys.readouterr().out.strip().splitlines()[1:]

    before, notes = prox_stage()
    assert before["unchosen_jobs"] == 2
    assert notes == ["2 of them train with tuning choices not made yet: costed with the values the study file gives"]
    choice = tmp_path / "results" / "tiny" / "tuning" / "clients.json"
    choice.parent.mkdir(parents=True)
    choice.write_text('{"chosen": {"fedavg": {"values": {"training.local_epochs": 3, "training.lr": 0.1}}}}')
    after, notes = prox_stage()
    assert after["unchosen_jobs"] == 0 and notes == []
    assert after["steps"] == 3 * before["steps"] > 0


def test_a_parts_measured_cost_counts_only_jobs_finished_under_the_current_spec(tmp_path, capsys, monkeypatch):
    """--cost adds what the finished jobs took: their wall time (seeds.json's job_seconds), for jobs whose every
    seed left its done-marker under the current spec's digest (a run of an edited spec does not count)."""
    from fedrepro import cost
    from fedrepro.report.progress import finished_seeds_folder

    monkeypatch.setattr(cost, "cpu_seconds_per_flop", lambda: 1e-4)
    monkeypatch.chdir(tmp_path)
    (tmp_path / "config.yaml").write_text(yaml.safe_dump({"studies": {"tiny": str(STUDY)}}))
    resolved = resolve_config({"studies": {"tiny": str(STUDY)}})
    study = "tiny--tune-clients"
    results = tmp_path / "results"
    for method, seconds, current in (("fedavg-lr0.1", 5400.0, True), ("fedavg-lr0.001", 999.0, False)):
        runs = results / study / "runs" / "iid" / method
        runs.mkdir(parents=True)
        (runs / "seeds.json").write_text(f'{{"runs": [], "job_seconds": {seconds}}}')
        folder = finished_seeds_folder({**resolved, "studies": {**resolved["studies"], **resolved["tuning_studies"]}},
                                       results, f"{study}/iid/{method}")
        marker = folder if current else folder.parent / "an-older-spec"
        marker.mkdir(parents=True)
        (marker / "seed10.done.json").write_text("{}")
    main(["--configfile", str(tmp_path / "config.yaml"), "--study", study, "--cost"])
    last = capsys.readouterr().out.strip().splitlines()[-1]
    assert last.startswith("finished so far: 1 of the 2 jobs, 1.50 core-hours measured")
