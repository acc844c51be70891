"""Fine-tuning on the target domain and what reads it: the fine-tuning job, finetune.csv and its curves,
tables with `source: finetune`, the Fig. 1 and Fig. 2 figures, and the study checks."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pandas as pd
import pytest
import torch
import yaml
from support.common import REPO

from fedrepro import pipeline, seeding
from fedrepro.config import resolve_config
from fedrepro.data.format import load_prepared
from fedrepro.data.registry import prepare_dataset
from fedrepro.finetune import FinetuneConfig, finetune_model, load_pretrained
from fedrepro.models import build_model
from fedrepro.sim.checkpoint import save_checkpoint
from fedrepro.sim.flat import FlatModel
from fedrepro.sim.tensors import to_device_data
from fedrepro.study import ConfigError, finetune_spec, run_spec, transfer_runs

TINY = REPO / "tests" / "data" / "tiny_fedgtst.yaml"


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("data")
    for name in ("digits", "digits_m"):
        prepare_dataset(name, d / f"{name}.npz")
    return d


@pytest.fixture(scope="module")
def target(data_dir):
    """digits-M at the grey-digit model's input after grey -> colour: 3 channels, 28x28."""
    return to_device_data(load_prepared(data_dir / "digits_m.npz"), torch.device("cpu"), 28, 3)


def pretrained_vector(seed: int = 0) -> torch.Tensor:
    torch.manual_seed(seed)
    return FlatModel(build_model("lenet5", (28, 28, 3), 10)).w.clone()


# ----- fine-tuning itself
def test_frozen_extractor_keeps_its_weights_and_learns_a_new_head(target):
    w = pretrained_vector()
    model = load_pretrained("lenet5", (28, 28, 3), 10, w, torch.device("cpu"))
    body_before = {k: v.clone() for k, v in model.body.state_dict().items()}
    head_before = model.head.weight.clone()
    tuned, curve = finetune_model(model, target, FinetuneConfig(epochs=3, batch_size=128), seed=0)
    for k, v in tuned.body.state_dict().items():
        assert torch.equal(v, body_before[k]), k
    assert not torch.equal(tuned.head.weight, head_before)
    assert [r["epoch"] for r in curve] == [1, 2, 3]
    assert curve[-1]["test_acc"] > 20 and all(0 <= r["train_acc"] <= 100 for r in curve)
    # the fine-tuned model's accuracy is what the curve reports (features -> new head = the whole model)
    from fedrepro.sim.tensors import evaluate

    assert evaluate(tuned, target.x_test, target.y_test)[0] == pytest.approx(curve[-1]["test_acc"])


def test_full_fine_tuning_moves_the_extractor_and_is_seeded(target):
    cfg = FinetuneConfig(epochs=1, mode="full", optimizer="sgd", lr=0.01, batch_size=128)
    w = pretrained_vector()
    a = finetune_model(load_pretrained("lenet5", (28, 28, 3), 10, w, torch.device("cpu")), target, cfg, seed=1)
    b = finetune_model(load_pretrained("lenet5", (28, 28, 3), 10, w, torch.device("cpu")), target, cfg, seed=1)
    before = load_pretrained("lenet5", (28, 28, 3), 10, w, torch.device("cpu"))
    assert not torch.equal(a[0].body[0].weight, before.body[0].weight)
    assert a[1] == b[1]


def test_load_pretrained_restores_the_engine_vector():
    w = pretrained_vector(3)
    model = load_pretrained("lenet5", (28, 28, 3), 10, w, torch.device("cpu"))
    assert torch.equal(FlatModel(build_model("lenet5", (28, 28, 3), 10)).vector_of(list(model.parameters())), w)


def test_bad_fine_tuning_options_are_refused():
    with pytest.raises(ValueError, match="mode"):
        FinetuneConfig(mode="partial")
    with pytest.raises(ValueError, match="optimizer"):
        FinetuneConfig(optimizer="lbfgs")


# ----- the study file, as the rules see it
def tiny_study() -> dict:
    return resolve_config({"studies": {"fedgtst": str(TINY)}})["studies"]["fedgtst"]


def test_finetune_spec_and_transfer_runs():
    study = tiny_study()
    assert transfer_runs(study) == [("k4", "fedavg"), ("k4", "fedgtst")]
    spec = finetune_spec(study, "k4", "fedgtst")
    assert spec["target"] == "digits_m" and spec["channels"] == 3 and spec["model"] == "lenet5"
    assert spec["finetune"]["epochs"] == 3 and spec["finetune"]["mode"] == "head" and spec["finetune"]["lr"] == 0.005
    assert run_spec(study, "k4", "fedgtst")["hparams"]["jac_stats"] is True


@pytest.mark.parametrize(("edit", "message"), [
    (lambda s: s["tables"]["t1"].update(metric="best_acc"), "does not exist for `source: finetune`"),
    (lambda s: s["tables"]["t1"].update(source="train"), "target_* metrics come from fine-tuning"),
    (lambda s: s["settings"]["k4"]["target"].update(dataset="mnistm"), "unknown data set 'mnistm'"),
    (lambda s: s["settings"]["k4"].pop("target"), "has no `target`"),
    (lambda s: s["settings"]["k4"].update(finetune={"epochs": 0}), "finetune.epochs"),
])
def test_bad_transfer_studies_fail_with_the_key_named(edit, message):
    raw = yaml.safe_load(TINY.read_text())
    study = copy.deepcopy(raw)
    edit(study)
    with pytest.raises(ConfigError, match=message.replace("*", r"\*").replace("`", "`")):
        resolve_config({"studies": {"fedgtst": study}})


