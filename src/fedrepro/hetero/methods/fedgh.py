"""FedGH (Yi et al., 2023) as HtFLlib runs it: clients train their whole model with CE, then upload one
prototype per class they hold (the mean body feature of their training samples, computed after training
in eval mode); the server trains a shared global head on the received (prototype, class) pairs with SGD
(``server_lr``, ``server_epochs`` epochs, batches of the clients' batch size, shuffled) and sends it to the
clients, whose heads it overwrites at the start of their next round; every client is evaluated with the
global head (HtFLlib's send_parameters writes it into all clients' models before evaluating them [code]).
The server head starts as client 0's initial head [code]. The FedL2G paper runs one server epoch per round
(Sec. 4.4); HtFLlib's server_lr is 0.01. Needs one head shape for the whole group (not HtM10).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np
import torch
import torch.nn.functional as F
from torch.func import functional_call

from fedrepro import seeding
from fedrepro.hetero.base import ClientRound, HeteroMethod, class_means, copy_head_in
from fedrepro.hetero.engine import SERVER_TRAIN
from fedrepro.plugins import Positive, PositiveInt
from fedrepro.sim.tensors import in_inference_batches

if TYPE_CHECKING:
    from fedrepro.hetero.engine import HeteroRun


@torch.no_grad()
def client_prototypes(client: ClientRound, x_all: torch.Tensor, y_all: torch.Tensor,
                      num_classes: int) -> dict[str, torch.Tensor]:
    """Per-class mean body features of the client's training samples (eval mode): the classes it holds as
    int32 ids, their prototypes [k, K] and sample counts [k]."""
    model = client.model
    model.eval()
    idx = client.train_idx  # batches of indices: only one batch of the client's images gathered at a time
    feats = in_inference_batches(lambda batch: model.body(x_all[batch]), idx)
    sums, counts = class_means(feats, y_all[idx], num_classes)
    model.train()
    present = counts > 0
    return {"classes": present.nonzero().squeeze(1).to(torch.int32),
            "protos": sums[present] / counts[present].unsqueeze(1), "counts": counts[present].to(torch.int32)}


class FedGH(HeteroMethod):
    name = "fedgh"
    homogeneous_heads = True

    def __init__(self, server_lr: Positive = 0.01, server_epochs: PositiveInt = 1) -> None:
        super().__init__()
        self.server_lr, self.server_epochs = server_lr, server_epochs

    def setup(self, run: HeteroRun) -> None:
        super().setup(run)
        self.state = {"head": {k: v.clone().to(self.device) for k, v in run.client_params(0, "head.").items()}}
        self._head_module = run.modules[run.arch_of[0]].head  # computing module only: parameters passed in

    def broadcast(self, cid: int, rnd: int) -> dict[str, Any]:
        return {"head": self.state["head"]}

    def receive(self, client: ClientRound, payload: dict[str, Any]) -> None:
        copy_head_in(client.model, payload["head"])

    def prepare_evaluation(self, client: ClientRound) -> None:
        copy_head_in(client.model, self.state["head"])

    def upload(self, client: ClientRound) -> dict[str, Any]:
        protos = client_prototypes(client, self.run.data.x_train, self.run.data.y_train, self.num_classes)
        return {"classes": protos["classes"], "protos": protos["protos"]}

    def server_begin(self, rnd: int, sampled: np.ndarray) -> None:
        self._protos: list[torch.Tensor] = []
        self._labels: list[torch.Tensor] = []

    def server_receive(self, cid: int, upload: dict[str, Any], num_train: int) -> None:
        self._protos.append(upload["protos"])
        self._labels.append(upload["classes"].long())

    def server_end(self, rnd: int) -> None:
        protos, labels = torch.cat(self._protos), torch.cat(self._labels)
        head = {k: v.clone() for k, v in self.state["head"].items()}
        gen = torch.Generator().manual_seed(seeding.derive_seed(self.run.seed, SERVER_TRAIN, rnd))
        bs = self.run.cfg.batch_size
        with torch.enable_grad():
            for _ in range(self.server_epochs):
                order = torch.randperm(len(labels), generator=gen).to(labels.device)
                for start in range(0, len(order), bs):
                    b = order[start : start + bs]
                    params = {k: v.requires_grad_() for k, v in head.items()}
                    loss = F.cross_entropy(functional_call(self._head_module, params, (protos[b],)), labels[b])
                    grads = torch.autograd.grad(loss, list(params.values()))
                    head = {k: (v - self.server_lr * g).detach() for (k, v), g in zip(params.items(), grads,
                                                                                     strict=True)}
        self.state["head"] = head
