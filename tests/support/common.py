"""Helpers every part of the suite uses: the repository's root, tiny digits runs and specs, client partitions,
a written-out reference of a client's local training, and the laptop-full config as Snakemake reads it. Fixtures
live in tests/conftest.py."""

from __future__ import annotations

from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[2]


def tiny_digits_spec(algorithm: str) -> dict:
    """A resolved run spec of ``algorithm`` on the digits: 3 IID clients, 2 rounds of one epoch, evaluated and
    checkpointed every round (train_job's smallest real run)."""
    return {
        "study": "s", "setting": "iid", "method": algorithm, "dataset": "digits", "model": "simple_cnn",
        "partition": {"kind": "iid", "clients": 3}, "image_size": None, "channels": None,
        "algorithm": algorithm, "hparams": {}, "weighting": {"kind": "size"},
        "training": {"rounds": 2, "local_epochs": 1, "batch_size": 64, "lr": 0.05, "momentum": 0.0,
                     "weight_decay": 0.0, "join_ratio": 1.0, "eval_every": 1, "last_k": 1, "checkpoint_every": 1,
                     "straggler_steps": None},
    }


def digits_job_inputs(root: Path, partition: dict, seeds: tuple[int, ...]) -> tuple[Path, dict[int, Path]]:
    """The prepared digits file in ``root`` and one partition file per seed of ``partition``: a train job's
    inputs, as the pipeline writes them."""
    from fedrepro.data.registry import prepare_dataset
    from fedrepro.partition import make_partition, partition_stats, save_partition

    data = root / "digits.npz"
    prepare_dataset("digits", data)
    labels = np.load(data)["y_train"]
    paths = {}
    for seed in seeds:
        parts = make_partition(labels, partition, seed)
        paths[seed] = root / f"seed{seed}.npz"
        save_partition(paths[seed], parts, partition_stats(parts, labels, 10), partition)
    return data, paths


def digits_cut(prepared, n_train: int, n_test: int, image_size: int | None = None):
    """Digits as CPU tensors (at ``image_size``), cut to the first ``n_train`` train / ``n_test`` test samples."""
    import dataclasses

    import torch

    from fedrepro.sim.tensors import to_device_data

    data = to_device_data(prepared, torch.device("cpu"), image_size=image_size)
    return dataclasses.replace(data, x_train=data.x_train[:n_train], y_train=data.y_train[:n_train],
                               x_test=data.x_test[:n_test], y_test=data.y_test[:n_test])


def dirichlet_clients(labels, n_clients: int = 4, beta: float = 0.5, seed: int = 0) -> list[np.ndarray]:
    from fedrepro.partition import dirichlet_partition

    return dirichlet_partition(np.asarray(labels), n_clients, beta, np.random.default_rng(seed), min_size=5)


def sync_run(data, parts, algorithm: str = "fedavg", hparams: dict | None = None, cfg=None, seed: int = 0,
             weighting: dict | None = None, model: str = "simple_cnn"):
    """A FederatedRun of ``algorithm`` on ``parts``, its model initialised from the seed's INIT stream as a
    train job initialises it; size weighting unless ``weighting``; silent."""
    import torch

    from fedrepro import seeding
    from fedrepro.algorithms import build_algorithm
    from fedrepro.models import build_model
    from fedrepro.sim.sync import FederatedRun

    torch.manual_seed(seeding.derive_seed(seed, seeding.INIT))
    net = build_model(model, data.shape, data.num_classes).to(data.x_train.dtype)  # float64 data: a float64 model
    return FederatedRun(net, build_algorithm(algorithm, **(hparams or {})), data, parts, cfg,
                        weighting or {"kind": "size"}, seed, log=lambda m: None)


def reference_local_training(run, cid: int, rnd: int, w_start, make_optimizer, extra=None,
                             model: str = "simple_cnn"):
    """Client ``cid``'s local training in round ``rnd`` written out with torch.optim, by autograd: the engine's
    batches (same generator), ``make_optimizer(params)`` on CE (+ ``extra(w)`` of the flat vector); returns the
    final parameters in the engine's vector layout."""
    import torch
    import torch.nn.functional as F

    from fedrepro import seeding
    from fedrepro.models import build_model
    from fedrepro.sim.flat import FlatModel

    cfg, data = run.cfg, run.data
    net = build_model(model, data.shape, data.num_classes)
    FlatModel(net).load(w_start)  # the engine's vector layout
    params = list(net.parameters())
    layout = FlatModel(build_model(model, data.shape, data.num_classes))
    opt = make_optimizer(params)
    gen = torch.Generator().manual_seed(seeding.derive_seed(run.seed, seeding.BATCHES, rnd, cid))
    idx = run.clients[cid]
    for _ in range(cfg.local_epochs):
        order = idx[torch.randperm(len(idx), generator=gen)]
        for start in range(0, len(idx), cfg.batch_size):
            b = order[start : start + cfg.batch_size]
            opt.zero_grad()
            loss = F.cross_entropy(net(data.x_train[b]), data.y_train[b])
            if extra is not None:
                loss = loss + extra(layout.vector_of(params))
            loss.backward()
            opt.step()
    return layout.vector_of([p.detach() for p in params])


def history_rows(result, drop: tuple[str, ...] = ("seconds",)) -> list[dict]:
    """A run's per-evaluation rows without ``drop`` (wall-clock seconds differ between identical runs)."""
    return [{k: v for k, v in row.items() if k not in drop} for row in result.history]


def laptop_full_config(inline: bool = True) -> dict:
    """config/laptop-full.yaml as Snakemake reads it (merged into config/config.yaml); with ``inline``, every
    study given as a file loaded in place (with the study it ``extends`` underneath), so a test can edit it before
    resolve_config."""
    from fedrepro.config import load_study_file, merge_configfiles

    config = merge_configfiles("config/config.yaml", "config/laptop-full.yaml", root=REPO)
    if inline:
        config["studies"] = {name: load_study_file(REPO / entry) if isinstance(entry, str) else entry
                             for name, entry in config["studies"].items()}
    return config
