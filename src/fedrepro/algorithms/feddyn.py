"""FedDyn (Acar et al., 2021): a dynamic regulariser that makes stationary local and global optima agree.

Client k minimises L_k(w) - <grad_k, w> + (alpha/2) ||w - w_global||^2, then sets
grad_k <- grad_k - alpha (w_k - w_global). The server keeps h <- h - alpha/N sum_{k in S} (w_k - w_global)
(N = all clients) and sets w <- sum_k p_k w_k - h / alpha, with the engine's weights p_k (uniform: the
paper; Disco: re-weighted). The engine trains from and evaluates that w (the paper's server model).
Deviations from the official code (FedDyn's and FedDisco's copy): it evaluates the plain average
sum_k p_k w_k while clients train from w (separating the two needs an engine hook); alpha is rescaled
per client by mean(n)/n_k there, not here; it clips gradients at norm 10, we do not.
alpha = 0 is FedAvg exactly: every extra term is skipped. (The limit alpha -> 0+ is not FedAvg:
-h / alpha = (1/N) x the sum of all past client updates, which does not vanish; alpha = 0 means "off".)
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from fedrepro.algorithms.base import Algorithm, Client

if TYPE_CHECKING:
    from fedrepro.sim.flat import FlatModel
    from fedrepro.sim.sync import TrainingConfig


class FedDyn(Algorithm):
    name = "feddyn"

    def __init__(self, alpha: float = 0.01) -> None:
        super().__init__()
        self.alpha = alpha

    def setup(self, flat: FlatModel, num_clients: int, training: TrainingConfig) -> None:
        super().setup(flat, num_clients, training)
        # grad: client id -> that client's grad_k (its local gradient estimate); h: the server's state
        self.state = {"grad": {}, "h": torch.zeros(self.num_params, device=self.device)}

    def correct_grad(self, w: torch.Tensor, g: torch.Tensor, client: Client) -> None:
        if self.alpha == 0:
            return
        grad_k = self.state["grad"].get(client.cid)
        if grad_k is not None:
            g.sub_(grad_k)
        g.add_(w - client.w_start, alpha=self.alpha)

    def upload(self, client: Client, w_end: torch.Tensor) -> dict[str, torch.Tensor]:
        out = super().upload(client, w_end)
        if self.alpha != 0:
            grads = self.state["grad"]
            grads[client.cid] = grads.get(client.cid, 0) - self.alpha * out["delta"]
        return out

    def server_receive(self, cid: int, upload: dict[str, torch.Tensor], weight: float) -> None:
        super().server_receive(cid, upload, weight)
        if self.alpha != 0:
            self.state["h"].add_(upload["delta"], alpha=-self.alpha / self.num_clients)

    def server_end(self, w_global: torch.Tensor) -> torch.Tensor:
        w = super().server_end(w_global)
        return w if self.alpha == 0 else w.sub_(self.state["h"], alpha=1.0 / self.alpha)
