"""Training on the server's own data (Center, Fed+FT, HFCL, FedDF): epochs of mini-batch SGD or Adam on the
flat parameter vector of the run's one model, from a given starting vector."""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

from fedrepro.sim.flat import FlatModel
from fedrepro.sim.vector_optim import VectorOptimizer


def batches(n: int, batch_size: int, epochs: int, gen: torch.Generator, device: torch.device):
    """Index batches of ``epochs`` reshuffled passes over n samples (the last batch of a pass may be short)."""
    for _ in range(epochs):
        order = torch.randperm(n, generator=gen).to(device)
        for start in range(0, n, batch_size):
            yield order[start : start + batch_size]


def train_vector(
    flat: FlatModel,
    w0: Tensor,
    batch_loss: Callable[[Tensor], Tensor],
    n: int,
    epochs: int,
    lr: float,
    batch_size: int,
    gen: torch.Generator,
    optimizer: str = "sgd",
) -> Tensor:
    """``epochs`` passes of ``batch_loss(indices)`` (a loss of the model bound to ``flat``) from ``w0``;
    returns the trained vector. Plain SGD or torch.optim.Adam's update with its defaults (sim/vector_optim.py)."""
    vector_optimizer = VectorOptimizer(optimizer, lr)
    flat.load(w0)
    for idx in batches(n, batch_size, epochs, gen, w0.device):
        flat.zero_grad()
        batch_loss(idx).backward()
        with torch.no_grad():
            vector_optimizer.step(flat.w, flat.g)
    return flat.w.detach().clone()
