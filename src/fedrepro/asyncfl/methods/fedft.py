"""Fed+FT: FedAvg's aggregate of the arrived updates, then fine-tuned on the in-domain server data for
``epochs`` passes, in every round where updates arrived; the fine-tuning updates the merged BatchNorm
statistics, as a client's training does."""

from __future__ import annotations

from torch import Tensor

from fedrepro.asyncfl.base import AsyncMethod, ServerPass, ServerWork
from fedrepro.plugins import Positive, PositiveInt
from fedrepro.sim.vector_optim import Optimizer


class FedFT(AsyncMethod):
    name = "fedft"

    def __init__(self, lr: Positive = 1e-3, epochs: PositiveInt = 1, batch_size: PositiveInt = 64,
                 optimizer: Optimizer = "adam") -> None:
        super().__init__()
        self.server_data = "in_domain"
        self.lr, self.epochs, self.batch_size, self.optimizer = lr, epochs, batch_size, optimizer

    def server_passes(self, work: ServerWork) -> list[ServerPass]:
        return [ServerPass(work.rounds * self.epochs * work.samples, self.batch_size, True)]

    def server_end(self, w: Tensor, rnd: int) -> Tensor:
        if not self._arrived:
            return w
        return self.train_on_server_data(super().server_end(w, rnd), rnd)
