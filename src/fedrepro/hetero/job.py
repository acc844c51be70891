"""One train job of a `federation: hetero` study (FedL2G): every seed of one method on one setting, each client
training architecture ``i mod X`` of the setting's model group."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch

from fedrepro.hetero.engine import HeteroConfig, HeteroResult, HeteroRun
from fedrepro.hetero.methods import build_method
from fedrepro.io import atomic_write_npz
from fedrepro.partition import load_partition
from fedrepro.seeding import INIT, derive_seed
from fedrepro.train import fingerprint, job_data, write_run

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
) -> dict[int, HeteroResult]:
    """Train ``spec`` for every seed; each seed resumes from its checkpoint if one matches."""
    dev, prepared, data = job_data(spec, data_path, device, threads)
    training = hetero_config(spec["training"])
    results = {}
    for seed, part_path in partitions.items():
        parts = load_partition(part_path)
        tag = f"{spec['study']}/{spec['setting']}/{spec['method']} seed {seed}"
        log(f"{tag}: {len(parts)} clients, group {spec['model']}, device {dev}")
        torch.manual_seed(derive_seed(seed, INIT))
        run = HeteroRun(group=spec["model"], method=build_method(spec["algorithm"], **spec["hparams"]),
                        data=data, client_indices=parts, training=training, seed=seed,
                        log=lambda msg, tag=tag: log(f"{tag}: {msg}"))
        ckpt = checkpoint_dir / f"seed{seed}.pt" if checkpoint_dir else None
        result = run.run(ckpt, fingerprint(spec, seed, prepared.meta["sha256"], parts))
        anchors = run.method.anchors()
        if anchors is not None:  # FedL2G's guiding vectors beside the clients' features (Fig. 4)
            space, vectors = anchors
            Path(out_dirs[seed]).mkdir(parents=True, exist_ok=True)
            atomic_write_npz(Path(out_dirs[seed]) / EMBEDDINGS, anchors=vectors.detach().cpu().numpy(),
                             space=np.array(space), **run.embeddings(space))
        write_run(Path(out_dirs[seed]), spec, seed, result, dev)
        results[seed] = result
    return results
