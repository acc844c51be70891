"""FedBuff (Nguyen et al., 2022): arriving updates fill a buffer; when it holds ``buffer_size`` of them the
server steps w <- w + server_lr * (their mean) and empties it. The buffer outlives rounds (it is server state)."""

from __future__ import annotations

import torch
from torch import Tensor

from fedrepro.asyncfl.base import AsyncMethod, Update


class FedBuff(AsyncMethod):
    name = "fedbuff"

    def __init__(self, server_lr: float = 1.0, buffer_size: int = 10) -> None:
        super().__init__()
        if buffer_size < 1:
            raise ValueError(f"fedbuff: buffer_size must be >= 1, got {buffer_size}")
        self.server_lr, self.buffer_size = server_lr, buffer_size

    def receive(self, w: Tensor, update: Update) -> Tensor:
        if "sum" not in self.state:
            self.state.update(sum=torch.zeros_like(w), count=0)
        self.state["sum"] += update.delta
        self.state["count"] += 1
        if self.state["count"] < self.buffer_size:
            return w
        w = w + self.server_lr * self.state["sum"] / self.state["count"]
        self.state["sum"].zero_()
        self.state["count"] = 0
        return w

    def round_end(self, w: Tensor, rnd: int) -> Tensor:
        return w
