"""SCAFFOLD (Karimireddy et al., 2020), option II control variates.

Local steps follow g + c - c_k; afterwards c_k+ = c_k - c + (w_start - w_end) / (K * lr). The client
uploads delta_w and delta_c = c_k+ - c_k; the server steps w <- w + server_lr * sum_k p_k delta_w_k and
c <- c + (1/N) * sum_k delta_c_k (= |S|/N times their mean).

With local momentum the correction is fed to the momentum buffer as (c - c_k) at the first step and
(1 - rho)(c - c_k) after, so it moves w by exactly -lr (c - c_k) every step, as FedDisco's code does
(it subtracts lr (c - c_k) after each optimiser step). Feeding it undamped would amplify it by
1/(1 - rho) a second time: c_k already measures the momentum-amplified per-step displacement.

c and every c_k start at zero, as in the paper. FedDisco's code (scaffold.py there) starts them all at
the weights R of one freshly initialised model. c_k+ drops whatever c_k held (the correction's own
displacement, lr (c - c_k) per step, comes back through (w_start - w_end) / (K lr)), so a client's variate
is free of R after its first round, and c keeps R times the share of clients never sampled yet. With full
participation that share is 0 after round 1, where c - c_k = 0 anyway: the same training as a zero start
(up to rounding). With partial participation every correction carries (share - 1 or share) x R until
every client has been sampled once (about 25 rounds for 10 of 60 clients): a random pull there, not here.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import numpy as np
import torch

from fedrepro.algorithms.base import Algorithm, Client, lane_stack
from fedrepro.plugins import Positive
from fedrepro.sim.flat import FlatModel

if TYPE_CHECKING:
    from fedrepro.sim.sync import TrainingConfig


class Scaffold(Algorithm):
    name = "scaffold"

    def __init__(self, server_lr: Positive = 1.0) -> None:
        super().__init__()
        self.server_lr = server_lr
        self._corrections: dict[int, torch.Tensor] = {}  # this round's c - c_k per client

    def setup(self, flat: FlatModel, num_clients: int, training: TrainingConfig) -> None:
        super().setup(flat, num_clients, training)
        self.state["c"] = torch.zeros_like(flat.w)
        self.state["c_local"] = {}  # cid -> c_k, absent until the client first trains (= zeros)

    def _c_local(self, cid: int) -> torch.Tensor:
        c_k = self.state["c_local"].get(cid)
        return torch.zeros_like(self.state["c"]) if c_k is None else c_k

    def correct_grad(self, w: torch.Tensor, g: torch.Tensor, client: Client) -> None:
        if client.steps == 0:  # per client: the vectorised engine interleaves the clients' steps
            self._corrections[client.cid] = self.state["c"] - self._c_local(client.cid)
        first = client.steps == 0 or not self.training.momentum
        g.add_(self._corrections[client.cid], alpha=1.0 if first else 1.0 - self.training.momentum)

    def batched_correction(self, clients: list[Client], w_global: torch.Tensor
                           ) -> Callable[[torch.Tensor, torch.Tensor, int], None]:
        corrections = self.state["c"] - lane_stack(self.state["c_local"], clients, self.state["c"])
        damped = 1.0 - self.training.momentum if self.training.momentum else 1.0

        def correct(w: torch.Tensor, g: torch.Tensor, t: int) -> None:
            g.add_(corrections, alpha=1.0 if t == 0 else damped)  # every lane steps for the t-th time

        return correct

    def upload(self, client: Client, w_end: torch.Tensor) -> dict[str, torch.Tensor]:
        c_k = self._c_local(client.cid)
        delta = w_end - client.w_start
        c_new = c_k - self.state["c"] - delta / (client.steps * self.training.lr_at(client.round))
        self.state["c_local"][client.cid] = c_new
        return {"delta": delta, "delta_c": c_new - c_k}

    def download(self, cid: int) -> dict[str, torch.Tensor]:
        return {"c": self.state["c"]}

    def state_bytes_per_client(self, num_params: int) -> int:
        return 4 * num_params  # c_k, float32

    def server_begin(self, w_global: torch.Tensor, sampled: np.ndarray, weights: np.ndarray) -> None:
        super().server_begin(w_global, sampled, weights)
        self._sum_c = torch.zeros_like(w_global)
        self._corrections: dict[int, torch.Tensor] = {}

    def server_receive(self, cid: int, upload: dict[str, torch.Tensor], weight: float) -> None:
        super().server_receive(cid, upload, weight)
        self._sum_c.add_(upload["delta_c"])

    def server_end(self, w_global: torch.Tensor) -> torch.Tensor:
        self.state["c"].add_(self._sum_c, alpha=1.0 / self.num_clients)
        return w_global + self.server_lr * self._sum