# ----- train -> finetune -> aggregate -> table and figures, as the rules chain them
def test_pretrain_finetune_aggregate_table_and_figures(tmp_path, data_dir):
    study = tiny_study()
    study["seeds"] = [0]
    res, log = tmp_path / "results", (lambda m: None)
    indexes = []
    for setting, method in transfer_runs(study):
        spec = run_spec(study, setting, method)
        part = res / "partitions" / f"{setting}/seed0.npz"
        pipeline.partition(data_dir / "digits.npz", spec["partition"], [0], [part], log)
        train_index = res / f"runs/{setting}/{method}/seeds.json"
        ckpt = res / f"checkpoints/{setting}/{method}"
        # keep_model: what the train rule sets for a setting with a `target`; the checkpoint itself goes
        pipeline.train(spec, data_dir / "digits.npz", [part], [0], train_index, ckpt, "cpu", 1, log, keep_model=True)
        assert not (ckpt / "seed0.pt").exists() and (ckpt / "seed0.model.pt").is_file()
        ft_index = res / f"finetune/{setting}/{method}/seeds.json"
        pipeline.finetune(finetune_spec(study, setting, method), train_index, data_dir / "digits.npz",
                          data_dir / "digits_m.npz", ckpt, ft_index, "cpu", 1, log)
        indexes.append(ft_index)
        record = json.loads((ft_index.parent / "seed0.json").read_text())
        assert record["status"] == "complete" and len(record["curve"]) == 3
        assert record["target_acc"] == record["curve"][-1]["test_acc"]
    pipeline.aggregate_finetune(indexes, res / "finetune.csv", res / "finetune_curves.csv", log)
    pipeline.aggregate([res / f"runs/k4/{m}/seeds.json" for m in ("fedavg", "fedgtst")], res / "runs.csv",
                       res / "summary.csv", log)
    summary = pd.read_csv(res / "finetune.csv")
    assert list(summary["method"]) == ["fedavg", "fedgtst"] and set(summary["status"]) == {"complete"}
    curves = pd.read_csv(res / "finetune_curves.csv")
    assert len(curves) == 2 * 3 and list(curves["epoch"][:3]) == [1, 2, 3]
    runs = pd.read_csv(res / "runs.csv")
    assert runs[["jac_norm", "jac_var"]].notna().all().all()
    assert runs.loc[runs["method"] == "fedgtst", "guide_norm"].notna().all()

    tspec = {**study["tables"]["t1"], "name": "t1",
             "rows": [{"method": "fedavg", "label": "FedAvg", "paper": "FedAVG"},
                      {"method": "fedgtst", "label": "FedGTST", "paper": "Fed-GTST"}],
             "columns": [{"setting": "k4", "label": "digits", "paper": "MNIST→MNIST-M | LeNet"}]}
    pipeline.table(tspec, res / "finetune.csv", res / "runs.csv", REPO / "config/paper/fedgtst.csv",
                   tmp_path / "t1", "embedded", log)
    cells = pd.read_csv(tmp_path / "t1.csv").set_index("method")
    assert cells.loc["fedgtst", "ours_mean"] == pytest.approx(summary.set_index("method").loc["fedgtst", "target_acc"])
    assert cells.loc["fedavg", "paper_mean"] == pytest.approx(73.8)
    assert "target-domain test accuracy" in (tmp_path / "t1.md").read_text()

    for name, kind, y, sources in (("fig1", "finetune_curve", "test_acc", [res / "finetune_curves.csv"]),
                                   ("fig2", "curve", "jac_norm", [res / "runs.csv", res / "summary.csv"])):
        fspec = {"name": name, "kind": kind, "y": y, "caption": name,
                 "settings": [{"setting": "k4", "label": "digits"}],
                 "methods": [{"method": "fedavg", "label": "FedAvg"}, {"method": "fedgtst", "label": "FedGTST"}]}
        pipeline.figure(fspec, sources, tmp_path / name, log)
        assert (tmp_path / f"{name}.png").stat().st_size > 0


def test_a_diverged_pretraining_is_reported_not_fine_tuned(tmp_path, data_dir):
    study = tiny_study()
    spec = finetune_spec(study, "k4", "fedavg")
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    save_checkpoint(ckpt / "seed0.pt", "fp", {"w": torch.full((10,), float("nan")), "status": "diverged",
                                             "diverged_round": 2})
    index = tmp_path / "runs.json"
    index.write_text(json.dumps({"runs": [{"seed": 0, "dir": "seed0", "status": "diverged"}]}))
    out = tmp_path / "ft" / "seeds.json"
    pipeline.finetune(spec, index, data_dir / "digits.npz", data_dir / "digits_m.npz", ckpt, out, "cpu", 1,
                      lambda m: None)
    record = json.loads((out.parent / "seed0.json").read_text())
    assert record["status"] == "diverged" and record["diverged_round"] == 2 and record["target_acc"] is None


def test_seeds_differ_but_a_rerun_is_identical(tmp_path, data_dir, target):
    w = pretrained_vector()
    cfg = FinetuneConfig(epochs=2, batch_size=64)
    runs = [finetune_model(load_pretrained("lenet5", (28, 28, 3), 10, w, torch.device("cpu")), target, cfg, s)[1]
            for s in (0, 0, 1)]
    assert runs[0] == runs[1] and runs[0] != runs[2]
    assert seeding.derive_seed(0, 201) != seeding.derive_seed(1, 201)
