"""Feddle (Zhu et al.): federated dual learning. Arriving updates become anchors of a model atlas (at most
``atlas_size``, default 2 x clients per round); in every round where updates arrived, the server searches
coefficients c on its own data and steps w <- w + sum_m c_m a_m (asyncfl/atlas.py, App. E's gradient trick).

- ``normalize``: every anchor rescaled to the median anchor norm before the search (Eq. 5).
- ``importance``: a full atlas replaces the anchor with the smallest |c_m| of the last search (else FIFO);
  an anchor not yet searched is never replaced by importance.
- ``fallback_init``: c starts at FedBuff's coefficients (the updates that arrived since the last search,
  each with weight fedbuff_lr / their count, in the normalised basis; older anchors 0), else at 0.
- ``fallback_lambda``: (lambda/2) ||c - c'||^2 pulls c towards those FedBuff coefficients c' (Eq. 11).
- ``lr_scale``: "anchors" divides the search's lr by sum_m ||a_m||^2 (Theorem 1's step size), "none" keeps it.
- ``grad_cosine`` (a diagnostic, Fig. 7 / Eq. 8): log coef_grad_cos, the cosine between dL/dc of the search's loss
  and of the cross-entropy on the in-domain set (the run's carved server set), at the search's starting c, each
  over a seeded subset of at most GRAD_SAMPLES samples, accumulated over chunks of ``batch_size`` samples.
- ``server_data``: in_domain searches c on the server's labelled in-domain data (Eq. 6); out_of_domain first
  fits a fresh linear head for the other labels on the body of w + sum c'_m a_m, then searches c with that
  head fixed (Eq. 9-10) and updates the full model (body and head) with c.
Each component is a switch, so the ablation (Table 3) is a grid of runs.

BatchNorm statistics (asyncfl/base.py's rule): each anchor keeps its client's statistics; the search, its
feature pass and the gradient-cosine diagnostic run in eval mode with the statistics merged at the search's
starting c (FedBuff's merge with fallback_init), and the step merges them with the searched coefficients of
the raw updates, c_m times the normalisation factor: b <- (1 - s) b + s sum_m p_m b_m.
"""

from __future__ import annotations

import math
from typing import Literal

import torch
import torch.nn.functional as F
from torch import Tensor

from fedrepro.asyncfl.atlas import coefficient_grad, normalize_anchors, replace_slot, search_coefficients
from fedrepro.asyncfl.base import AsyncMethod, ServerData, ServerPass, ServerWork, Update, merge_buffers
from fedrepro.plugins import NonNegative, NonNegativeInt, Positive, PositiveInt
from fedrepro.sim.tensors import eval_mode, in_inference_batches

HEAD = 1  # server-generator purpose of the OOD head fit
# the coefficient statistics of the last search (Fig. 6), NaN before the first
STATS = ("coef_mean", "coef_std", "coef_min", "coef_max", "coef_neg_frac", "atlas")
GRAD_SAMPLES, COSINE = 1024, 2  # grad_cosine: samples per set; server-generator purpose of its subsets


