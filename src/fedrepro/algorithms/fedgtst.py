"""FedGTST (Ma et al., NeurIPS 2024), Algorithm 1: Jacobian-norm statistics tuning for transferability.

Client k minimises CE + xi (||J_k|| - gamma)^2 (Eq. 10), J_k the gradient of its minibatch loss w.r.t. all
weights (double backprop) and gamma the server's guide norm. After local training it reports one scalar,
its surrogate norm gamma_k = ||J_k(w_k)|| at its trained model, by the very estimator the regulariser
uses: the mean minibatch gradient norm at the training batch size (Alg. 1 reads one ||J^(k)|| in lines 5
and 6; a full-data norm would be smaller than the minibatch norms, and a guide norm taken from it would
pull every client's norm down instead of up). A random set phi of 10% of all K clients is drawn each
round (Alg. 1, line 1); those of them that take part also train without the regulariser from the same
start and report max(regularised, vanilla) norm (the vanilla model is thrown away: the transmitted model
is the regularised one). The server averages the models as FedAvg does and sets the next guide norm to
the largest reported norm, broadcast with the model.

Choices where the paper is silent (options; config/studies/fedgtst.yaml says which the study uses):
- gamma_0 (``gamma0``): None = round 1 trains without the regulariser and its reported norms give
  gamma_1; a number fixes gamma_0.
- the surrogate norm is averaged over the minibatches of a fixed subset of the client's data
  (``norm_samples``, at least one batch), at the model it transmits (its vanilla twin's, for the max);
- phi has max(1, round(``vanilla_fraction`` K)) clients (at least one, so that K = 5 has one), drawn
  among all K, not among the participants: under partial participation a round has on average the
  participation rate times |phi| vanilla runs, as Alg. 1 with its client loop over [K] implies; the
  vanilla run takes the very batches of the regularised run (the engine's batch seed), i.e. it is the
  FedAvg client update.
xi = 0 is FedAvg exactly: no regulariser, no norm, no vanilla run, nothing extra up or down.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from fedrepro import seeding
from fedrepro.algorithms.base import Algorithm, Client
from fedrepro.algorithms.jacobian import JacobianStats, client_sample, mean_loss_gradient
from fedrepro.plugins import Fraction, NonNegative, PositiveInt

if TYPE_CHECKING:
    from fedrepro.sim.flat import FlatModel
    from fedrepro.sim.sync import TrainingConfig

VANILLA_DRAW = 102  # seed purpose of the per-round vanilla subset phi


def loss_and_jacobian_norm(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(CE on the batch, ||d CE / d w||_2) with the norm differentiable w.r.t. w (create_graph)."""
    ce = F.cross_entropy(model(x), y)
    params = [p for p in model.parameters() if p.requires_grad]
    grads = torch.autograd.grad(ce, params, create_graph=True)
    sq = torch.stack([g.pow(2).sum() for g in grads]).sum()
    return ce, sq.clamp_min(1e-24).sqrt()  # clamp: sqrt has an infinite slope at 0


def regularised_loss(model: nn.Module, x: torch.Tensor, y: torch.Tensor, xi: float, gamma: float) -> torch.Tensor:
    """Eq. 10 on one batch: CE + xi (||J|| - gamma)^2."""
    ce, norm = loss_and_jacobian_norm(model, x, y)
    return ce + xi * (norm - gamma) ** 2


