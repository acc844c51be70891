"""Checkpoints that are refused, never silently reused, when they belong to another configuration."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from fedrepro.io import atomic_write

FORMAT = 2  # 2: evaluation rows carry client accuracy mean and variance


class CheckpointError(RuntimeError):
    """A checkpoint that cannot be used for this run (corrupt, or written by another config)."""


def save_checkpoint(path: Path, fingerprint: str, payload: dict[str, Any]) -> None:
    """Write ``payload`` with the run's fingerprint, atomically."""
    blob = {"format": FORMAT, "fingerprint": fingerprint, **payload}
    atomic_write(path, lambda tmp: torch.save(blob, tmp))


def load_checkpoint(path: Path, fingerprint: str) -> dict[str, Any] | None:
    """The checkpoint at ``path`` if it exists and matches ``fingerprint``; None if there is none."""
    path = Path(path)
    if not path.exists():
        return None
    try:
        blob = torch.load(path, map_location="cpu", weights_only=False)
    except Exception as exc:  # torch raises several types for truncated or foreign files
        raise CheckpointError(
            f"checkpoint {path} is corrupt or unreadable ({type(exc).__name__}: {exc}); "
            "delete it to start this run from scratch"
        ) from exc
    if not isinstance(blob, dict) or blob.get("format") != FORMAT:
        raise CheckpointError(f"checkpoint {path} has an unknown format; delete it to start from scratch")
    if blob["fingerprint"] != fingerprint:
        raise CheckpointError(
            f"checkpoint {path} was written by another configuration (fingerprint {blob['fingerprint'][:12]} "
            f"!= {fingerprint[:12]}); refusing to resume from it. Delete it to start this run from scratch"
        )
    return blob


def module_buffers(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The model's buffers (BatchNorm running statistics) on the CPU: state the flat parameter vector does not
    hold, so a checkpoint must, or a resumed BatchNorm model starts from stale statistics."""
    return {name: buf.detach().cpu().clone() for name, buf in model.named_buffers()}


def restore_buffers(model: torch.nn.Module, saved: dict[str, torch.Tensor] | None) -> None:
    """Copy ``saved`` (from module_buffers) back into the model's buffers."""
    own = dict(model.named_buffers())
    for name, value in (saved or {}).items():
        own[name].copy_(value)


def close_round(rnd: int, rounds: int, diverged: bool, why: str, result: Any, checkpoint: Path | None,
                fingerprint: str, every: int, payload: Callable[[], dict[str, Any]],
                log: Callable[[str], None], finished: bool = False) -> bool:
    """The end of every engine's round: mark a divergence, checkpoint when due (every ``every`` rounds, at the
    end, on divergence, when the engine says the run is ``finished`` early and on a stop signal; ``payload()``
    builds what to save, only then), and stop: True to leave the loop after a divergence or an early finish; a
    stop signal (SIGTERM, preemption) raises Preempted once it is saved."""
    from fedrepro.sim.sync import _STOP, Preempted  # sync imports this module

    if diverged:
        result.status, result.diverged_round = "diverged", rnd
        log(f"diverged at round {rnd}: {why}")
    done = diverged or finished or rnd == rounds
    stop = _STOP.is_set() and not done
    if checkpoint and (done or stop or rnd % every == 0):
        save_checkpoint(checkpoint, fingerprint, payload())
    if stop:
        raise Preempted(f"stopped by a signal after round {rnd}" +
                        (f"; checkpoint {checkpoint}" if checkpoint else " (no checkpoint)"))
    return diverged or finished


def resume_progress(resumed: dict[str, Any], result: Any) -> tuple[int, int, int, float]:
    """Put a checkpoint's history and status back into ``result``; (next round, bytes up, bytes down, seconds)
    so far: what every engine's resume shares (each restores its own state beside it)."""
    result.history = resumed["history"]
    result.status, result.diverged_round = resumed["status"], resumed["diverged_round"]
    return resumed["round"] + 1, resumed["bytes_up"], resumed["bytes_down"], resumed["seconds"]
