"""FedL2G (Zhang et al.): learning to guide local training with server-held guiding vectors.

The server holds G = {v^y}, y = 1..C, drawn N(0, 1) (the official code's nn.Embedding), in the logit space
(FedL2G-l, v in R^C) or the feature space before the head (FedL2G-f, v in R^K). Each client holds out its
first ``quiz_size`` training samples (default one batch; at most half its training set) as the quiz set and
never trains on them; the rest is its study set. In round t (Algorithm 1):
  1. the server sends G;
  2. if t > T' (warm-up), the client trains E epochs on the study set with CE(f(x), y) + MSE(z(x), v^y),
     z = logits (-l) or features (-f), clipping the gradient norm at 100 [code];
  3. a pseudo step on one random study batch B: theta' = theta - eta_c grad_theta [CE + MSE(z, G[y])];
  4. the feedback pi = grad_G CE(f(x_q; theta'(G)), y_q) on the quiz batch, in the first-order form of Eq. 9:
     pi^c = eta_c * 2 / (|B| M) * sum_{b in B, y_b = c} (J_z(x_b; theta) g_q)_b, g_q = grad CE at theta':
     one backward pass at theta' and one Jacobian-vector product at theta (torch.func.jvp). This is exact,
     not an approximation: MSE is quadratic in v, so d theta'/d v involves only J_z at theta, no Hessian;
  5. the client uploads the non-zero rows of pi (with their class ids);
  6./7. the server averages each class's received rows (zero for classes nobody sent), clips the whole
     gradient's norm at 100 [code] and steps G <- G - eta_s pi (eta_s = 0.1 for -l, 100 for -f).
During warm-up (t <= T', T' = 50 in the paper) step 2 is skipped: client models do not change, only G
learns (steps 1, 3-7). The pseudo step never changes the client's model (nor its BatchNorm statistics).
Models in train mode with dropout (GoogLeNet, MobileNetV2 in the HtFE groups): the study batch's forward
passes of steps 3 and 4 (the pseudo step's gradient and the JVP) replay one dropout mask, the one the exact
gradient through theta'(G) differentiates (the reference code's single pass in ``higher``); the quiz pass
draws its own, as there.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor
from torch.func import functional_call, grad, jvp
from torch.nn.attention import SDPBackend, sdpa_kernel

from fedrepro import seeding
from fedrepro.hetero.base import ClientRound, HeteroMethod
from fedrepro.hetero.engine import GUIDE, META, clip_grad_
from fedrepro.plugins import NonNegative, NonNegativeInt, Positive, PositiveInt
from fedrepro.sim.runs import all_finite

if TYPE_CHECKING:
    from fedrepro.hetero.engine import HeteroRun
    from fedrepro.models.cnn import SplitModel


def _sub(tensors: dict[str, Tensor], prefix: str) -> dict[str, Tensor]:
    return {k[len(prefix):]: v for k, v in tensors.items() if k.startswith(prefix)}


@contextmanager
def replayed_dropout(seed: int, device: torch.device) -> Iterator[None]:
    """Random draws (dropout masks) inside start from the generator state ``seed``, so two forward passes of
    the same shapes, each in its own ``replayed_dropout(seed)``, drop the same units; the global generator
    afterwards is as it was before (torch.random.fork_rng)."""
    with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
        torch.manual_seed(seed)
        yield


def _forward(model: SplitModel, params: dict[str, Tensor], buffers: dict[str, Tensor], x: Tensor):
    """(features, logits) of ``model`` at ``params``. Buffers are cloned here, inside the transform, so a
    train-mode BatchNorm updates copies, never the client's statistics."""
    bufs = {k: v.clone() for k, v in buffers.items()}
    feats = functional_call(model.body, {**_sub(params, "body."), **_sub(bufs, "body.")}, (x,))
    logits = functional_call(model.head, {**_sub(params, "head."), **_sub(bufs, "head.")}, (feats,))
    return feats, logits