class FedGTST(JacobianStats, Algorithm):
    name = "fedgtst"

    def __init__(self, xi: NonNegative = 5e-4, vanilla_fraction: Fraction = 0.1, gamma0: float | None = None,
                 norm_samples: PositiveInt | None = 512, jac_stats: bool = False,
                 jac_samples: PositiveInt | None = 512) -> None:
        super().__init__()
        self.xi, self.vanilla_fraction, self.gamma0 = float(xi), float(vanilla_fraction), gamma0
        self.norm_samples = norm_samples
        self.init_jacobian(jac_stats, jac_samples)

    def setup(self, flat: FlatModel, num_clients: int, training: TrainingConfig) -> None:
        super().setup(flat, num_clients, training)
        # the guide norm: absent until the first norms arrive (unless gamma0 is given)
        self.state = {} if self.gamma0 is None else {"gamma": torch.tensor(float(self.gamma0), device=self.device)}
        self._phi: tuple[int, set[int]] = (-1, set())

    # ----- client side
    def local_loss(self, model: nn.Module, x: torch.Tensor, y: torch.Tensor, client: Client) -> torch.Tensor:
        gamma = self.state.get("gamma")
        if self.xi == 0 or gamma is None:
            return super().local_loss(model, x, y, client)
        return regularised_loss(model, x, y, self.xi, gamma)

    def download(self, cid: int) -> dict[str, torch.Tensor]:
        gamma = self.state.get("gamma")
        return {} if self.xi == 0 or gamma is None else {"gamma": gamma}

    def upload(self, client: Client, w_end: torch.Tensor) -> dict[str, torch.Tensor]:
        out = super().upload(client, w_end)
        if self.xi == 0:
            return out
        w_reg = w_end.detach().clone()
        norm = self.surrogate_norm(w_reg, client.cid)
        if client.cid in self.vanilla_clients(client.round):
            w_vanilla = self.train_vanilla(client)
            norm = torch.maximum(norm, self.surrogate_norm(w_vanilla, client.cid))
            self.flat.load(w_reg)  # leave the engine's model as its hook found it
        out["norm"] = norm.reshape(())
        return out

    def surrogate_norm(self, w: torch.Tensor, cid: int) -> torch.Tensor:
        """||J_k(w)|| as the regulariser sees it: the mean, over minibatches of the training batch size
        from a fixed subset of client ``cid``'s data (``norm_samples``, at least one batch), of the
        minibatch loss's gradient norm. A short last batch is left out when there are full ones: its
        norm is noisier, hence larger, than a full batch's."""
        sim, size = self.sim, self.training.batch_size
        budget = None if self.norm_samples is None else max(self.norm_samples, size)
        idx = client_sample(sim.clients[cid], budget, sim.seed, cid)
        batches = [idx[start : start + size] for start in range(0, len(idx), size)]
        if len(batches) > 1 and len(batches[-1]) < size:
            batches.pop()
        x, y = sim.data.x_train, sim.data.y_train
        return torch.stack([mean_loss_gradient(self.flat, x[b], y[b], w).norm() for b in batches]).mean()

    def vanilla_clients(self, rnd: int) -> set[int]:
        """phi of round ``rnd`` (Alg. 1, line 1): max(1, round(vanilla_fraction * K)) clients drawn among
        all K; only those of them that take part in the round train a vanilla twin."""
        if self._phi[0] != rnd:
            k = self.num_clients
            m = 0 if self.vanilla_fraction == 0 else min(k, max(1, round(self.vanilla_fraction * k)))
            rng = seeding.rng_for(self.sim.seed, VANILLA_DRAW, rnd)
            self._phi = (rnd, set(rng.choice(k, m, replace=False).tolist()))
        return self._phi[1]

    def train_vanilla(self, client: Client) -> torch.Tensor:
        """The client's plain-CE local training from the round's global model (the engine's optimiser at the
        round's learning rate; its batch order), returning the final parameters."""
        sim, flat, cfg = self.sim, self.flat, self.training
        idx = sim.clients[client.cid]
        x_all, y_all = sim.data.x_train, sim.data.y_train
        gen = torch.Generator().manual_seed(seeding.derive_seed(sim.seed, seeding.BATCHES, client.round, client.cid))
        flat.load(client.w_start)
        optimizer = cfg.local_optimizer(client.round)
        for _ in range(cfg.local_epochs):
            order = idx[torch.randperm(len(idx), generator=gen).to(idx.device)]
            for start in range(0, len(idx), cfg.batch_size):
                batch = order[start : start + cfg.batch_size]
                flat.zero_grad()
                with torch.enable_grad():  # called from upload, which the engine runs under no_grad
                    F.cross_entropy(flat.model(x_all[batch]), y_all[batch]).backward()
                with torch.no_grad():
                    optimizer.step(flat.w, flat.g)
        flat.zero_grad()
        return flat.w.detach().clone()

    # ----- server side
    def server_begin(self, w_global: torch.Tensor, sampled: np.ndarray, weights: np.ndarray) -> None:
        super().server_begin(w_global, sampled, weights)
        self._norms: list[torch.Tensor] = []
        self.probe_round(w_global, sampled)

    def server_receive(self, cid: int, upload: dict[str, torch.Tensor], weight: float) -> None:
        super().server_receive(cid, upload, weight)
        if "norm" in upload:
            self._norms.append(upload["norm"])

    def server_end(self, w_global: torch.Tensor) -> torch.Tensor:
        if self._norms:
            self.state["gamma"] = guide_norm(self._norms)
        return super().server_end(w_global)

    def round_metrics(self) -> dict[str, float]:
        out = self.jacobian_metrics()
        if self.xi != 0:
            gamma = self.state.get("gamma")
            out["guide_norm"] = float("nan") if gamma is None else float(gamma)
        return out


def guide_norm(norms: list[torch.Tensor]) -> torch.Tensor:
    """The server's guide norm: the largest surrogate norm reported this round (Algorithm 1, line 13)."""
    return torch.stack([n.reshape(()) for n in norms]).max()
