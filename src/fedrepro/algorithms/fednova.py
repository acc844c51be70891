"""FedNova (Wang et al., 2020): normalised averaging, so clients that take more local steps do not pull
the global model towards their own optimum.

Client k's update is delta_k = -lr * G_k a_k, where a_k weights its tau_k stochastic gradients: all
ones for plain SGD, a_k[t] = (1 - rho^(tau_k - t + 1)) / (1 - rho), t = 1..tau_k, with local momentum
rho. It uploads d_k = delta_k / ||a_k||_1 and ||a_k||_1; the server steps w <- w + tau_eff * sum_k p_k d_k
with tau_eff = sum_k p_k ||a_k||_1 (p_k: the round's aggregation weights, so Disco re-weights before the
normalisation, as in FedDisco's code).

||a_k||_1 is taken over the steps the client really took (``client.steps``: local epochs, drop_last and
stragglers included), as in the paper. FedDisco's code (fednova.py there) normalises by n_k // B instead:
one epoch's steps with drop_last, momentum ignored. The epochs cancel (tau_eff and every ||a_k||_1 scale
together), and so does momentum's 1/(1 - rho); what remains is momentum's offset, ||a||_1 (1 - rho) =
tau - rho (1 - rho^tau) / (1 - rho), i.e. about 9 steps fewer at rho = 0.9, which changes the weights only
where clients' step counts differ and are small, and nothing where every client takes the same number of
steps (NIID-2, its partial participation). A client with fewer than B samples makes that code divide by
zero; here it takes one short step per epoch (sim/batches.py).
"""

from __future__ import annotations

import numpy as np
import torch

from fedrepro.algorithms.base import Algorithm, Client


def a_norm(steps: int, momentum: float) -> float:
    """||a||_1 of ``steps`` local SGD steps with heavy-ball momentum (dampening 0)."""
    if momentum == 0:
        return float(steps)
    rho = momentum
    return (steps - rho * (1 - rho**steps) / (1 - rho)) / (1 - rho)


class FedNova(Algorithm):
    name = "fednova"

    def upload(self, client: Client, w_end: torch.Tensor) -> dict[str, torch.Tensor]:
        norm = torch.tensor([a_norm(client.steps, self.training.momentum)], dtype=w_end.dtype,
                            device=w_end.device)
        return {"delta": (w_end - client.w_start) / norm, "a_norm": norm}

    def server_begin(self, w_global: torch.Tensor, sampled: np.ndarray, weights: np.ndarray) -> None:
        super().server_begin(w_global, sampled, weights)
        self._tau_eff = 0.0

    def server_receive(self, cid: int, upload: dict[str, torch.Tensor], weight: float) -> None:
        super().server_receive(cid, upload, weight)
        self._tau_eff += float(weight) * float(upload["a_norm"])

    def server_end(self, w_global: torch.Tensor) -> torch.Tensor:
        return w_global + self._tau_eff * self._sum
