"""FedDyn (Acar et al., 2021): a dynamic regulariser that makes stationary local and global optima agree.

Client k minimises L_k(w) - <grad_k, w> + (alpha/2) ||w - w_global||^2, then sets
grad_k <- grad_k - alpha (w_k - w_global). The server keeps h <- h - alpha/N sum_{k in S} (w_k - w_global)
(N = all clients) and sets w <- sum_k p_k w_k - h / alpha, with the engine's weights p_k (uniform: the
paper; Disco: re-weighted). Clients always train from that w. ``evaluate`` says which model is tested:
"server", w (the paper's server model), or "client_mean", sum_k p_k w_k without the -h / alpha term, which
FedDyn's official code reports too (its avg_model) and which FedDisco's code reports as FedDyn's and
FedDisco's accuracy (feddyn.py there evaluates only avg_model).
``max_grad_norm`` (0: off) clips as those codes do: ``clip_grad_norm_(10)`` after the backward pass of
CE - <grad_k, w> - alpha <w_global, w>, whose alpha ||w||^2 / 2 part they leave to SGD's weight decay, which
acts after the clipping (in the embedded default, FedDyn's and FedDyn + Disco's seed 2 swung 1-5 points between
quarters without it, within 1 point with it). Deviation from those codes: alpha is rescaled per client by mean(n)/n_k
there, not here.
alpha = 0 with ``max_grad_norm=0`` is FedAvg exactly: every extra term is skipped. (The limit alpha -> 0+ is not FedAvg:
-h / alpha = (1/N) x the sum of all past client updates, which does not vanish; alpha = 0 means "off".)
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import torch

from fedrepro.algorithms.base import Algorithm, Client, EvaluatedModel, clip_grad_norm_, lane_stack
from fedrepro.plugins import NonNegative

if TYPE_CHECKING:
    from fedrepro.sim.flat import FlatModel
    from fedrepro.sim.sync import TrainingConfig


class FedDyn(Algorithm):
    name = "feddyn"

    def __init__(self, alpha: NonNegative = 0.01, max_grad_norm: NonNegative = 10.0,
                 evaluate: EvaluatedModel = "server") -> None:
        super().__init__()
        self.alpha, self.max_grad_norm, self.evaluate = alpha, max_grad_norm, evaluate

    def setup(self, flat: FlatModel, num_clients: int, training: TrainingConfig) -> None:
        super().setup(flat, num_clients, training)
        # grad: client id -> that client's grad_k (its local gradient estimate); h: the server's state
        self.state = {"grad": {}, "h": torch.zeros_like(flat.w)}  # the model's dtype (float64 in exact tests)

    def correct_grad(self, w: torch.Tensor, g: torch.Tensor, client: Client) -> None:
        grad_k = self.state["grad"].get(client.cid)
        if grad_k is not None:
            g.sub_(grad_k)
        if self.alpha != 0:
            g.sub_(client.w_start, alpha=self.alpha)
        clip_grad_norm_(g, self.max_grad_norm)
        if self.alpha != 0:
            g.add_(w, alpha=self.alpha)  # the proximal term's alpha w: the official code's weight decay

    def batched_correction(self, clients: list[Client], w_global: torch.Tensor
                           ) -> Callable[[torch.Tensor, torch.Tensor, int], None]:
        grad_k = lane_stack(self.state["grad"], clients, w_global)

        def correct(w: torch.Tensor, g: torch.Tensor, t: int) -> None:
            g.sub_(grad_k)
            if self.alpha != 0:
                g.sub_(w_global, alpha=self.alpha)
            clip_grad_norm_(g, self.max_grad_norm)  # each lane to its own norm
            if self.alpha != 0:
                g.add_(w, alpha=self.alpha)

        return correct

    def upload(self, client: Client, w_end: torch.Tensor) -> dict[str, torch.Tensor]:
        out = super().upload(client, w_end)
        if self.alpha != 0:
            grads = self.state["grad"]
            grads[client.cid] = grads.get(client.cid, 0) - self.alpha * out["delta"]
        return out

    def state_bytes_per_client(self, num_params: int) -> int:
        return 4 * num_params if self.alpha != 0 else 0  # grad_k, float32

    def server_receive(self, cid: int, upload: dict[str, torch.Tensor], weight: float) -> None:
        super().server_receive(cid, upload, weight)
        if self.alpha != 0:
            self.state["h"].add_(upload["delta"], alpha=-self.alpha / self.num_clients)

    def server_end(self, w_global: torch.Tensor) -> torch.Tensor:
        w = super().server_end(w_global)  # sum_k p_k w_k
        if self.evaluate == "client_mean":  # in the state, so a resumed run reports the same model
            self.state["client_mean"] = w.clone()
        return w if self.alpha == 0 else w.sub_(self.state["h"], alpha=1.0 / self.alpha)

    def evaluated_model(self, w_global: torch.Tensor) -> torch.Tensor:
        return self.state["client_mean"] if self.evaluate == "client_mean" else w_global
