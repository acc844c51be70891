"""The optimisers of flat parameter vectors: one local training's SGD or Adam.

Every local training (a client's each round, a server's fine-tuning pass) starts a fresh ``VectorOptimizer``:
its momentum or Adam moments live only as long as that training, as a client re-created its optimiser each
round in the papers' codes. The updates are torch.optim.SGD's (weight decay added to the gradient, heavy-ball
momentum without dampening; the first step's buffer is the gradient itself) and torch.optim.Adam's (L2 weight
decay, bias-corrected moments, eps outside the square root), so a run means the same thing as one written with
those optimisers. Lanes: ``step`` takes a ``live`` mask of shape [lanes, 1] when ``w`` and ``g`` hold several
clients side by side (sim/vectorized.py), so a client that has finished its local steps stays where it is.
"""

from __future__ import annotations

from typing import Literal, get_args

import torch

Optimizer = Literal["sgd", "adam"]  # a method's hyper-parameter annotation (fedrepro.plugins)
OPTIMIZERS = get_args(Optimizer)


class VectorOptimizer:
    """``step(w, g)``: w <- w - lr * update(g), in place; ``g`` (the gradient at w) is consumed."""

    def __init__(self, optimizer: str, lr: float, momentum: float = 0.0, weight_decay: float = 0.0,
                 betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-8) -> None:
        if optimizer not in OPTIMIZERS:
            raise ValueError(f"optimizer {optimizer!r} is not one of {list(OPTIMIZERS)}")
        if optimizer == "adam" and momentum:
            raise ValueError(f"momentum {momentum} is an SGD setting: Adam's moments are its betas {betas}")
        self.optimizer, self.lr, self.momentum, self.weight_decay = optimizer, lr, momentum, weight_decay
        self.betas, self.eps = betas, eps
        self.steps = 0
        self._m: torch.Tensor | None = None  # SGD's momentum buffer, or Adam's first moment
        self._v: torch.Tensor | None = None  # Adam's second moment

    def step(self, w: torch.Tensor, g: torch.Tensor, live: torch.Tensor | None = None) -> None:
        if self.weight_decay:
            g.add_(w, alpha=self.weight_decay)
        self.steps += 1
        if self.optimizer == "adam":
            update = self._adam(g)
        elif self.momentum:
            self._m = g.clone() if self._m is None else self._m.mul_(self.momentum).add_(g)
            update = self._m
        else:
            update = g
        if live is None:
            w.add_(update, alpha=-self.lr)
        else:
            w.sub_(update * live, alpha=self.lr)

    def _adam(self, g: torch.Tensor) -> torch.Tensor:
        b1, b2 = self.betas
        if self._m is None:
            self._m, self._v = torch.zeros_like(g), torch.zeros_like(g)
        self._m.mul_(b1).add_(g, alpha=1 - b1)
        self._v.mul_(b2).addcmul_(g, g, value=1 - b2)
        denom = (self._v / (1 - b2**self.steps)).sqrt_().add_(self.eps)
        return self._m / denom / (1 - b1**self.steps)
