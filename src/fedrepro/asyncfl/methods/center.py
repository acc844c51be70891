"""Center: no federation; the model is trained on the in-domain server data alone (``epochs`` passes in
round 1, then left as it is, so its curve is flat). No client is ever sampled. Its training updates the
BatchNorm statistics, as a client's does."""

from __future__ import annotations

from torch import Tensor

from fedrepro.asyncfl.base import AsyncMethod, ServerPass, ServerWork
from fedrepro.plugins import Positive, PositiveInt
from fedrepro.sim.vector_optim import Optimizer


class Center(AsyncMethod):
    name = "center"
    uses_clients = False

    def __init__(self, lr: Positive = 1e-3, epochs: PositiveInt = 20, batch_size: PositiveInt = 64,
                 optimizer: Optimizer = "adam") -> None:
        super().__init__()
        self.server_data = "in_domain"
        self.lr, self.epochs, self.batch_size, self.optimizer = lr, epochs, batch_size, optimizer

    def server_passes(self, work: ServerWork) -> list[ServerPass]:  # trains in round 1 only
        return [ServerPass(self.epochs * work.samples, self.batch_size, True)]

    def server_end(self, w: Tensor, rnd: int) -> Tensor:
        if rnd != 1:
            return w
        return self.train_on_server_data(w, rnd)
