"""CA2FL (Wang et al., ICLR 2024): FedBuff with cached update calibration. The server caches every client's
latest update h_i (zero before its first); a buffer period starting at global step t uses
h^t = (1/N) sum_i h_i (the cache mean at its start), adds Delta_i - h_i for each arriving update (then
h_i <- Delta_i), and when ``buffer_size`` updates are in steps w <- w + server_lr (h^t + sum(Delta_i - h_i) / K).
BatchNorm statistics are not calibrated (they are values, not updates): they merge as FedBuff's at each step,
b <- (1 - server_lr) b + server_lr * (the mean of the K clients' statistics).

The cache holds a full vector per client that has reported (45 MB for ResNet18: 45 GB for 1,000 clients), so it
lives in host memory, each row allocated on the client's first arrival and moved to the run's device only while
its update is received; the O(P) sums (the cache's, the calibration's, h^t) stay on the device. A checkpoint
saves the rows as they are and a resume keeps them in host memory (``host_state``)."""

from __future__ import annotations

import torch
from torch import Tensor

from fedrepro.asyncfl.base import HOST, AsyncMethod, Update
from fedrepro.plugins import Positive, PositiveInt


class CA2FL(AsyncMethod):
    name = "ca2fl"
    host_state = ("cache",)

    def __init__(self, server_lr: Positive = 1.0, buffer_size: PositiveInt = 10) -> None:
        super().__init__()
        self.server_lr, self.buffer_size = server_lr, buffer_size

    def server_receive(self, w: Tensor, update: Update) -> Tensor:
        s = self.state
        if "cache" not in s:
            s.update(cache={}, cache_sum=torch.zeros_like(w), calib=torch.zeros_like(w), count=0, base=None,
                     buffer_sum=None if update.buffers is None else torch.zeros_like(update.buffers))
        if s["count"] == 0:  # a buffer period starts: fix the calibration h^t
            s["base"] = s["cache_sum"] / self.run.num_clients
        cached = s["cache"].get(update.cid)
        if cached is None:
            change = update.delta
            s["cache"][update.cid] = update.delta.to(HOST, copy=True)
        else:
            change = update.delta - cached.to(update.delta.device)
            cached.copy_(update.delta)
        s["calib"] += change
        s["cache_sum"] += change
        if update.buffers is not None:
            s["buffer_sum"] += update.buffers
        s["count"] += 1
        if s["count"] < self.buffer_size:
            return w
        w = w + self.server_lr * (s["base"] + s["calib"] / s["count"])
        if s["buffer_sum"] is not None:
            self.mix_buffers([self.server_lr], [s["buffer_sum"] / s["count"]])
            s["buffer_sum"].zero_()
        s["calib"].zero_()
        s["count"] = 0
        return w

    def server_end(self, w: Tensor, rnd: int) -> Tensor:
        return w

    def state_bytes_per_client(self, num_params: int) -> int:
        return 4 * num_params  # the cached update, float32
