"""MOON (Li et al., 2021): model-contrastive learning between local, global and previous local features.

loss = CE + mu * l_con, l_con = -log(e^{sim(z, z_glob)/T} / (e^{sim(z, z_glob)/T} + e^{sim(z, z_prev)/T}))
with cosine similarity on z = model.body(x): the representation before the head. MOON's extra
projection head is not used (the models here are body + linear head for every method, so MOON trains
the same architecture as the baselines it is compared with). z_glob comes from the round's global
vector, z_prev from the client's model at the end of its previous participation (a buffer of one, MOON's
default); both are evaluated with the same module via torch.func.functional_call, without gradient.
Both vectors stay fixed while a client trains, so where the body maps each sample alone (no batch statistics,
no dropout) the sequential engine computes a sample's z_glob and z_prev once, in its first local epoch, and
looks them up in the later ones (``FrozenFeatures``): E epochs cost one extra pair of forward passes, not E.
On a client's first participation prev = global: then l_con = log 2 whatever z, so the term has zero
gradient, as in the official code's round 1, whose empty pool leaves only the positive logit (a client
first sampled later contrasts there with its never-trained initial net; here with the global model).
mu = 0 is FedAvg exactly: no extra forward passes and no stored models.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F
from torch import nn
from torch.func import functional_call

from fedrepro.algorithms.base import Algorithm, Client, masked_mean
from fedrepro.plugins import NonNegative, Positive

if TYPE_CHECKING:
    from fedrepro.sim.flat import FlatModel
    from fedrepro.sim.sync import TrainingConfig


def maps_each_sample_alone(module: nn.Module) -> bool:
    """Whether ``module``'s output for a sample depends on nothing else, call after call: no BatchNorm (its
    training-mode statistics mix the batch) and no dropout (a fresh mask each call)."""
    mixing = (nn.modules.batchnorm._BatchNorm, nn.modules.dropout._DropoutNd)
    return not any(isinstance(m, mixing) for m in module.modules())


class FrozenFeatures:
    """Per-sample features of fixed parameter vectors during one client's local training: a row per sample of
    the client (``Client.samples``), computed the first time the sample comes in a batch of that training
    (``Client.batch``) and looked up after; cleared when the next client's training starts."""

    def __init__(self) -> None:
        self.owner: Client | None = None  # whose training the tables are of: the engine makes a Client per training
        self.samples = torch.empty(0, dtype=torch.long)  # the owner's sample indices, sorted: row i is samples[i]
        self.tables: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}  # name -> (features, known)

    def lookup(self, client: Client, name: str, x: torch.Tensor,
               compute: Callable[[torch.Tensor], torch.Tensor]) -> torch.Tensor:
        """The features under ``name`` of the client's current batch (``x`` its inputs), from ``compute`` for
        the samples not seen yet in this training."""
        if client is not self.owner:
            self.owner, self.samples, self.tables = client, torch.sort(client.samples).values, {}
        rows = torch.searchsorted(self.samples, client.batch)
        if name not in self.tables:
            z = compute(x)
            feats = z.new_empty((len(self.samples), *z.shape[1:]))
            known = torch.zeros(len(self.samples), dtype=torch.bool, device=z.device)
            feats[rows], known[rows] = z, True
            self.tables[name] = (feats, known)
            return z
        feats, known = self.tables[name]
        missing = ~known[rows]
        if missing.any():
            feats[rows[missing]], known[rows[missing]] = compute(x[missing]), True
        return feats[rows]


def contrastive_loss(
    z: torch.Tensor, z_glob: torch.Tensor, z_prev: torch.Tensor, temperature: float, reduction: str = "mean"
) -> torch.Tensor:
    """MOON's l_con (averaged over the batch, or per sample): cross-entropy with the global features as
    the positive."""
    logits = torch.stack([F.cosine_similarity(z, z_glob, dim=-1), F.cosine_similarity(z, z_prev, dim=-1)], 1)
    target = torch.zeros(len(z), dtype=torch.long, device=z.device)
    return F.cross_entropy(logits / temperature, target, reduction=reduction)


class Moon(Algorithm):
    name = "moon"

    def __init__(self, mu: NonNegative = 0.1, temperature: Positive = 0.5) -> None:
        super().__init__()
        self.mu, self.temperature = mu, temperature

    def setup(self, flat: FlatModel, num_clients: int, training: TrainingConfig) -> None:
        super().setup(flat, num_clients, training)
        self.state = {"prev": {}}  # client id -> its last local model (flat vector)
        self.frozen = FrozenFeatures()  # not state: rebuilt from the vectors whenever a client starts
        self.body_per_sample = maps_each_sample_alone(flat.model.body)

    def state_bytes_per_client(self, num_params: int) -> int:
        return 4 * num_params if self.mu != 0 else 0  # the previous local model, float32

    def features(self, model: nn.Module, vector: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        """``model.body(x)`` with the parameters ``vector``, without gradient."""
        with torch.no_grad():
            return functional_call(model.body, self.flat.as_params(vector, "body."), (x,))

    def client_features(self, model: nn.Module, client: Client, name: str, vector: torch.Tensor,
                        x: torch.Tensor) -> torch.Tensor:
        """``features`` of the client's fixed vector ``name``, looked up by sample index where the body maps
        each sample alone and the engine says which samples ``x`` holds."""
        if client.batch is None or client.samples is None or not self.body_per_sample:
            return self.features(model, vector, x)
        return self.frozen.lookup(client, name, x, lambda x_new: self.features(model, vector, x_new))

    def local_loss(self, model: nn.Module, x: torch.Tensor, y: torch.Tensor, client: Client) -> torch.Tensor:
        if self.mu == 0:
            return super().local_loss(model, x, y, client)
        z = model.body(x)
        z_glob = self.client_features(model, client, "glob", client.w_start, x)
        prev = self.state["prev"].get(client.cid)
        z_prev = z_glob if prev is None else self.client_features(model, client, "prev", prev, x)
        l_con = contrastive_loss(z, z_glob, z_prev, self.temperature)
        return F.cross_entropy(model.head(z), y) + self.mu * l_con

    def loss_extras(self, client: Client) -> dict[str, torch.Tensor]:
        if self.mu == 0:
            return {}
        return {"glob": client.w_start, "prev": self.state["prev"].get(client.cid, client.w_start)}

    def functional_loss(self, model: nn.Module, params: dict[str, torch.Tensor], x: torch.Tensor, y: torch.Tensor,
                        mask: torch.Tensor, extras: dict[str, torch.Tensor]) -> torch.Tensor:
        if self.mu == 0:
            return super().functional_loss(model, params, x, y, mask, extras)
        body = {k[len("body."):]: v for k, v in params.items() if k.startswith("body.")}
        head = {k[len("head."):]: v for k, v in params.items() if k.startswith("head.")}
        z = functional_call(model.body, body, (x,))
        z_glob = functional_call(model.body, self.flat.as_params(extras["glob"].detach(), "body."), (x,)).detach()
        z_prev = functional_call(model.body, self.flat.as_params(extras["prev"].detach(), "body."), (x,)).detach()
        per_sample = F.cross_entropy(functional_call(model.head, head, (z,)), y, reduction="none")
        per_sample = per_sample + self.mu * contrastive_loss(z, z_glob, z_prev, self.temperature, reduction="none")
        return masked_mean(per_sample, mask)

    def upload(self, client: Client, w_end: torch.Tensor) -> dict[str, torch.Tensor]:
        if self.mu != 0:
            self.state["prev"][client.cid] = w_end.clone()
        return super().upload(client, w_end)
