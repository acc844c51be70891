"""What the three engines' runs (sim/sync.py, hetero/engine.py, asyncfl/engine.py) share: their result, the loss
that counts as divergence, the stop signal, and moving a state tree between devices."""

from __future__ import annotations

import math
import threading
from dataclasses import dataclass, field
from typing import Any

import torch

# mean training loss above which a run counts as diverged: cross-entropy starts at ln(classes) < 10, and no
# method's extra terms come near this in a healthy run
DIVERGED_LOSS = 1e4

STOP = threading.Event()


class Preempted(RuntimeError):
    """The run was asked to stop (SIGTERM: SLURM preemption, scancel, time limit) and checkpointed."""


def request_stop(*_: object) -> None:
    """Ask every running simulation to checkpoint at the end of its current round and stop (a signal
    handler: SIGTERM gives a job some seconds before SIGKILL, enough to finish a round and save)."""
    STOP.set()


def diverged_loss(loss: float | None) -> bool:
    """Whether a round's mean training loss says the run diverged: not finite, or astronomically large (SCAFFOLD
    blowing up to 1e11 is divergence too: no table should average it)."""
    return loss is not None and (not math.isfinite(loss) or loss > DIVERGED_LOSS)


def all_finite(t: torch.Tensor) -> bool:
    """Whether every entry of ``t`` is finite: its min and max are (a NaN propagates through both). One
    reduction pass, no mask the size of ``t``: ``isfinite(t).all()`` took ~0.5 s on a 60M-parameter vector on a
    CPU, ten times this."""
    if not t.numel():
        return True
    low, high = torch.aminmax(t)
    return bool(torch.isfinite(low)) and bool(torch.isfinite(high))


@dataclass
class RunResult:
    history: list[dict] = field(default_factory=list)
    status: str = "complete"
    diverged_round: int | None = None
    per_class_acc: list[float] | None = None  # of the final model, in percent
    stopped_round: int | None = None  # the round early stopping ended the run at (TrainingConfig.early_stop)
    # training seconds earlier processes spent on this run (a resumed checkpoint's; all of a seed finished before),
    # so that a job's wall seconds (seeds.json) count the whole job, not its last attempt
    earlier_seconds: float = 0.0


def to_device(obj: Any, device: torch.device | str) -> Any:
    """A state tree (tensors in dicts, lists, tuples) on ``device``."""
    if isinstance(obj, torch.Tensor):
        return obj.to(device)
    if isinstance(obj, dict):
        return {k: to_device(v, device) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return type(obj)(to_device(v, device) for v in obj)
    return obj
