"""Training on the server's own data (Center, Fed+FT, HFCL, FedDF): epochs of mini-batch SGD or Adam on the
flat parameter vector of the run's one model, from a given starting vector."""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

from fedrepro.sim.flat import FlatModel


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
    returns the trained vector. Adam is torch.optim.Adam's update with its defaults (betas 0.9, 0.999)."""
    if optimizer not in ("sgd", "adam"):
        raise ValueError(f"server optimizer {optimizer!r} is not one of ['sgd', 'adam']")
    flat.load(w0)
    m = v = None
    step = 0
    for idx in batches(n, batch_size, epochs, gen, w0.device):
        flat.zero_grad()
        batch_loss(idx).backward()
        with torch.no_grad():
            g = flat.g
            if optimizer == "sgd":
                flat.w.add_(g, alpha=-lr)
                continue
            step += 1
            if m is None:
                m, v = torch.zeros_like(g), torch.zeros_like(g)
            m.mul_(0.9).add_(g, alpha=0.1)
            v.mul_(0.999).addcmul_(g, g, value=0.001)
            denom = (v / (1 - 0.999**step)).sqrt_().add_(1e-8)
            flat.w.addcdiv_(m, denom, value=-lr / (1 - 0.9**step))
    return flat.w.detach().clone()
