"""Tiny asynchronous runs on the digits, a stop signal at round 3, and histories to compare."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from fedrepro.asyncfl.engine import AsyncConfig, AsyncRun
from fedrepro.asyncfl.methods import build_method
from fedrepro.models import build_model
from fedrepro.sim.runs import STOP, Preempted, request_stop
from fedrepro.sim.sync import TrainingConfig


def equal_parts(n: int = 300, clients: int = 10) -> list[np.ndarray]:
    return [np.sort(p) for p in np.array_split(np.random.default_rng(0).permutation(n), clients)]


def make_run(data, method: str, hparams=None, rounds=6, sigma=0.0, join=0.3, seed=0, log=lambda m: None,
             model_fn=None, **training) -> AsyncRun:
    torch.manual_seed(seed)
    model = model_fn() if model_fn else build_model("cnn3_small", data.shape, data.num_classes)
    cfg = TrainingConfig(**{**dict(rounds=rounds, local_epochs=1, batch_size=16, lr=0.05, join_ratio=join,
                                   eval_every=1), **training})
    return AsyncRun(model, build_method(method, **(hparams or {})), data, equal_parts(), cfg,
                    AsyncConfig(delay_sigma=sigma, server_samples=50), seed=seed, log=log)


def preempt_at_round_3(build, ckpt) -> None:
    """Run ``build(log)`` checkpointing to ``ckpt`` and stop it as round 3 ends, as a preempted job."""
    def stop_at_round_3(msg):
        if msg.startswith("round 3/"):
            request_stop()

    try:
        with pytest.raises(Preempted):
            build(stop_at_round_3).run(ckpt, "fp")
    finally:
        STOP.clear()


def comparable(result) -> list[dict]:
    """A run's history without its wall-clock seconds; NaN (no update arrived yet) != NaN, so as None."""
    return [{k: None if isinstance(v, float) and math.isnan(v) else v for k, v in row.items() if k != "seconds"}
            for row in result.history]
