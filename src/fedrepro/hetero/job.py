"""One train job of a `federation: hetero` study (FedL2G): every seed of one method on one setting, each client
training architecture ``i mod X`` of the setting's model group."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path

import numpy as np

from fedrepro.hetero.engine import HeteroConfig, HeteroResult, HeteroRun
from fedrepro.hetero.methods import build_method
from fedrepro.io import atomic_write_npz
from fedrepro.sim.tensors import DeviceData
from fedrepro.train import run_seeds

EMBEDDINGS = "embeddings.npz"  # a seed's anchors and the clients' test representations, beside summary.json


def hetero_config(training: dict) -> HeteroConfig:
    """The engine's settings from a run spec's training keys (those the engine does not take are fixed by
    fedrepro.federations and checked when the config is validated)."""
    names = {f.name for f in dataclasses.fields(HeteroConfig)}
    return HeteroConfig(**{k: v for k, v in training.items() if k in names})


def train_hetero_job(
    spec: dict,
    data_path: Path,
    partitions: dict[int, Path],
    out_dirs: dict[int, Path],
    checkpoint_dir: Path | None,
    device: str = "auto",
    threads: int = 1,
    log: Callable[[str], None] = print,
    engine: dict | None = None,  # the homogeneous engine's options: nothing to choose here
    keep_checkpoints: bool = False,
    keep_model: bool = False,
) -> dict[int, HeteroResult]:
    """Train ``spec`` for every seed; each seed resumes from its checkpoint if one matches (what a finished
    seed keeps: train.run_seeds)."""
    training = hetero_config(spec["training"])

    def build(seed: int, parts: list[np.ndarray], data: DeviceData, log: Callable[[str], None]) -> HeteroRun:
        return HeteroRun(group=spec["model"], method=build_method(spec["algorithm"], **spec["hparams"]),
                         data=data, client_indices=parts, training=training, seed=seed, log=log,
                         split_seed=spec["partition"].get("seed"))

    def finish(run: HeteroRun, out: Path) -> None:
        anchors = run.method.anchors()
        if anchors is not None:  # FedL2G's guiding vectors beside the clients' features (Fig. 4)
            space, vectors = anchors
            atomic_write_npz(out / EMBEDDINGS, anchors=vectors.detach().cpu().numpy(), space=np.array(space),
                             **run.embeddings(space))

    return run_seeds(spec, data_path, partitions, out_dirs, checkpoint_dir, device, threads, log, build, finish,
                     keep_checkpoints=keep_checkpoints, keep_model=keep_model)
