"""One train job of a `federation: async` study (Feddle): every seed of one method on one setting."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path

import torch

from fedrepro.asyncfl.engine import AsyncConfig, AsyncRun
from fedrepro.asyncfl.methods import build_method
from fedrepro.data.format import load_prepared
from fedrepro.models import build_model
from fedrepro.partition import load_partition
from fedrepro.seeding import INIT, derive_seed
from fedrepro.sim.sync import RunResult, TrainingConfig
from fedrepro.sim.tensors import to_device_data
from fedrepro.train import fingerprint, job_data, write_run


def ood_path(data_path: Path, dataset: str) -> Path:
    """The prepared out-of-domain data set: prepared data sets live side by side (workflow/rules/data.smk)."""
    return Path(data_path).parent / f"{dataset}.npz"


def train_async_job(
    spec: dict,
    data_path: Path,
    partitions: dict[int, Path],
    out_dirs: dict[int, Path],
    checkpoint_dir: Path | None,
    device: str = "auto",
    threads: int = 1,
    log: Callable[[str], None] = print,
    engine: dict | None = None,  # the synchronous engine's options: clients train one at a time here
) -> dict[int, RunResult]:
    """Train ``spec`` for every seed; each seed resumes from its checkpoint if one matches."""
    dev, prepared, data = job_data(spec, data_path, device, threads)
    asyn = AsyncConfig(**spec["async"])
    ood = None
    if asyn.ood_dataset:
        path = ood_path(data_path, asyn.ood_dataset)
        if not path.exists():
            raise FileNotFoundError(f"async.ood_dataset {asyn.ood_dataset!r}: {path} does not exist (prepare it "
                                    "first: the train rule lists it as an input)")
        # at the clients' input size and channels (grey images are replicated to colour, never the reverse)
        ood = to_device_data(load_prepared(path), dev, spec.get("image_size") or data.shape[0],
                             spec.get("channels") or data.shape[2])
    names = {f.name for f in dataclasses.fields(TrainingConfig)}
    training = TrainingConfig(**{k: v for k, v in spec["training"].items() if k in names})
    results = {}
    for seed, part_path in partitions.items():
        parts = load_partition(part_path)
        tag = f"{spec['study']}/{spec['setting']}/{spec['method']} seed {seed}"
        log(f"{tag}: {len(parts)} clients, delays N(0, {asyn.delay_sigma}^2), device {dev}")
        torch.manual_seed(derive_seed(seed, INIT))
        model = build_model(spec["model"], data.shape, data.num_classes, **data.model_kwargs).to(dev)
        run = AsyncRun(model=model, method=build_method(spec["algorithm"], **spec["hparams"]), data=data,
                       client_indices=parts, training=training, asynchrony=asyn, seed=seed, ood=ood,
                       log=lambda msg, tag=tag: log(f"{tag}: {msg}"))
        ckpt = checkpoint_dir / f"seed{seed}.pt" if checkpoint_dir else None
        result = run.run(ckpt, fingerprint(spec, seed, prepared.meta["sha256"], parts))
        write_run(Path(out_dirs[seed]), spec, seed, result, dev)
        results[seed] = result
    return results
