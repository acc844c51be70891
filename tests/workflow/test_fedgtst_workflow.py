"""The FedGTST stages in the Snakemake workflow: the DAG has one fine-tuning job per transferred run, a tiny
transfer study runs end to end (pre-train, fine-tune, tables and figures), and a tuning stage scored by the target
accuracy fine-tunes its grid points and hands its choice to runs that fine-tune from it."""

from __future__ import annotations

import json

import pandas as pd
import pytest
import yaml
from support.common import REPO
from support.workflow import snakemake

from fedrepro.config import merge_configfiles, resolve_config
from fedrepro.study import ConfigError, grid_runs, run_spec


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
def test_tiny_transfer_study_with_its_xi_tuned_by_target_accuracy_runs_end_to_end(tmp_path):
    """tests/data/tiny_fedgtst.yaml with FedGTST's xi tuned by its number, the target accuracy after fine-tuning: the
    stage's grid points are pre-trained and fine-tuned, scored from its finetune.csv; the study's FedGTST runs
    pre-train with the chosen xi and fine-tune from the models kept in the folder of that choice; tables, figures and
    the fine-tuning records follow, and a second call has nothing to do."""
    study = yaml.safe_load((REPO / "tests/data/tiny_fedgtst.yaml").read_text())
    del study["methods"]["fedgtst"]["hparams"]["xi"]
    study["tuning"] = {"seeds": [100], "settings": ["k4"], "metric": "target_acc",
                       "stages": [{"name": "xi", "grids": {"fedgtst": {"hparams.xi": [1.0e-4, 1.0e-3]}}}]}
    (tmp_path / "study.yaml").write_text(yaml.safe_dump(study))
    config = tmp_path / "tiny.yaml"
    config.write_text(yaml.safe_dump({"studies": {"fedgtst": str(tmp_path / "study.yaml")}}))
    proc = snakemake("--cores", "2", "--directory", str(tmp_path), "--configfile", str(config), timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    res = tmp_path / "results"
    scored = pd.read_csv(res / "fedgtst--tune-xi/finetune.csv")
    assert len(scored) == 2 and set(scored["seed"]) == {100}
    choice = json.loads((res / "fedgtst/tuning/xi.json").read_text())["chosen"]["fedgtst"]
    best = scored.loc[scored["target_acc"].idxmax()]
    assert choice["variant"] == best["method"] and choice["score"] == pytest.approx(best["target_acc"])
    out = res / "fedgtst"
    for path in ["tables/t1.md", "tables/t1.csv", "figures/fig1.png", "figures/fig2.pdf", "finetune.csv",
                 "finetune_curves.csv", "finetune/k4/fedgtst/seed1.json", "logs/finetune/k4/fedgtst.log",
                 "tuning/xi.md"]:
        assert (out / path).stat().st_size > 0, path
    summary = pd.read_csv(out / "finetune.csv")
    assert len(summary) == 4 and set(summary["status"]) == {"complete"}
    for seed in (0, 1):  # the study's own FedGTST runs: pre-trained with the choice, fine-tuned from it
        trained = json.loads((out / f"runs/k4/fedgtst/seed{seed}/summary.json").read_text())
        assert trained["config"]["hparams"]["xi"] == choice["values"]["hparams.xi"]
    cells = pd.read_csv(out / "tables" / "t1.csv").set_index("method")
    mean = summary[summary["method"] == "fedgtst"]["target_acc"].mean()
    assert cells.loc["fedgtst", "ours_mean"] == pytest.approx(mean)
    assert cells.loc["fedgtst", "paper_mean"] == pytest.approx(76.2)
    record = json.loads((out / "finetune/k4/fedavg/seed0.json").read_text())
    assert record["config"]["epochs"] == 3 and record["target"] == "digits_m"
    again = snakemake("--cores", "2", "--directory", str(tmp_path), "--configfile", str(config), "-n")
    assert "Nothing to be done" in again.stdout + again.stderr


def test_a_stage_scored_by_target_accuracy_needs_a_target_on_every_tuning_setting():
    study = yaml.safe_load((REPO / "tests/data/tiny_fedgtst.yaml").read_text())
    del study["settings"]["k4"]["target"], study["tables"], study["figures"]["fig1"]
    del study["methods"]["fedgtst"]["hparams"]["xi"]
    study["tuning"] = {"seeds": [100], "settings": ["k4"], "metric": "best_target_acc",
                       "stages": [{"name": "xi", "grids": {"fedgtst": {"hparams.xi": [1.0e-4, 1.0e-3]}}}]}
    with pytest.raises(ConfigError, match="tuning.settings: setting 'k4' has no `target` to fine-tune on, which the "
                                          "metric best_target_acc scores"):
        resolve_config({"studies": {"fedgtst": study}})
