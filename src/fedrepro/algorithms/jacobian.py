"""Client Jacobians at one parameter vector and FedGTST's cross-client statistics (Eq. 8).

J_k(w) is the gradient of client k's mean cross-entropy w.r.t. every weight, at w. Over the K clients of a
round, the averaged Jacobian norm is ||(1/K) sum_k J_k|| and the cross-client variance
sigma^2 = (1/K) sum_k ||J_k||^2 - ||(1/K) sum_k J_k||^2 (uniform over clients, as Eq. 8 defines them).

``JacobianStats`` is a mixin that any method of this package can switch on (hyper-parameter
``jac_stats``): at the start of each round it takes every participating client's J_k at the round's global
model and adds ``jac_norm`` and ``jac_var`` to the round's row of metrics.csv (Fig. 2). The gradients are
streamed (a sum vector and a sum of squared norms), so a round costs O(params) memory whatever K is, plus
one forward/backward pass over (a fixed subset of) each participant's data. It is a measurement only: it
restores the model's parameters and draws no random numbers the training uses.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import numpy as np
import torch
import torch.nn.functional as F

from fedrepro import seeding

if TYPE_CHECKING:
    from fedrepro.sim.flat import FlatModel

# Seed purpose of the probes' sample subsets: far from fedrepro.seeding's 1..6, so no stream is shared.
PROBE = 101
CHUNK = 512  # samples per forward pass when a gradient is taken over many samples


def cross_client_stats(grads: torch.Tensor) -> tuple[float, float]:
    """(||mean_k J_k||, sigma^2) of Eq. 8 for a [K, P] stack of client gradients: the direct formula."""
    mean = grads.mean(dim=0)
    norm_sq = float(mean.pow(2).sum())
    return norm_sq**0.5, float(grads.pow(2).sum(dim=1).mean()) - norm_sq


class StreamingStats:
    """The same two statistics accumulated one client at a time (O(params) memory)."""

    def __init__(self) -> None:
        self.total: torch.Tensor | None = None
        self.sq_norms = 0.0
        self.count = 0

    def add(self, g: torch.Tensor) -> None:
        self.total = g.detach().clone() if self.total is None else self.total.add_(g)
        self.sq_norms += float(g.pow(2).sum())
        self.count += 1

    def result(self) -> dict[str, float]:
        if not self.count:
            return {}
        norm_sq = float((self.total / self.count).pow(2).sum())
        return {"jac_norm": norm_sq**0.5, "jac_var": self.sq_norms / self.count - norm_sq}


def client_sample(idx: torch.Tensor, max_samples: int | None, seed: int, cid: int) -> torch.Tensor:
    """A fixed random subset of at most ``max_samples`` of a client's indices (all of them when fewer).

    Fixed per (run seed, client): the statistics of successive rounds then differ by the model only.
    """
    if not max_samples or len(idx) <= max_samples:
        return idx
    gen = torch.Generator().manual_seed(seeding.derive_seed(seed, PROBE, cid))
    return idx[torch.randperm(len(idx), generator=gen)[:max_samples].to(idx.device)]


def mean_loss_gradient(flat: FlatModel, x: torch.Tensor, y: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """The gradient at ``w`` of the mean cross-entropy of the model bound to ``flat`` over (x, y).

    Uses the module itself (its parameters are views of ``flat.w``) and puts ``flat.w`` back afterwards,
    so a hook may call it between the engine's own steps.
    """
    saved = flat.w.detach().clone()
    flat.load(w)
    flat.zero_grad()
    n = len(y)
    with torch.enable_grad():  # hooks such as upload run under no_grad
        for start in range(0, n, CHUNK):
            xb, yb = x[start : start + CHUNK], y[start : start + CHUNK]
            (F.cross_entropy(flat.model(xb), yb, reduction="sum") / n).backward()
    g = flat.g.detach().clone()
    flat.zero_grad()
    flat.load(saved)
    return g


class JacobianStats:
    """Mixin: per-round ``jac_norm`` / ``jac_var`` of the participants' Jacobians at the global model.

    A subclass calls ``init_jacobian(jac_stats, jac_samples)`` in ``__init__``, ``probe_round`` from its
    ``server_begin`` and merges ``jacobian_metrics()`` into its ``round_metrics``. ``client_gradient``
    is also what methods use to exchange gradients (FedIIR) or report norms (FedGTST).
    """

    sim: object
    flat: FlatModel

    def init_jacobian(self, jac_stats: bool, jac_samples: int | None) -> None:
        self.jac_stats, self.jac_samples = bool(jac_stats), jac_samples
        self._jac: dict[str, float] = {}

    def client_gradient(self, w: torch.Tensor, cid: int, max_samples: int | None = None) -> torch.Tensor:
        """J_k(w): client ``cid``'s mean-loss gradient at ``w`` over a fixed subset of its data."""
        sim = self.sim
        idx = client_sample(sim.clients[cid], max_samples or self.jac_samples, sim.seed, cid)
        return mean_loss_gradient(self.flat, sim.data.x_train[idx], sim.data.y_train[idx], w)

    def probe_round(self, w_global: torch.Tensor, sampled: np.ndarray,
                    on_gradient: Callable[[int, torch.Tensor], None] | None = None,
                    max_samples: int | None = None) -> None:
        """Take each participant's J_k at the round's global model once: for the statistics (when
        switched on) and for ``on_gradient(cid, J_k)`` (a method that exchanges gradients)."""
        self._jac = {}
        if not self.jac_stats and on_gradient is None:
            return
        stats = StreamingStats()
        for cid in np.asarray(sampled).tolist():
            g = self.client_gradient(w_global, cid, max_samples)
            if on_gradient is not None:
                on_gradient(cid, g)
            if self.jac_stats:
                stats.add(g)
        self._jac = stats.result()

    def jacobian_metrics(self) -> dict[str, float]:
        return dict(self._jac)