def feedback_gradient(model: SplitModel, params: dict[str, Tensor], buffers: dict[str, Tensor], guide: Tensor,
                      xs: Tensor, ys: Tensor, xq: Tensor, yq: Tensor, lr: float, space: str,
                      mask_seed: int = 0) -> Tensor:
    """pi = d CE(f(x_q; theta'(G)), y_q) / d G, [C, M], by Eq. 9 (first order, no Hessian, no ``higher``).

    ``params``: the client's parameters theta by name (detached); (xs, ys): the study batch of the pseudo
    step; (xq, yq): the quiz batch; ``space``: "logit" (z = logits) or "feature" (z = body features);
    ``mask_seed``: the study batch's dropout mask, ``replayed_dropout(mask_seed)`` in both of its passes (the
    quiz pass draws from the global generator).
    """
    index = 0 if space == "feature" else 1

    def study_loss(p: dict[str, Tensor]) -> Tensor:
        with replayed_dropout(mask_seed, xs.device):
            out = _forward(model, p, buffers, xs)
        return F.cross_entropy(out[1], ys) + F.mse_loss(out[index], guide[ys])

    def quiz_loss(p: dict[str, Tensor]) -> Tensor:
        return F.cross_entropy(_forward(model, p, buffers, xq)[1], yq)

    g_s = grad(study_loss)(params)
    theta1 = {k: v - lr * g_s[k] for k, v in params.items()}
    g_q = grad(quiz_loss)(theta1)  # the one backward pass at theta'
    if space == "feature":  # z depends on the body only: the JVP needs only the body's tangent
        primal = _sub(params, "body.")
        tangent = _sub(g_q, "body.")
        bufs = _sub(buffers, "body.")

        def z_fn(p: dict[str, Tensor]) -> Tensor:
            with replayed_dropout(mask_seed, xs.device):
                return functional_call(model.body, {**p, **{k: v.clone() for k, v in bufs.items()}}, (xs,))
    else:
        primal, tangent = params, g_q

        def z_fn(p: dict[str, Tensor]) -> Tensor:
            with replayed_dropout(mask_seed, xs.device):
                return _forward(model, p, buffers, xs)[1]
    # jvp materialises a tangent of a view primal's whole base: on a client's parameters (views of one flat
    # vector, FlatModel) one vector-sized tangent per parameter tensor. Primal and tangent get their own storage
    # (one vector each), the tangent in the primal's strides, as jvp laid it out for the view: g_q's differ where
    # a dim is 1 (1x1 and depthwise convolutions), and convolution kernels, hence roundings, follow the strides
    primal = {k: v.clone() for k, v in primal.items()}
    tangent = {k: torch.empty_like(primal[k]).copy_(v) for k, v in tangent.items()}
    # the fused attention kernels (flash, memory-efficient) have no forward-mode derivative: the ViTs of the
    # HtM10 group go through the math kernel, the same attention written in differentiable ops
    with sdpa_kernel(SDPBackend.MATH):
        _, dz = jvp(z_fn, (primal,), (tangent,))  # J_z(x_b; theta) g_q for every study sample b: [B, M]
    pi = torch.zeros_like(guide)
    pi.index_add_(0, ys, dz)
    return pi * (2.0 * lr / dz.numel())


