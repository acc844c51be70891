"""The runs of a `federation: hetero` study (FedL2G), as its train jobs (fedrepro.train.train_job) build them: each
client trains architecture ``i mod X`` of the setting's model group."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path

import numpy as np

from fedrepro.hetero.engine import HeteroConfig, HeteroRun
from fedrepro.hetero.methods import build_method
from fedrepro.io import atomic_write_npz
from fedrepro.sim.tensors import DeviceData
from fedrepro.train import RunBuilder, RunFinisher

EMBEDDINGS = "embeddings.npz"  # a seed's anchors and the clients' test representations, beside summary.json


def hetero_config(training: dict) -> HeteroConfig:
    """The engine's settings from a run spec's training keys (those the engine does not take are fixed by
    fedrepro.federations and checked when the config is validated)."""
    names = {f.name for f in dataclasses.fields(HeteroConfig)}
    return HeteroConfig(**{k: v for k, v in training.items() if k in names})


def hetero_runs(spec: dict, data_path: Path, engine: dict) -> tuple[RunBuilder, RunFinisher]:
    """How a `federation: hetero` job builds each seed's run, and what it writes beside a finished one (the
    homogeneous engine's options, ``engine``, choose nothing here)."""
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

    return build, finish
