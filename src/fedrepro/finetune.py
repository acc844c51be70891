"""Fine-tuning a federated pre-trained model on a target domain (FedGTST's transferability metric).

One fine-tuning job per (setting, method) reads every seed's final pre-trained parameters from the file the
train job keeps for it (seed{N}.model.pt beside its finished marker; for a run finished before those files
existed, its last checkpoint), fine-tunes each on the target data set's train split and reports its target
test accuracy after every fine-tuning epoch (FedGTST's Fig. 1) and at the end (its tables).

The model h = g o f is the engine's ``head(body(x))``. Fine-tuning always learns a new head g for the
target's classes (the source and target label spaces may differ: CIFAR-10 -> SVHN); ``mode`` says what
happens to the feature extractor f:
- ``head``: f is frozen (FedGTST's theory: a fixed f, a new g); its features are computed once and the head
  is trained on them, which is exact here (no dropout, no batch norm) and fast;
- ``full``: f is trained too, from its pre-trained weights.
The target images are brought to the pre-trained model's input (its channels and size: grey -> colour by
replicating the channel, bilinear resizing), then standardised with the target train split's channel
statistics, as the engine does for any data set.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from fedrepro import defaults, seeding
from fedrepro.data.format import load_prepared
from fedrepro.io import atomic_write_json, open_npz
from fedrepro.models import build_model
from fedrepro.sim.checkpoint import SeedFiles, kept_parameters, read_checkpoint
from fedrepro.sim.flat import FlatModel
from fedrepro.sim.tensors import DeviceData, evaluate, in_inference_batches, to_device_data

# Seed purposes of fine-tuning (fedrepro.seeding uses 1..6; the methods' probes 101..)
HEAD_INIT, FT_BATCHES = 201, 202


_FINETUNE = defaults.finetune()  # the study schema's (fedrepro.defaults)


@dataclass
class FinetuneConfig:
    epochs: int = _FINETUNE["epochs"]
    mode: str = _FINETUNE["mode"]  # head: frozen extractor + new head; full: everything trained, new head
    optimizer: str = _FINETUNE["optimizer"]
    lr: float = _FINETUNE["lr"]
    momentum: float = _FINETUNE["momentum"]  # sgd only
    weight_decay: float = _FINETUNE["weight_decay"]
    batch_size: int = _FINETUNE["batch_size"]
    max_train_samples: int | None = _FINETUNE["max_train_samples"]  # a seeded subset of the target train split

    def __post_init__(self) -> None:
        if self.mode not in ("head", "full"):
            raise ValueError(f"finetune mode must be 'head' or 'full', got {self.mode!r}")
        if self.optimizer not in ("adam", "sgd"):
            raise ValueError(f"finetune optimizer must be 'adam' or 'sgd', got {self.optimizer!r}")


def model_input_shape(source_meta: dict, image_size: int | None, channels: int | None) -> tuple[int, int, int]:
    """(H, W, C) the pre-trained model was built for: the source images after the setting's resizing and
    channel expansion (what the engine's to_device_data made of them)."""
    h, w, c = (int(s) for s in source_meta["shape"])
    return (image_size or h, image_size or w, channels or c)


def load_pretrained(model_name: str, shape: tuple[int, int, int], num_classes: int, w: torch.Tensor,
                    device: torch.device) -> nn.Module:
    """The pre-trained model: built as the train job built it, its flat vector loaded (the FlatModel
    layout), then detached from the flat binding so that it is an ordinary module."""
    model = build_model(model_name, shape, num_classes).to(device)
    flat = FlatModel(model)
    flat.load(w.to(device))
    for p in model.parameters():  # own storage and no bound .grad: fine-tuning may freeze or replace parts
        p.data = p.data.clone()
        p.grad = None
    return model


def _optimizer(params, cfg: FinetuneConfig) -> torch.optim.Optimizer:
    if cfg.optimizer == "adam":
        return torch.optim.Adam(params, lr=cfg.lr, betas=(0.9, 0.999), weight_decay=cfg.weight_decay)
    return torch.optim.SGD(params, lr=cfg.lr, momentum=cfg.momentum, weight_decay=cfg.weight_decay)


@torch.no_grad()
def features(body: nn.Module, x: torch.Tensor) -> torch.Tensor:
    was = body.training
    body.eval()
    out = in_inference_batches(body, x)
    body.train(was)
    return out


def finetune_model(model: nn.Module, target: DeviceData, cfg: FinetuneConfig, seed: int,
                   log: Callable[[str], None] = lambda _: None) -> tuple[nn.Module, list[dict]]:
    """Fine-tune ``model`` (a head(body(x)) model) on ``target``; returns the fine-tuned model (a new head
    on the same body object) and one curve row per epoch: epoch, train_acc, train_loss (running over the
    epoch's batches), test_acc, test_loss."""
    device = target.x_train.device
    x_tr, y_tr = target.x_train, target.y_train
    if cfg.max_train_samples and len(y_tr) > cfg.max_train_samples:
        keep = seeding.rng_for(seed, FT_BATCHES, 0).choice(len(y_tr), cfg.max_train_samples, replace=False)
        keep = torch.as_tensor(np.sort(keep), device=device)
        x_tr, y_tr = x_tr[keep], y_tr[keep]
    torch.manual_seed(seeding.derive_seed(seed, HEAD_INIT))
    model.head = nn.Linear(model.feature_dim, target.num_classes).to(device)
    frozen = cfg.mode == "head"
    for p in model.body.parameters():
        p.requires_grad_(not frozen)
    # frozen f: train g on f's features, computed once (exactly what training g(f(x)) would do here)
    inputs_tr = features(model.body, x_tr) if frozen else x_tr
    inputs_te = features(model.body, target.x_test) if frozen else target.x_test
    trained = model.head if frozen else model
    opt = _optimizer([p for p in trained.parameters() if p.requires_grad], cfg)
    gen = torch.Generator().manual_seed(seeding.derive_seed(seed, FT_BATCHES, 1))
    curve = []
    n = len(y_tr)
    for epoch in range(1, cfg.epochs + 1):
        trained.train()
        order = torch.randperm(n, generator=gen).to(device)
        correct, loss_sum = 0.0, 0.0
        for start in range(0, n, cfg.batch_size):
            b = order[start : start + cfg.batch_size]
            logits = trained(inputs_tr[b])
            loss = F.cross_entropy(logits, y_tr[b])
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            correct += float((logits.argmax(1) == y_tr[b]).sum())
            loss_sum += float(loss.detach()) * len(b)
        test_acc, test_loss = evaluate(trained, inputs_te, target.y_test)
        curve.append({"epoch": epoch, "train_acc": 100.0 * correct / n, "train_loss": loss_sum / n,
                      "test_acc": test_acc, "test_loss": test_loss})
        log(f"epoch {epoch}/{cfg.epochs} target acc {test_acc:.2f} train acc {curve[-1]['train_acc']:.2f}")
    for p in model.body.parameters():
        p.requires_grad_(True)
    return model, curve


def finetune_job(spec: dict, source_path: Path, target_path: Path, runs: list[dict], checkpoint_dir: Path,
                 out_dir: Path, device: str = "auto", threads: int = 1,
                 log: Callable[[str], None] = print) -> list[dict]:
    """Fine-tune every seed listed in ``runs`` (the train job's seeds.json entries) and write
    ``out_dir``/seed{N}.json; returns the per-seed records (without curves)."""
    from fedrepro.train import pick_device

    torch.set_num_threads(threads)
    dev = pick_device(device)
    cfg = FinetuneConfig(**spec["finetune"])
    with open_npz(source_path, "prepared data set") as z:  # only the meta: the source images are not needed
        source_meta = json.loads(str(z["meta"][()]))
    shape = model_input_shape(source_meta, spec.get("image_size"), spec.get("channels"))
    prepared = load_prepared(target_path)
    target = to_device_data(prepared, dev, image_size=shape[0], channels=shape[2])
    if tuple(target.shape) != shape:
        raise ValueError(f"target {prepared.meta['name']} becomes {target.shape}, the model takes {shape}")
    records = []
    for run in runs:
        seed = int(run["seed"])
        tag = f"{spec['study']}/{spec['setting']}/{spec['method']} seed {seed}"
        record = {"study": spec["study"], "setting": spec["setting"], "method": spec["method"], "seed": seed,
                  "target": spec["target"], "config": spec["finetune"], "diverged_round": None}
        files = SeedFiles.of(checkpoint_dir, seed)
        # the train job's working files, not declared outputs: if neither is there, say how to get them back
        train_index = Path(out_dir).parent.parent.parent / "runs" / spec["setting"] / spec["method"] / "seeds.json"
        pretrained = next((p for p in (files.model, files.checkpoint) if p.is_file()), None)
        if pretrained is None:
            raise FileNotFoundError(f"{tag}: the pre-trained model {files.model} is missing; delete "
                                    f"{train_index} to rerun its train job")
        blob = read_checkpoint(pretrained, f"delete it and {train_index} to train this seed again")
        if run.get("status") == "diverged" or blob.get("status") == "diverged":
            # a diverged pre-training has no model worth fine-tuning: report it, as the tables do
            record.update(status="diverged", diverged_round=blob.get("diverged_round"), target_acc=None,
                          best_target_acc=None, curve=[])
            log(f"{tag}: pre-training diverged, not fine-tuned")
        else:
            model = load_pretrained(spec["model"], shape, int(source_meta["num_classes"]), kept_parameters(blob), dev)
            _, curve = finetune_model(model, target, cfg, seed, log=lambda m, tag=tag: log(f"{tag}: {m}"))
            record.update(status="complete", target_acc=curve[-1]["test_acc"],
                          best_target_acc=max(r["test_acc"] for r in curve), curve=curve)
        atomic_write_json(Path(out_dir) / f"seed{seed}.json", record)
        records.append({k: v for k, v in record.items() if k != "curve"})
    return records
