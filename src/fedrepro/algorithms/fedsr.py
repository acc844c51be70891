"""FedSR (Nguyen, Torr & Lim, NeurIPS 2022): a simple probabilistic representation with two regularisers.

The representation is z ~ N(mu(x), diag sigma(x)^2), sampled with the reparameterisation trick in training;
the classifier sees z. The local objective is
    CE(head(z), y) + l2r * E||z||_2 + cmi * KL(N(C mu, C sigma) || N(r_mu[y], softplus(r_sigma[y])))
(the L2 representation regulariser and the conditional-mutual-information bound, with the reference
distributions r(z|y) and the scale C learnt and averaged like the weights), as the FedSR code writes
them: the L2 term is the mean norm of the sampled z, the KL is summed over dimensions and averaged.

Fitting it to this package's models (head(body(x)), the same architecture for every method):
mu(x) = body(x), the model's own representation, and sigma(x) = softplus(A body(x) + b) with (A, b) a
linear layer that, like r_mu, r_sigma and C, lives here as extra parameters: trained by the same local SGD
step as the weights (lr, momentum, weight decay), sent up as deltas, averaged with the aggregation weights
and sent down with the model (all counted in bytes). Evaluation and fine-tuning use z = mu(x) = body(x),
so the pre-trained model is an ordinary model. The FedSR code instead adds a Linear(features, 2 z_dim)
after the backbone; here z_dim is the backbone's feature width. Coefficients default to the FedSR code's
(l2r 0.01, cmi 5e-4). l2r = cmi = 0 is FedAvg exactly (no sampling, no extra parameters exchanged).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from fedrepro.algorithms.base import Algorithm, Client
from fedrepro.algorithms.jacobian import JacobianStats
from fedrepro.plugins import NonNegative, PositiveInt

if TYPE_CHECKING:
    from fedrepro.sim.flat import FlatModel
    from fedrepro.sim.sync import TrainingConfig


def cmi_bound(z_mu: torch.Tensor, z_sigma: torch.Tensor, r_mu: torch.Tensor, r_sigma: torch.Tensor,
              scale: torch.Tensor) -> torch.Tensor:
    """KL(N(scale mu, scale sigma) || N(r_mu, r_sigma)) per sample, summed over dimensions, batch mean."""
    mu, sigma = z_mu * scale, z_sigma * scale
    kl = torch.log(r_sigma) - torch.log(sigma) + (sigma.pow(2) + (mu - r_mu).pow(2)) / (2 * r_sigma.pow(2)) - 0.5
    return kl.sum(dim=1).mean()


class FedSR(JacobianStats, Algorithm):
    name = "fedsr"

    def __init__(self, l2r: NonNegative = 0.01, cmi: NonNegative = 5e-4, jac_stats: bool = False,
                 jac_samples: PositiveInt | None = 512) -> None:
        super().__init__()
        self.l2r, self.cmi = float(l2r), float(cmi)
        self.init_jacobian(jac_stats, jac_samples)

    @property
    def active(self) -> bool:
        return self.l2r != 0 or self.cmi != 0

    def setup(self, flat: FlatModel, num_clients: int, training: TrainingConfig) -> None:
        super().setup(flat, num_clients, training)
        model = flat.model
        d = model.feature_dim
        c = model.head.out_features
        # extra parameters as one flat vector (aggregation is one weighted sum): A [d, d], b [d],
        # r_mu [c, d], r_sigma [c, d], C []; deterministic initial values (the FedSR code's r_mu = 0,
        # r_sigma = 1, C = 1; A = 0, b = 0 gives sigma = softplus(0) everywhere at first)
        self._shapes = {"A": (d, d), "b": (d,), "r_mu": (c, d), "r_sigma": (c, d), "C": ()}
        init = {"A": 0.0, "b": 0.0, "r_mu": 0.0, "r_sigma": 1.0, "C": 1.0}
        parts = [torch.full(s, init[k], device=self.device).reshape(-1) for k, s in self._shapes.items()]
        self.state = {"extra": torch.cat(parts)} if self.active else {}
        self._local: torch.Tensor | None = None

    def views(self, e: torch.Tensor) -> dict[str, torch.Tensor]:
        """Named views of an extra-parameter vector."""
        out, offset = {}, 0
        for key, shape in self._shapes.items():
            n = int(np.prod(shape)) if shape else 1
            out[key] = e[offset : offset + n].reshape(shape)
            offset += n
        return out

    # ----- client side
    def local_loss(self, model: nn.Module, x: torch.Tensor, y: torch.Tensor, client: Client) -> torch.Tensor:
        if not self.active:
            return super().local_loss(model, x, y, client)
        if client.steps == 0:  # a client's first batch: its copy of the extra parameters and their optimiser
            self._local = self.state["extra"].detach().clone().requires_grad_(True)
            self._optimizer = self.training.local_optimizer(client.round)
        p = self.views(self._local)
        z_mu = model.body(x)
        z_sigma = F.softplus(z_mu @ p["A"].T + p["b"])
        z = z_mu + z_sigma * torch.randn_like(z_mu)
        loss = F.cross_entropy(model.head(z), y)
        if self.l2r:
            loss = loss + self.l2r * z.norm(dim=1).mean()
        if self.cmi:
            loss = loss + self.cmi * cmi_bound(z_mu, z_sigma, p["r_mu"][y], F.softplus(p["r_sigma"])[y], p["C"])
        return loss

    def correct_grad(self, w: torch.Tensor, g: torch.Tensor, client: Client) -> None:
        if not self.active:
            return
        # the engine has just back-propagated this batch: step the extra parameters as it steps w
        self._optimizer.step(self._local.data, self._local.grad)
        self._local.grad = None

    def download(self, cid: int) -> dict[str, torch.Tensor]:
        return {"extra": self.state["extra"]} if self.active else {}

    def upload(self, client: Client, w_end: torch.Tensor) -> dict[str, torch.Tensor]:
        out = super().upload(client, w_end)
        if self.active:
            out["delta_extra"] = self._local.detach() - self.state["extra"]
        return out

    # ----- server side
    def server_begin(self, w_global: torch.Tensor, sampled: np.ndarray, weights: np.ndarray) -> None:
        super().server_begin(w_global, sampled, weights)
        if self.active:
            self._sum_extra = torch.zeros_like(self.state["extra"])
        self.probe_round(w_global, sampled)

    def server_receive(self, cid: int, upload: dict[str, torch.Tensor], weight: float) -> None:
        super().server_receive(cid, upload, weight)
        if self.active:
            self._sum_extra.add_(upload["delta_extra"], alpha=float(weight))

    def server_end(self, w_global: torch.Tensor) -> torch.Tensor:
        if self.active:
            self.state["extra"] = self.state["extra"] + self._sum_extra
        return super().server_end(w_global)

    def round_metrics(self) -> dict[str, float]:
        return self.jacobian_metrics()
