"""FedAdam (Reddi et al., 2021, "Adaptive Federated Optimization", Algorithm 2): Adam on the server, with the
weighted mean of the clients' updates as its (negative) gradient; clients train as in FedAvg.

m <- b1 * m + (1 - b1) * delta;  v <- b2 * v + (1 - b2) * delta^2;  w <- w + eta * m / (sqrt(v) + tau).
As the paper, no bias correction; tau (its adaptivity) is the paper's grid's middle, 1e-3. The own-study
example (config/examples/own-study.yaml) is where it runs: a new method in a small study.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated

import torch

from fedrepro.algorithms.base import Algorithm
from fedrepro.plugins import Positive, Range
from fedrepro.sim.flat import FlatModel

if TYPE_CHECKING:
    from fedrepro.sim.sync import TrainingConfig


class FedAdam(Algorithm):
    name = "fedadam"

    def __init__(self, eta: Positive = 0.01, beta1: Annotated[float, Range(ge=0, lt=1)] = 0.9,
                 beta2: Annotated[float, Range(ge=0, lt=1)] = 0.99, tau: Positive = 1e-3) -> None:
        super().__init__()
        self.eta, self.beta1, self.beta2, self.tau = eta, beta1, beta2, tau

    def setup(self, flat: FlatModel, num_clients: int, training: TrainingConfig) -> None:
        super().setup(flat, num_clients, training)
        self.state["m"] = torch.zeros_like(flat.w)
        self.state["v"] = torch.zeros_like(flat.w)

    def server_end(self, w_global: torch.Tensor) -> torch.Tensor:
        m = self.state["m"].mul_(self.beta1).add_(self._sum, alpha=1.0 - self.beta1)
        v = self.state["v"].mul_(self.beta2).addcmul_(self._sum, self._sum, value=1.0 - self.beta2)
        return w_global + self.eta * m / (v.sqrt() + self.tau)
