"""The hooks of an asynchronous federated method. The base class *is* FedAvg in asynchronous mode: every
round, the updates that arrived are averaged (weighted by the clients' sample counts) and added to the
global model, however stale they are. A method overrides only what it changes.

A round (asyncfl/engine.py): ``round_begin``; for each update that arrives this round, in a fixed order,
``receive`` (which may change the global model at once: FedAsync, FedBuff when its buffer fills); then
``round_end`` (FedAvg's average, Feddle's coefficient search). ``server_data`` says which server-side data
set a method trains on (None, "in_domain" or "out_of_domain"); the engine hands it over in ``setup``.
Everything that must survive a checkpoint lives in ``self.state`` (tensors, numbers, lists and dicts of them);
what ``receive`` buffers within a round is cleared by ``round_end`` before any checkpoint.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

import torch
import torch.nn.functional as F
from torch import Tensor

from fedrepro import seeding

if TYPE_CHECKING:  # the engine imports this module, so only for annotations
    from fedrepro.asyncfl.engine import AsyncRun


@dataclass
class Update:
    """One client's report: Delta = w_local - w_start, where w_start is the model it was sent."""

    cid: int
    delta: Tensor
    w_start: Tensor  # read-only: shared by every client dispatched in the same round
    dispatch_round: int
    staleness: int  # rounds between dispatch and arrival (its delay)
    num_samples: int


class AsyncMethod:
    """FedAvg (asynchronous mode): each round, w += sum_i p_i Delta_i over the arrived updates, p_i ~ n_i."""

    name: ClassVar[str] = "fedavg"
    uses_clients: ClassVar[bool] = True  # False: no client is ever sampled (Center)

    def __init__(self) -> None:
        self.state: dict[str, Any] = {}
        self.server_data: str | None = None  # None, "in_domain" or "out_of_domain"
        self._arrived: list[Update] = []

    def setup(self, run: AsyncRun) -> None:
        """Called once before round 1 (and before a checkpoint's state is loaded): ``run.server_x`` and
        ``run.server_y`` hold the server data this method asked for (None without)."""
        self.run = run
        self.flat, self.model = run.flat, run.model

    # ----- server
    def round_begin(self, w: Tensor, rnd: int) -> None:
        """Start of round ``rnd``."""

    def receive(self, w: Tensor, update: Update) -> Tensor:
        """One arrived update; returns the global model (default: unchanged, the update is buffered)."""
        self._arrived.append(update)
        return w

    def round_end(self, w: Tensor, rnd: int) -> Tensor:
        """End of round ``rnd``: the next global model (default: the sample-weighted mean update)."""
        if not self._arrived:
            return w
        w = w + weighted_mean([u.delta for u in self._arrived], [u.num_samples for u in self._arrived])
        self._arrived = []
        return w

    def round_metrics(self) -> dict[str, float]:
        """Extra columns for this round's evaluation row in metrics.csv (Feddle: coefficient statistics)."""
        return {}

    # ----- helpers for methods that train on the server data
    def server_generator(self, rnd: int, purpose: int = 0) -> torch.Generator:
        """A CPU generator for the server's batches in round ``rnd`` (a pure function of seed and round)."""
        return torch.Generator().manual_seed(seeding.derive_seed(self.run.seed, seeding.SERVER, rnd, purpose))

    def server_ce(self, idx: Tensor) -> Tensor:
        """Cross-entropy of the run's model on the server samples ``idx``."""
        return F.cross_entropy(self.model(self.run.server_x[idx]), self.run.server_y[idx])


def weighted_mean(vectors: list[Tensor], weights: list[float]) -> Tensor:
    """sum_i (w_i / sum w) v_i."""
    total = float(sum(weights))
    out = torch.zeros_like(vectors[0])
    for v, wt in zip(vectors, weights, strict=True):
        out.add_(v, alpha=float(wt) / total)
    return out
