"""The FedGTST stages in the Snakemake workflow: the DAG has one fine-tuning job per transferred run, and a
tiny transfer study runs end to end (pre-train, fine-tune, tables and figures)."""

from __future__ import annotations

import json

import pandas as pd
import pytest
from support.workflow import snakemake

from fedrepro.config import merge_configfiles, resolve_config
from fedrepro.study import grid_runs, run_spec


@pytest.mark.parametrize("config_file", ["laptop-full.yaml", "paper.yaml"])
def test_every_fedgtst_run_averages_its_participants_uniformly(config_file):
    """Eq. 2 weighs the clients 1/K: every method of the study (FedIIR's global gradient too, which takes
    the aggregation weights) gets equal weights, not the schema's size weights."""
    study = resolve_config(merge_configfiles("config/config.yaml", f"config/{config_file}"))["studies"]["fedgtst"]
    runs = grid_runs(study)
    assert {m for _, m in runs} >= {"fedavg", "fedsr", "fediir", "fedgtst"}
    for setting, method in runs:
        assert run_spec(study, setting, method)["weighting"] == {"kind": "equal"}, (setting, method)


@pytest.mark.slow
def test_tiny_transfer_study_runs_end_to_end(tmp_path):
    config = tmp_path / "tiny.yaml"
    config.write_text("studies:\n  fedgtst: tests/data/tiny_fedgtst.yaml\n")
    proc = snakemake("--cores", "2", "--directory", str(tmp_path), "--configfile", str(config), timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    out = tmp_path / "results" / "fedgtst"
    for path in ["tables/t1.md", "tables/t1.csv", "figures/fig1.png", "figures/fig2.pdf", "finetune.csv",
                 "finetune_curves.csv", "finetune/k4/fedgtst/seed1.json", "logs/finetune/k4/fedgtst.log"]:
        assert (out / path).stat().st_size > 0, path
    summary = pd.read_csv(out / "finetune.csv")
    assert len(summary) == 4 and set(summary["status"]) == {"complete"}
    cells = pd.read_csv(out / "tables" / "t1.csv").set_index("method")
    mean = summary[summary["method"] == "fedgtst"]["target_acc"].mean()
    assert cells.loc["fedgtst", "ours_mean"] == pytest.approx(mean)
    assert cells.loc["fedgtst", "paper_mean"] == pytest.approx(76.2)
    record = json.loads((out / "finetune/k4/fedavg/seed0.json").read_text())
    assert record["config"]["epochs"] == 3 and record["target"] == "digits_m"
    again = snakemake("--cores", "2", "--directory", str(tmp_path), "--configfile", str(config), "-n")
    assert "Nothing to be done" in again.stdout + again.stderr
