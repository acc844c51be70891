"""What the three engines' runs (sim/sync.py, hetero/engine.py, asyncfl/engine.py) share: their result, the loss
that counts as divergence and what a diverged round says of itself, the stop signal, and moving a state tree between
devices."""

from __future__ import annotations

import math
import threading
from collections.abc import Iterator
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


def _tensors(value: Any, path: str = "") -> Iterator[tuple[str, torch.Tensor]]:
    """Every floating-point tensor of a state tree (tensors in dicts, lists, tuples) with its path in it."""
    if isinstance(value, torch.Tensor):
        if value.is_floating_point() and value.numel():
            yield path, value
    elif isinstance(value, dict):
        for key, item in value.items():
            yield from _tensors(item, f"{path}[{key}]" if isinstance(key, int) else f"{path}.{key}".lstrip("."))
    elif isinstance(value, list | tuple):
        for i, item in enumerate(value):
            yield from _tensors(item, f"{path}[{i}]")


@dataclass
class Divergence:
    """Why a round counts as diverged: its mean training loss, and the first of its quantities (in the order the
    round computed them) that is not finite, or, where all still are (a loss past DIVERGED_LOSS), the largest."""

    round: int
    train_loss: float | None
    first_non_finite: str | None
    largest: str | None
    largest_magnitude: float | None

    def text(self) -> str:
        loss = f"train loss {self.train_loss:.4g}" if self.train_loss is not None else "no training loss"
        if self.first_non_finite is not None:
            return f"{loss}; first non-finite quantity: {self.first_non_finite}"
        if self.largest is None:
            return loss
        return (f"{loss} (over {DIVERGED_LOSS:g}); every quantity still finite, the largest {self.largest} "
                f"(max |x| {self.largest_magnitude:.3g})")


class RoundTrace:
    """A round's quantities (client losses, uploads, the global model, the method's state) in the order the round
    computes them, each kept as its largest magnitude: a device scalar, read back only when the round diverged,
    so a diverged run can name the first quantity that went non-finite at the cost of one reduction each."""

    def __init__(self) -> None:
        self._names: list[str] = []
        self._sizes: list[torch.Tensor] = []

    def note(self, name: str, value: Any) -> None:
        """Record ``value`` (a tensor or a state tree of them) as ``name``; each tensor of a tree by its path."""
        for path, t in _tensors(value):
            self._names.append(f"{name} {path}" if path else name)
            self._sizes.append(torch.linalg.vector_norm(t.detach(), float("inf")))

    def diagnose(self, rnd: int, train_loss: float | None) -> Divergence:
        """The round's Divergence from what was noted (one read back of all of it)."""
        if not self._sizes:
            return Divergence(rnd, train_loss, None, None, None)
        sizes = torch.stack([s.to("cpu", torch.float64) for s in self._sizes]).tolist()
        first = next((name for name, size in zip(self._names, sizes, strict=True) if not math.isfinite(size)), None)
        finite = [(size, name) for name, size in zip(self._names, sizes, strict=True) if math.isfinite(size)]
        size, name = max(finite) if finite else (None, None)
        return Divergence(rnd, train_loss, first, name, size)


@dataclass
class RunResult:
    history: list[dict] = field(default_factory=list)
    status: str = "complete"
    diverged_round: int | None = None
    divergence: dict | None = None  # a diverged run's Divergence (asdict, with its text as "why")
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
