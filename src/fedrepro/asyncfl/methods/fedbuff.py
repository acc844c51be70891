"""FedBuff (Nguyen et al., 2022): arriving updates fill a buffer; when it holds ``buffer_size`` of them the
server steps w <- w + server_lr * (their mean) and empties it. The buffer outlives rounds (it is server state).
The clients' BatchNorm statistics are buffered beside their updates; a flush merges them with the same weights,
b <- (1 - server_lr) b + server_lr * (their mean) (asyncfl/base.py ``merge_buffers``)."""

from __future__ import annotations

import torch
from torch import Tensor

from fedrepro.asyncfl.base import AsyncMethod, Update
from fedrepro.plugins import Positive, PositiveInt


class FedBuff(AsyncMethod):
    name = "fedbuff"

    def __init__(self, server_lr: Positive = 1.0, buffer_size: PositiveInt = 10) -> None:
        super().__init__()
        self.server_lr, self.buffer_size = server_lr, buffer_size

    def server_receive(self, w: Tensor, update: Update) -> Tensor:
        s = self.state
        if "sum" not in s:
            s.update(sum=torch.zeros_like(w), count=0,
                     buffer_sum=None if update.buffers is None else torch.zeros_like(update.buffers))
        s["sum"] += update.delta
        if update.buffers is not None:
            s["buffer_sum"] += update.buffers
        s["count"] += 1
        if s["count"] < self.buffer_size:
            return w
        w = w + self.server_lr * s["sum"] / s["count"]
        if s["buffer_sum"] is not None:
            self.mix_buffers([self.server_lr], [s["buffer_sum"] / s["count"]])
            s["buffer_sum"].zero_()
        s["sum"].zero_()
        s["count"] = 0
        return w

    def server_end(self, w: Tensor, rnd: int) -> Tensor:
        return w