class Feddle(AsyncMethod):
    name = "feddle"

    def __init__(self, server_data: ServerData = "in_domain", atlas_size: PositiveInt | None = None,
                 lr: Positive = 1e-3, epochs: PositiveInt = 1, batch_size: PositiveInt = 64, normalize: bool = True,
                 importance: bool = True, fallback_init: bool = True, fallback_lambda: NonNegative = 0.0,
                 fedbuff_lr: Positive = 1.0, head_epochs: NonNegativeInt = 10, head_lr: Positive = 1e-2,
                 lr_scale: Literal["none", "anchors"] = "none", grad_cosine: bool = False) -> None:
        super().__init__()
        self.server_data = server_data
        self.atlas_size, self.lr, self.epochs, self.batch_size = atlas_size, lr, epochs, batch_size
        self.normalize, self.importance = normalize, importance
        self.fallback_init, self.fallback_lambda, self.fedbuff_lr = fallback_init, fallback_lambda, fedbuff_lr
        self.head_epochs, self.head_lr = head_epochs, head_lr
        self.lr_scale = lr_scale
        self.grad_cosine = grad_cosine

    def setup(self, run) -> None:
        super().setup(run)
        self.capacity = self.atlas_size or 2 * run.clients_per_round
        stats = STATS + ("coef_grad_cos",) if self.grad_cosine else STATS
        # anchor_buffers[m]: the BatchNorm statistics of anchor m's client (None for a model without any)
        self.state = {"anchors": [], "anchor_buffers": [], "scores": [], "ages": [], "fresh": [], "added": 0,
                      "stats": dict.fromkeys(stats, math.nan)}

    def server_passes(self, work: ServerWork) -> list[ServerPass]:
        """The search; the OOD head's feature pass (the head itself, a linear layer on cached features, is left
        out); the gradient cosine's subsets of both sets."""
        passes = [ServerPass(work.rounds * self.epochs * work.samples, self.batch_size, True)]
        if self.server_data == "out_of_domain":
            passes.append(ServerPass(work.rounds * work.samples, None, False))
        if self.grad_cosine:
            cosine = min(GRAD_SAMPLES, work.samples) + min(GRAD_SAMPLES, work.in_domain_samples)
            passes.append(ServerPass(work.rounds * cosine, self.batch_size, True))
        return passes

    def server_receive(self, w: Tensor, update: Update) -> Tensor:
        s = self.state
        slot = replace_slot(s["scores"], s["ages"], self.capacity, self.importance)
        # not yet searched: never replaced by score
        entry = (update.delta.clone(), update.buffers, math.inf, s["added"], True)
        keys = ("anchors", "anchor_buffers", "scores", "ages", "fresh")
        if slot is None:
            for key, value in zip(keys, entry, strict=True):
                s[key].append(value)
        else:
            for key, value in zip(keys, entry, strict=True):
                s[key][slot] = value
        s["added"] += 1
        return w

    def fedbuff_coefficients(self, factors: Tensor) -> Tensor:
        """FedBuff's step in the (normalised) anchor basis: fedbuff_lr / n for each of the n fresh anchors."""
        fresh = torch.tensor(self.state["fresh"], device=factors.device)
        return torch.where(fresh, self.fedbuff_lr / fresh.sum() / factors, torch.zeros_like(factors))

    def server_end(self, w: Tensor, rnd: int) -> Tensor:
        s = self.state
        if not any(s["fresh"]):
            return w
        anchors = torch.stack(s["anchors"])
        if self.normalize:
            anchors, factors = normalize_anchors(anchors)
        else:
            factors = torch.ones(len(anchors), device=w.device)
        prior = self.fedbuff_coefficients(factors)
        c0 = prior if self.fallback_init else torch.zeros_like(prior)
        if self.run.global_buffers is not None:  # the search's model carries the statistics merged at c0
            self.flat.load_buffers(self.merged_buffers(c0 * factors))
        with eval_mode(self.model):  # no pass of the search trains: BatchNorm statistics stay as loaded
            loss = self.server_ce if self.server_data == "in_domain" else self.ood_loss(w + c0 @ anchors, rnd)
            cosine = self.gradient_cosine(w, anchors, c0, loss, rnd) if self.grad_cosine else None
            # Theorem 1's server step size is O(1 / sum_m ||a_m||^2): lr_scale "anchors" divides lr by it
            lr = self.lr / float((anchors * anchors).sum()) if self.lr_scale == "anchors" else self.lr
            c = search_coefficients(self.flat, w, anchors, c0, loss, len(self.run.server_y), self.epochs, lr,
                                    self.batch_size, self.server_generator(rnd), self.fallback_lambda, prior)
        if self.run.global_buffers is not None:
            self.run.global_buffers = self.merged_buffers(c * factors)
        s["scores"] = c.abs().tolist()
        s["fresh"] = [False] * len(c)
        s["stats"] = {"coef_mean": c.mean().item(), "coef_std": c.std().item() if len(c) > 1 else 0.0,
                      "coef_min": c.min().item(), "coef_max": c.max().item(),
                      "coef_neg_frac": (c < 0).float().mean().item(), "atlas": float(len(c)),
                      **({"coef_grad_cos": cosine} if cosine is not None else {})}
        return (w + c @ anchors).detach()

    def merged_buffers(self, raw_coefficients: Tensor) -> Tensor:
        """The global statistics merged with the anchors' by their coefficients on the raw (unnormalised) updates."""
        return merge_buffers(self.run.global_buffers, raw_coefficients.tolist(), self.state["anchor_buffers"])

    def gradient_cosine(self, w: Tensor, anchors: Tensor, c: Tensor, loss, rnd: int) -> float:
        """cos(dL_search/dc, dCE_in-domain/dc) at ``c`` (Eq. 8's alignment of the surrogate's gradient)."""
        gen = self.server_generator(rnd, COSINE)
        run = self.run

        def subset(n: int) -> Tensor:
            return torch.randperm(n, generator=gen)[:GRAD_SAMPLES].to(w.device)

        def id_ce(idx: Tensor) -> Tensor:
            return F.cross_entropy(self.model(run.id_x[idx]), run.id_y[idx])

        # in chunks of the search's batch: the diagnostic needs no more memory than one step of the search
        _, g_search = coefficient_grad(self.flat, w, anchors, c, loss, subset(len(run.server_y)), self.batch_size)
        _, g_id = coefficient_grad(self.flat, w, anchors, c, id_ce, subset(len(run.id_y)), self.batch_size)
        return F.cosine_similarity(g_search, g_id, dim=0).item()

    def ood_loss(self, w_fit: Tensor, rnd: int):
        """The surrogate loss on the out-of-domain data: a fresh linear head theta for its labels, fitted on the
        body of ``w_fit`` (features computed once, Adam for ``head_epochs``), then fixed."""
        x, y = self.run.server_x, self.run.server_y
        self.flat.load(w_fit)
        with torch.no_grad():
            feats = in_inference_batches(self.model.body, x)
        gen = self.server_generator(rnd, HEAD)
        head = torch.nn.Linear(feats.shape[1], self.run.server_classes).to(feats.device)
        with torch.no_grad():  # seeded initialisation (nn.Linear's own draws from the global generator)
            bound = 1.0 / math.sqrt(feats.shape[1])
            head.weight.copy_((torch.rand(head.weight.shape, generator=gen) * 2 - 1) * bound)
            head.bias.zero_()
        opt = torch.optim.Adam(head.parameters(), lr=self.head_lr)
        for _ in range(self.head_epochs):
            order = torch.randperm(len(y), generator=gen).to(y.device)
            for start in range(0, len(y), self.batch_size):
                idx = order[start : start + self.batch_size]
                opt.zero_grad()
                F.cross_entropy(head(feats[idx]), y[idx]).backward()
                opt.step()
        weight, bias = head.weight.detach(), head.bias.detach()
        return lambda idx: F.cross_entropy(F.linear(self.model.body(x[idx]), weight, bias), y[idx])

    def round_metrics(self) -> dict[str, float]:
        return dict(self.state["stats"])
