"""FedAvgM (Hsu et al., 2019): server momentum on the averaged update.

v <- beta * v + (1 - dampening) * sum_k p_k delta_k;  w <- w + server_lr * v.
Hsu et al. use dampening 0; FedDisco's code keeps an exponential average (dampening = beta).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated

import torch

from fedrepro.algorithms.base import Algorithm
from fedrepro.plugins import Fraction, Positive, Range
from fedrepro.sim.flat import FlatModel

if TYPE_CHECKING:
    from fedrepro.sim.sync import TrainingConfig


class FedAvgM(Algorithm):
    name = "fedavgm"

    def __init__(self, beta: Annotated[float, Range(ge=0, lt=1)] = 0.5, server_lr: Positive = 1.0,
                 dampening: Fraction = 0.0) -> None:
        super().__init__()
        self.beta, self.server_lr, self.dampening = beta, server_lr, dampening

    def setup(self, flat: FlatModel, num_clients: int, training: TrainingConfig) -> None:
        super().setup(flat, num_clients, training)
        self.state["v"] = torch.zeros_like(flat.w)

    def server_end(self, w_global: torch.Tensor) -> torch.Tensor:
        v = self.state["v"].mul_(self.beta).add_(self._sum, alpha=1.0 - self.dampening)
        return w_global + self.server_lr * v
