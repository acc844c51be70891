"""A sync run of one method with a chosen engine (sequential, side by side): the engines' equality tests."""

from __future__ import annotations

import torch

from fedrepro import seeding
from fedrepro.algorithms import build_algorithm
from fedrepro.models import build_model
from fedrepro.sim.sync import FederatedRun, TrainingConfig

CFG = TrainingConfig(rounds=2, local_epochs=1, batch_size=16, lr=0.02, momentum=0.5, weight_decay=1e-4,
                     join_ratio=0.8, eval_every=1)


HPARAMS = {"fedprox": {"mu": 0.1}, "feddyn": {"alpha": 0.1}, "feddc": {"alpha": 0.1}, "moon": {"mu": 1.0},
           "fedavgm": {"beta": 0.5}}


def run_with(data, parts, algorithm, engine, cfg=CFG, weighting=None, width=32):
    torch.manual_seed(seeding.derive_seed(0, seeding.INIT))
    net = build_model("simple_cnn", data.shape, data.num_classes).to(data.x_train.dtype)
    run = FederatedRun(net, build_algorithm(algorithm, **HPARAMS.get(algorithm, {})), data, parts, cfg,
                       weighting or {"kind": "size"}, 0, log=lambda m: None, engine=engine, side_by_side=width)
    return run, run.run()
