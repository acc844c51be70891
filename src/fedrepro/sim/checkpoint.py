"""Checkpoints that are refused, never silently reused, when they belong to another configuration."""

from __future__ import annotations

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
