"""FML (Shen et al., 2020), Federated Mutual Learning, as HtFLlib runs it: every client trains its private
model and a copy of a shared auxiliary ("meme") model side by side on each batch,
  private: alpha CE(f, y) + (1 - alpha) KL(f || f_aux),  aux: beta CE(f_aux, y) + (1 - beta) KL(f_aux || f),
with KL(a || b) = KLDivLoss(log_softmax(a), softmax(b)) at PyTorch's default reduction (the mean over all
batch x class entries). HtFLlib back-propagates both losses without detaching either target, so both
models descend their sum; gradients are clipped at norm 10 per model [code]. The server averages the
uploaded auxiliary models with equal weights and sends the result to the next round's clients; private
models are never shared. The auxiliary model is the group's smallest architecture (HtFLlib: the group's
first, the same model in every paper group); its BatchNorm statistics, if any, stay the server's.
HtFLlib's FedL2G baselines use alpha = beta = 0.5.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor

from fedrepro.hetero.base import ClientRound, HeteroMethod
from fedrepro.hetero.engine import AUX
from fedrepro.plugins import Fraction
from fedrepro.sim.flat import FlatModel
from fedrepro.sim.runs import all_finite

if TYPE_CHECKING:
    from fedrepro.hetero.engine import HeteroRun


def kl(a: Tensor, b: Tensor) -> Tensor:
    """nn.KLDivLoss()(log_softmax(a), softmax(b)): HtFLlib's term at PyTorch's elementwise-mean reduction
    (written out: F.kl_div warns that "mean" will change meaning)."""
    log_q = F.log_softmax(b, dim=1)
    return (log_q.exp() * (log_q - F.log_softmax(a, dim=1))).mean()


class AuxModelMethod(HeteroMethod):
    """A method with a shared auxiliary model trained on the clients next to their private ones."""

    clip_norm = 10.0

    def setup(self, run: HeteroRun) -> None:
        super().setup(run)
        self.aux_arch = run.smallest_arch()
        self.aux = run.build_module(self.aux_arch, AUX)
        self.aux_flat = FlatModel(self.aux)
        self.state = {"aux": self.aux_flat.w.detach().clone()}

    def trainables(self, client: ClientRound) -> list[FlatModel]:
        return [client.flat, self.aux_flat]

    def server_begin(self, rnd: int, sampled: np.ndarray) -> None:
        self._sum = torch.zeros_like(self.state["aux"])
        self._n = 0

    def diverged(self) -> bool:
        return not all_finite(self.state["aux"])


class FML(AuxModelMethod):
    name = "fml"

    def __init__(self, alpha: Fraction = 0.5, beta: Fraction = 0.5) -> None:
        super().__init__()
        self.alpha, self.beta = alpha, beta

    def broadcast(self, cid: int, rnd: int) -> dict[str, Any]:
        return {"aux": self.state["aux"]}

    def receive(self, client: ClientRound, payload: dict[str, Any]) -> None:
        self.aux_flat.load(payload["aux"])
        self.aux.train()

    def local_loss(self, client: ClientRound, x: Tensor, y: Tensor) -> tuple[Tensor, Tensor]:
        out, out_g = client.model(x), self.aux(x)
        ce = F.cross_entropy(out, y)
        loss = self.alpha * ce + (1 - self.alpha) * kl(out, out_g)
        loss_g = self.beta * F.cross_entropy(out_g, y) + (1 - self.beta) * kl(out_g, out)
        return loss + loss_g, ce

    def upload(self, client: ClientRound) -> dict[str, Any]:
        return {"aux": self.aux_flat.w.detach().clone()}

    def server_receive(self, cid: int, upload: dict[str, Any], num_train: int) -> None:
        self._sum.add_(upload["aux"])
        self._n += 1

    def server_end(self, rnd: int) -> None:
        self.state["aux"] = self._sum / self._n
