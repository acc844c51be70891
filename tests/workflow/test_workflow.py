"""The Snakemake workflow: lint-clean, a dry run of the DAG, and a tiny real run end to end."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest
import yaml
from support.common import REPO
from support.workflow import job_counts, snakemake


def test_lint_is_clean():
    proc = snakemake("--lint")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "Congratulations" in proc.stdout + proc.stderr


def test_dry_run_of_the_embedded_default_lists_every_job(tmp_path):
    proc = snakemake("-n", "--directory", str(tmp_path), "--configfile", str(REPO / "config" / "config.yaml"))
    assert proc.returncode == 0, proc.stderr
    counts = job_counts(proc.stdout)
    config = yaml.safe_load((REPO / "config" / "config.yaml").read_text())
    for study in config["studies"].values():
        runs = {(s, m) for block in study["grid"] for s in block["settings"] for m in block["methods"]}
        assert counts["train"] >= len(runs)
    assert counts["prepare_dataset"] >= 1 and counts["aggregate"] == len(config["studies"])
    assert counts["scorecard"] == 1 and counts["showcase"] == 1


@pytest.mark.parametrize("bad, expected", [
    ("train_resources: {gpus: 1}\n", "train_resources: unknown key 'gpus' (did you mean 'gpu'?)"),
    ("device: gpu\n", "device: 'gpu' is not one of ['auto', 'cpu', 'cuda'] (did you mean 'cuda'?)"),
    ("results_dir: /\n", "results_dir: '/' is the file system's root"),
])
def test_bad_config_fails_before_any_job_with_the_key_named(tmp_path, bad, expected):
    path = tmp_path / "bad.yaml"
    path.write_text(bad + f"studies: {{feddisco: {REPO / 'tests' / 'data' / 'tiny_study.yaml'}}}\n")
    proc = snakemake("-n", "--directory", str(tmp_path), "--configfile", str(path))
    assert proc.returncode != 0
    assert expected in proc.stdout + proc.stderr


@pytest.mark.parametrize("target, expected", [
    ("results/feddisco/tables/nope.md", "unknown table 'nope' in study 'feddisco'; known: ['t1']"),
    ("results/feddisco/figures/curve.png", "unknown figure 'curve' in study 'feddisco' (did you mean 'curves'?)"),
    ("results/nope/runs.csv", "unknown study 'nope'; known: ['feddisco']"),
    ("results/feddisco/runs/iid4/fedprx/seeds.json",
     "unknown method 'fedprx' in study 'feddisco' (did you mean 'fedprox'?); known: ['fedavg', 'fedprox']"),
])
def test_a_target_naming_an_unknown_study_table_figure_or_method_lists_the_known_ones(tmp_path, target, expected):
    config = tmp_path / "tiny.yaml"
    config.write_text(f"studies: {{feddisco: {REPO / 'tests' / 'data' / 'tiny_study.yaml'}}}\n")
    proc = snakemake("-n", target, "--directory", str(tmp_path), "--configfile", str(config))
    assert proc.returncode != 0
    assert expected in proc.stdout + proc.stderr and "KeyError" not in proc.stdout + proc.stderr


@pytest.mark.slow
def test_tiny_pipeline_runs_end_to_end(tiny_pipeline):
    tmp_path, config, proc = tiny_pipeline
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    out = tmp_path / "results" / "feddisco"
    scorecard, convergence = (tmp_path / "results" / "scorecard.md").read_text().split("### Convergence")
    assert scorecard.count("| t1 |") == 2  # its line and its claim
    assert "Runs at their plateau" in convergence
    readme = (tmp_path / "README.md").read_text()  # the showcase block, filled from this run
    assert "![curves (feddisco, embedded scale)](docs/showcase/figure.png)" in readme and "to fill" not in readme
    assert "| t1 | FedProx is best |" in readme and readme.endswith("<!-- showcase:end -->\n\nend\n")
    assert (tmp_path / "docs/showcase/figure.png").read_bytes() == (out / "figures/curves.png").read_bytes()
    for path in ["tables/t1.md", "tables/t1.tex", "tables/t1.html", "tables/t1.csv", "figures/curves.png",
                 "figures/curves.pdf",
                 "runs.csv", "summary.csv", "partitions/iid4/seed1.npz", "partitions/iid4/seed1.json"]:
        assert (out / path).stat().st_size > 0, path
    summary = pd.read_csv(out / "summary.csv")
    assert len(summary) == 4 and set(summary["status"]) == {"complete"}
    cells = pd.read_csv(out / "tables" / "t1.csv").set_index("method")
    fedavg = summary[summary["method"] == "fedavg"]["final_acc"]
    assert cells.loc["fedavg", "ours_mean"] == pytest.approx(fedavg.mean())
    assert cells.loc["fedavg", "paper_mean"] == pytest.approx(68.47)
    run = json.loads((out / "runs/iid4/fedprox/seed0/summary.json").read_text())
    assert run["config"]["hparams"] == {"mu": 0.1} and run["seed"] == 0
    assert (out / "logs/train/iid4/fedprox.log").read_text().count("round 2/2") == 2  # progress per seed
    again = snakemake("--cores", "2", "--directory", str(tmp_path), "--configfile", str(config), "-n")
    assert "Nothing to be done" in again.stdout + again.stderr


def test_conda_envs_pin_exactly_the_lock():
    lock = {}
    for line in (REPO / "requirements.lock").read_text().splitlines():
        name, _, version = line.partition("==")
        lock[name.lower()] = version
    envs = sorted((REPO / "envs").glob("*.yaml"))
    assert envs
    for env in envs:
        deps = yaml.safe_load(env.read_text())["dependencies"]
        pip = next(d["pip"] for d in deps if isinstance(d, dict))
        for pin in pip:
            name, _, version = pin.partition("==")
            assert version, f"{env.name}: {pin} is not pinned"
            assert lock.get(name.lower()) == version, f"{env.name}: {pin} != lock {lock.get(name.lower())}"
        assert all("=" in d for d in deps if isinstance(d, str)), f"{env.name}: unpinned conda package"
    # every rule names one of these envs
    rules = "".join(p.read_text() for p in (REPO / "workflow" / "rules").glob("*.smk"))
    assert rules.count("rule ") == rules.count("conda:") == rules.count("log:")


def test_ci_runs_the_readme_test_command():
    readme = (REPO / "README.md").read_text()
    ci = (REPO / ".ci" / "run").read_text()
    assert "make test" in readme and "make run" in readme
    assert "make test" in ci


def test_paper_scale_dry_run_lists_every_job(tmp_path):
    """One dry run of the whole paper config (minutes of DAG building): every train, table and figure job, and a
    fine-tuning job per transferred run (FedGTST)."""
    from fedrepro.config import load_yaml, resolve_config
    from fedrepro.study import grid_runs, transfer_runs

    paper = resolve_config(load_yaml(REPO / "config" / "paper.yaml"))
    proc = snakemake("-n", "--directory", str(tmp_path), "--configfile", str(REPO / "config" / "config.yaml"),
                     str(REPO / "config" / "paper.yaml"))
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    counts = job_counts(proc.stdout)
    assert counts["train"] == sum(len(grid_runs(s)) for s in paper["studies"].values())
    assert counts["table"] == sum(len(s["tables"]) for s in paper["studies"].values())
    assert counts["figure"] == sum(len(s["figures"]) for s in paper["studies"].values())
    assert counts["scorecard"] == 1 and "showcase" not in counts  # the README shows the embedded default
    assert counts["download_dataset"] >= 5
    assert counts["finetune"] == sum(len(transfer_runs(s)) for s in paper["studies"].values()) == 120
    assert counts["aggregate_finetune"] == 1
    # DomainNet: six domains downloaded and prepared once each, six leave-one-out sources built from them
    assert "domainnet_no_clipart" in proc.stdout and "domainnet_sketch/raw/MANIFEST.json" in proc.stdout


def _files_under(root: Path, skip: Path | None = None) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*"))
            if p.is_file() and not (skip and skip in p.parents)}


@pytest.mark.slow
def test_each_scale_keeps_its_own_results_root(tmp_path):
    """A paper-scale run after an embedded one leaves every embedded file byte-identical, and a forced
    rerun of everything at embedded scale after it leaves every paper-scale file byte-identical. Stand-ins:
    config/config.yaml and config/paper.yaml as they are (so their results roots), each with the tiny study,
    at different rounds so that a shared file would differ."""
    study = yaml.safe_load((REPO / "tests" / "data" / "tiny_study.yaml").read_text())
    # one method is enough to tell the roots apart (and halves the train jobs of the three runs)
    study["methods"] = {"fedavg": study["methods"]["fedavg"]}
    study["grid"] = [{"settings": ["iid4"], "methods": ["fedavg"]}]
    study["tables"]["t1"].update(claims=[], rows=study["tables"]["t1"]["rows"][:1])
    study["figures"] = {"curves": {**study["figures"]["curves"], "methods": ["fedavg"]}}
    configs = {}
    for scale, rounds in (("embedded", 2), ("paper", 3)):
        study["defaults"]["rounds"] = rounds
        (tmp_path / f"{scale}_study.yaml").write_text(yaml.safe_dump(study))
        source = "config.yaml" if scale == "embedded" else "paper.yaml"
        config = yaml.safe_load((REPO / "config" / source).read_text())
        config.update(showcase=None, studies={"feddisco": str(tmp_path / f"{scale}_study.yaml")},
                      train_resources={"gpu": 0, "threads": 1})
        configs[scale] = tmp_path / source
        configs[scale].write_text(yaml.safe_dump(config))
    embedded_root, paper_root = tmp_path / "results", tmp_path / "results" / "paper"

    def run(scale: str, *extra: str) -> None:
        proc = snakemake("--cores", "2", "--directory", str(tmp_path), "--configfile", str(configs[scale]), *extra,
                         timeout=600)
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]

    run("embedded")
    embedded = _files_under(embedded_root, skip=paper_root)
    assert "feddisco/tables/t1.md" in embedded and not paper_root.exists()
    run("paper")
    paper = _files_under(paper_root)
    assert {"feddisco/tables/t1.md", "feddisco/figures/curves.png", "scorecard.md", "feddisco/summary.csv"} <= set(
        paper)
    assert "round 3/3" in (paper_root / "feddisco/logs/train/iid4/fedavg.log").read_text()
    assert _files_under(embedded_root, skip=paper_root) == embedded
    run("embedded", "--forceall")
    assert _files_under(paper_root) == paper