class FedL2GLogit(HeteroMethod):
    """FedL2G-l: guiding vectors in the logit space."""

    name = "fedl2g_l"
    space = "logit"
    clip_norm = 100.0  # [code] clip_grad_norm_(model.parameters(), 100) in local training

    def __init__(self, server_lr: Positive = 0.1, warmup_rounds: NonNegativeInt = 50,
                 quiz_size: PositiveInt | None = None, server_clip: NonNegative = 100.0) -> None:
        super().__init__()
        self.server_lr, self.warmup_rounds = server_lr, warmup_rounds
        self.quiz_size, self.server_clip = quiz_size, server_clip

    def setup(self, run: HeteroRun) -> None:
        super().setup(run)
        self.dim = self.num_classes if self.space == "logit" else self.feature_dim
        gen = torch.Generator().manual_seed(seeding.derive_seed(run.seed, GUIDE))
        self.state = {"guide": torch.randn(self.num_classes, self.dim, generator=gen).to(self.device)}
        self._round = 0

    def quiz_count(self, client: ClientRound) -> int:
        """Quiz-set size: one batch by default, at most half the client's training samples."""
        q = self.quiz_size or self.run.cfg.batch_size
        return max(1, min(q, client.num_train // 2))

    # ----- client
    def broadcast(self, cid: int, rnd: int) -> dict[str, Any]:
        return {"guide": self.state["guide"]}

    def receive(self, client: ClientRound, payload: dict[str, Any]) -> None:
        client.extras["guide"] = payload["guide"]

    def trains(self, rnd: int) -> bool:
        self._round = rnd
        return rnd > self.warmup_rounds

    def local_indices(self, client: ClientRound) -> Tensor:
        return client.train_idx[self.quiz_count(client):]  # the study set: never train on the quiz set

    def local_loss(self, client: ClientRound, x: Tensor, y: Tensor) -> tuple[Tensor, Tensor]:
        feats = client.model.body(x)
        logits = client.model.head(feats)
        ce = F.cross_entropy(logits, y)
        z = logits if self.space == "logit" else feats
        return ce + F.mse_loss(z, client.extras["guide"][y]), ce

    def upload(self, client: ClientRound) -> dict[str, Any]:
        run, q = self.run, self.quiz_count(client)
        quiz, study = client.train_idx[:q], client.train_idx[q:]
        gen = torch.Generator().manual_seed(seeding.derive_seed(run.seed, META, client.round, client.cid))
        batch = study[torch.randperm(len(study), generator=gen)[: run.cfg.batch_size].to(study.device)]
        params = {k: v.detach() for k, v in client.model.named_parameters()}
        buffers = {k: v.detach() for k, v in client.model.named_buffers()}
        x, y = run.data.x_train, run.data.y_train
        mask_seed = seeding.derive_seed(run.seed, META, client.round, client.cid, 1)
        pi = feedback_gradient(client.model, params, buffers, client.extras["guide"], x[batch], y[batch],
                               x[quiz], y[quiz], run.cfg.lr, self.space, mask_seed)
        # only the non-zero rows travel (classes of the study batch), as the reference code sends them; the
        # paper's Table 3 lists FedDistill's upload for FedL2G instead (deviation D-fedl2g-upload-mb)
        rows = pi.abs().sum(1) > 0
        return {"classes": rows.nonzero().squeeze(1).to(torch.int32), "rows": pi[rows]}

    # ----- server
    def server_begin(self, rnd: int, sampled: np.ndarray) -> None:
        self._sum = torch.zeros_like(self.state["guide"])
        self._count = torch.zeros(self.num_classes, device=self.device)

    def server_receive(self, cid: int, upload: dict[str, Any], num_train: int) -> None:
        cls = upload["classes"].long()
        self._sum.index_add_(0, cls, upload["rows"])
        self._count.index_add_(0, cls, torch.ones(len(cls), device=self.device))

    def server_end(self, rnd: int) -> None:
        pi = self._sum / self._count.clamp_min(1.0).unsqueeze(1)  # per-class mean; zero where nobody sent
        clip_grad_(pi, self.server_clip)  # [code] clip_grad_norm_(guiding_vec.parameters(), 100)
        self.state["guide"] = self.state["guide"] - self.server_lr * pi

    def diverged(self) -> bool:
        return not all_finite(self.state["guide"])

    def anchors(self) -> tuple[str, Tensor]:
        return self.space, self.state["guide"]

    def round_metrics(self) -> dict[str, float]:
        return {"warmup": float(self._round <= self.warmup_rounds)}


class FedL2GFeature(FedL2GLogit):
    """FedL2G-f: guiding vectors in the feature space (before the head)."""

    name = "fedl2g_f"
    space = "feature"

    def __init__(self, server_lr: Positive = 100.0, warmup_rounds: NonNegativeInt = 50,
                 quiz_size: PositiveInt | None = None, server_clip: NonNegative = 100.0) -> None:
        super().__init__(server_lr, warmup_rounds, quiz_size, server_clip)
