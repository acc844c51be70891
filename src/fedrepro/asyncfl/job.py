"""The runs of a `federation: async` study (Feddle), as its train jobs (fedrepro.train.train_job) build them."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path

import numpy as np

from fedrepro.asyncfl.engine import AsyncConfig, AsyncRun
from fedrepro.asyncfl.methods import build_method
from fedrepro.data.format import load_prepared
from fedrepro.io import atomic_write_npz
from fedrepro.models import build_model
from fedrepro.sim.sync import TrainingConfig
from fedrepro.sim.tensors import DeviceData, to_device_data
from fedrepro.train import RunBuilder, RunFinisher

TRUE_UPDATES = "true_update_cosines.npz"  # with async.true_update: the cosine between rounds' true updates (Fig. 2b)


def ood_path(data_path: Path, dataset: str) -> Path:
    """The prepared out-of-domain data set: prepared data sets live side by side (workflow/rules/data.smk)."""
    return Path(data_path).parent / f"{dataset}.npz"


def async_runs(spec: dict, data_path: Path, engine: dict) -> tuple[RunBuilder, RunFinisher]:
    """How a `federation: async` job builds each seed's run, and what it writes beside a finished one (the
    synchronous engine's options, ``engine``: clients train one at a time here)."""
    asyn = AsyncConfig(**spec["async"])
    ood_cache: dict[str, DeviceData] = {}

    def load_ood(data: DeviceData) -> DeviceData | None:
        """The out-of-domain server set at the clients' input size and channels (grey images are replicated
        to colour, never the reverse); loaded once per job."""
        if not asyn.ood_dataset:
            return None
        if "ood" not in ood_cache:
            path = ood_path(data_path, asyn.ood_dataset)
            if not path.exists():
                raise FileNotFoundError(f"async.ood_dataset {asyn.ood_dataset!r}: {path} does not exist (prepare "
                                        "it first: the train rule lists it as an input)")
            ood_cache["ood"] = to_device_data(load_prepared(path), data.x_train.device,
                                              spec.get("image_size") or data.shape[0],
                                              spec.get("channels") or data.shape[2])
        return ood_cache["ood"]

    names = {f.name for f in dataclasses.fields(TrainingConfig)}
    training = TrainingConfig(**{k: v for k, v in spec["training"].items() if k in names})

    def build(seed: int, parts: list[np.ndarray], data: DeviceData, log: Callable[[str], None]) -> AsyncRun:
        model = build_model(spec["model"], data.shape, data.num_classes, weights=spec.get("weights"),
                            **data.model_kwargs)
        return AsyncRun(model=model.to(data.x_train.device), method=build_method(spec["algorithm"], **spec["hparams"]),
                        data=data, client_indices=parts, training=training, asynchrony=asyn, seed=seed,
                        ood=load_ood(data), log=log)

    def finish(run: AsyncRun, out: Path) -> None:
        if asyn.true_update:
            rounds, cosines = run.true_update_cosines()
            atomic_write_npz(out / TRUE_UPDATES, rounds=rounds, cosines=cosines)

    return build, finish
