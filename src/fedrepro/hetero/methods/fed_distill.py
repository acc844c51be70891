"""FedDistill (Jeong et al., 2018; "FD") as HtFLlib runs it: clients share per-class average logits.

Local objective: CE(f(x), y) + lamda * CE(f(x), softmax(t)), t = the global logit prototype of y where the
server has one (else the sample's own detached logits: a zero-gradient term). While training, each client
averages the logits it produces per class (train mode, every batch of every epoch, before each step) and
uploads them with their class ids. The server's global prototype of class c is the equal-weight mean of the
class-c prototypes of the clients that sent one (``aggregation="clients"``, the default: HtFLlib's
proto_aggregation, and the FedL2G study runs its baselines with HtFLlib's defaults) or their mean weighted by
the clients' class-c sample counts (``aggregation="samples"``, FedProto's Eq. 6; the clients then also upload
the counts, int32). It replaces the previous round's: a class nobody
sent this round has none. The server sends the global prototypes (rows and class ids) to the next round's
clients. ``FedProto`` (fedproto.py) is the same scheme in the feature space.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, ClassVar, Literal

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor

from fedrepro.hetero.base import ClientRound, HeteroMethod
from fedrepro.plugins import NonNegative
from fedrepro.sim.runs import all_finite

if TYPE_CHECKING:
    from fedrepro.hetero.engine import HeteroRun


class FedDistill(HeteroMethod):
    name = "fed_distill"
    space: ClassVar[str] = "logit"

    def __init__(self, lamda: NonNegative = 1.0, aggregation: Literal["samples", "clients"] = "clients") -> None:
        super().__init__()
        self.lamda, self.aggregation = lamda, aggregation

    def setup(self, run: HeteroRun) -> None:
        super().setup(run)
        self.dim = self.num_classes if self.space == "logit" else self.feature_dim
        self.state = {"global": None, "present": None}  # [C, M] prototypes, bool [C]: which classes have one

    def regulariser(self, z: Tensor, target: Tensor) -> Tensor:
        """The guiding term between outputs ``z`` and per-sample targets (global prototypes)."""
        return F.cross_entropy(z, target.softmax(dim=1))

    # ----- client
    def broadcast(self, cid: int, rnd: int) -> dict[str, Any]:
        if self.state["global"] is None:
            return {}
        present = self.state["present"]
        return {"classes": present.nonzero().squeeze(1).to(torch.int32), "rows": self.state["global"][present]}

    def receive(self, client: ClientRound, payload: dict[str, Any]) -> None:
        if payload:
            full = torch.zeros(self.num_classes, self.dim, device=self.device)
            mask = torch.zeros(self.num_classes, dtype=torch.bool, device=self.device)
            cls = payload["classes"].long()
            full[cls], mask[cls] = payload["rows"], True
            client.extras["target"] = (full, mask)
        client.extras["sums"] = torch.zeros(self.num_classes, self.dim, device=self.device)
        client.extras["counts"] = torch.zeros(self.num_classes, dtype=torch.long, device=self.device)

    def local_loss(self, client: ClientRound, x: Tensor, y: Tensor) -> tuple[Tensor, Tensor]:
        feats = client.model.body(x)
        logits = client.model.head(feats)
        ce = F.cross_entropy(logits, y)
        z = logits if self.space == "logit" else feats
        loss = ce
        if "target" in client.extras:
            full, mask = client.extras["target"]
            target = z.detach().clone()
            have = mask[y]
            target[have] = full[y[have]]
            loss = ce + self.lamda * self.regulariser(z, target)
        client.extras["sums"].index_add_(0, y, z.detach())
        client.extras["counts"] += torch.bincount(y, minlength=self.num_classes)
        return loss, ce

    def upload(self, client: ClientRound) -> dict[str, Any]:
        counts = client.extras["counts"]
        present = counts > 0
        up = {"classes": present.nonzero().squeeze(1).to(torch.int32),
              "rows": client.extras["sums"][present] / counts[present].unsqueeze(1)}
        if self.aggregation == "samples":
            up["counts"] = counts[present].to(torch.int32)
        return up

    # ----- server
    def server_begin(self, rnd: int, sampled: np.ndarray) -> None:
        self._sum = torch.zeros(self.num_classes, self.dim, device=self.device)
        self._weight = torch.zeros(self.num_classes, device=self.device)

    def server_receive(self, cid: int, upload: dict[str, Any], num_train: int) -> None:
        cls = upload["classes"].long()
        w = upload["counts"].float() if self.aggregation == "samples" else torch.ones(len(cls), device=self.device)
        self._sum.index_add_(0, cls, upload["rows"] * w.unsqueeze(1))
        self._weight.index_add_(0, cls, w)

    def server_end(self, rnd: int) -> None:
        present = self._weight > 0
        if not bool(present.any()):  # nobody trained (cannot happen with local epochs >= 1)
            return
        self.state["global"] = self._sum / self._weight.clamp_min(1e-12).unsqueeze(1)
        self.state["present"] = present

    def diverged(self) -> bool:
        return self.state["global"] is not None and not all_finite(self.state["global"])
