"""FedDC (Gao et al., 2022): local drift decoupling (h_k) and SCAFFOLD-style gradient correction.

Client k minimises CE + (alpha/2) ||w + h_k - w_global||^2 + <w, g - g_k>, then h_k += w_k - w_global
and g_k <- g_k - g - (w_k - w_global) / (lr K) (K = its local steps). The server sets
w <- sum_k p_k w_k + (1/N) sum_{all k} h_k (N = all clients; p_k the engine's weights, so Disco re-weights
the models and not the drifts, as FedDisco's code does) and g += (1/N) sum_{k in S} (g_k' - g_k).
The terms are those of the official FedDC code (the paper writes the correction as
(1/(lr K)) <w, update_k - update>; the code keeps it pre-scaled by 1/(lr K), recursively, as SCAFFOLD
option II), and so is the clipping of the objective's gradient at ``max_grad_norm`` (0: off): without
it the correction of a client with few steps can blow up. That code trains without momentum; with
momentum beta, (w_k - w_global) / (lr K) overstates the local gradient by up to 1/(1 - beta).
``evaluate`` says which model is tested (clients always train from w): "server", w, or "client_mean",
sum_k p_k w_k without the drift term, the model that code reports (its avg_model).
Deviation from that code (and FedDisco's copy): it rescales alpha and the states per client by
mean(n)/n_k. FedDisco's copy computes g_k but never adds <w, g - g_k> to the loss:
``grad_correction=False`` is that variant (no g, g_k, nor their bytes), and then FedDC is FedDyn with
the same alpha (same local gradient, same server step) up to rounding.
Reductions: alpha = 0 turns the drift off entirely (penalty and the server's drift term, which without
the penalty would only double the step). alpha = 0, ``grad_correction=False``, ``max_grad_norm=0`` is
FedAvg exactly; alpha = 0 with the correction is SCAFFOLD (option II, global step 1).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import torch

from fedrepro.algorithms.base import Algorithm, Client, EvaluatedModel, clip_grad_norm_, lane_stack
from fedrepro.plugins import NonNegative

if TYPE_CHECKING:
    import numpy as np

    from fedrepro.sim.flat import FlatModel
    from fedrepro.sim.sync import TrainingConfig


class FedDC(Algorithm):
    name = "feddc"

    def __init__(
        self, alpha: NonNegative = 0.01, grad_correction: bool = True, max_grad_norm: NonNegative = 10.0,
        evaluate: EvaluatedModel = "server",
    ) -> None:
        super().__init__()
        self.alpha, self.grad_correction, self.max_grad_norm = alpha, grad_correction, max_grad_norm
        self.evaluate = evaluate

    def setup(self, flat: FlatModel, num_clients: int, training: TrainingConfig) -> None:
        super().setup(flat, num_clients, training)
        zeros = torch.zeros_like(flat.w)
        # h, g_k: client id -> drift, local gradient state; h_mean = (1/N) sum_k h_k and g on the server
        self.state = {"h": {}, "h_mean": zeros, "g_k": {}, "g": zeros.clone()}

    def state_bytes_per_client(self, num_params: int) -> int:
        return 4 * num_params * ((self.alpha != 0) + self.grad_correction)  # h_k and g_k, float32

    def download(self, cid: int) -> dict[str, torch.Tensor]:
        return {"g": self.state["g"]} if self.grad_correction else {}

    def correct_grad(self, w: torch.Tensor, g: torch.Tensor, client: Client) -> None:
        if self.alpha != 0:
            g.add_(w - client.w_start, alpha=self.alpha)
            if client.cid in self.state["h"]:
                g.add_(self.state["h"][client.cid], alpha=self.alpha)
        if self.grad_correction:
            g.add_(self.state["g"])
            if client.cid in self.state["g_k"]:
                g.sub_(self.state["g_k"][client.cid])
        clip_grad_norm_(g, self.max_grad_norm)  # the whole objective's gradient, as the official code

    def batched_correction(self, clients: list[Client], w_global: torch.Tensor
                           ) -> Callable[[torch.Tensor, torch.Tensor, int], None]:
        drift = lane_stack(self.state["h"], clients, w_global) if self.alpha != 0 else None
        own_grad = lane_stack(self.state["g_k"], clients, w_global) if self.grad_correction else None

        def correct(w: torch.Tensor, g: torch.Tensor, t: int) -> None:
            if drift is not None:
                g.add_(w - w_global, alpha=self.alpha)
                g.add_(drift, alpha=self.alpha)
            if own_grad is not None:
                g.add_(self.state["g"])
                g.sub_(own_grad)
            clip_grad_norm_(g, self.max_grad_norm)  # each lane to its own norm

        return correct

    def upload(self, client: Client, w_end: torch.Tensor) -> dict[str, torch.Tensor]:
        out = super().upload(client, w_end)
        delta, cid = out["delta"], client.cid
        if self.alpha != 0:
            self.state["h"][cid] = self.state["h"].get(cid, 0) + delta
        if self.grad_correction:
            old = self.state["g_k"].get(cid, torch.zeros_like(delta))
            new = old - self.state["g"] - delta / (self.training.lr_at(client.round) * max(client.steps, 1))
            self.state["g_k"][cid] = new
            out["g_diff"] = new - old
        return out

    def server_begin(self, w_global: torch.Tensor, sampled: np.ndarray, weights: np.ndarray) -> None:
        super().server_begin(w_global, sampled, weights)
        self._g_sum = torch.zeros_like(w_global) if self.grad_correction else None

    def server_receive(self, cid: int, upload: dict[str, torch.Tensor], weight: float) -> None:
        super().server_receive(cid, upload, weight)
        if self.alpha != 0:  # h_k grew by exactly this client's update
            self.state["h_mean"].add_(upload["delta"], alpha=1.0 / self.num_clients)
        if self.grad_correction:  # applied in server_end: later clients of this round still see the old g
            self._g_sum.add_(upload["g_diff"])

    def server_end(self, w_global: torch.Tensor) -> torch.Tensor:
        w = super().server_end(w_global)  # sum_k p_k w_k
        if self.grad_correction:
            self.state["g"].add_(self._g_sum, alpha=1.0 / self.num_clients)
        if self.evaluate == "client_mean":  # in the state, so a resumed run reports the same model
            self.state["client_mean"] = w.clone()
        return w if self.alpha == 0 else w.add_(self.state["h_mean"])

    def evaluated_model(self, w_global: torch.Tensor) -> torch.Tensor:
        return self.state["client_mean"] if self.evaluate == "client_mean" else w_global
