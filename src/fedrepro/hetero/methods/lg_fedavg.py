"""LG-FedAvg (Liang et al., 2020) as HtFLlib runs it for FedL2G: clients train their whole model with CE,
upload their classifier head, and the server averages the heads weighted by the clients' training-set
sizes; bodies are never shared. The averaged head overwrites the head of every client the server next
samples, and every client is evaluated with it: HtFLlib's send_parameters writes the global head into all
clients' models and only then evaluates them, so a client's locally trained head is never what is scored
(not even under full participation: the average differs from each client's own). The server head starts as
client 0's initial head, so round 1's clients train from it as well [code]. Needs one head shape for the whole
group (not HtM10).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from fedrepro.hetero.base import ClientRound, HeteroMethod, copy_head_in, head_of

if TYPE_CHECKING:
    from fedrepro.hetero.engine import HeteroRun


class LGFedAvg(HeteroMethod):
    name = "lg_fedavg"
    homogeneous_heads = True

    def setup(self, run: HeteroRun) -> None:
        super().setup(run)
        self.state = {"head": {k: v.clone().to(self.device) for k, v in run.client_params(0, "head.").items()}}

    def broadcast(self, cid: int, rnd: int) -> dict[str, Any]:
        return {"head": self.state["head"]}

    def receive(self, client: ClientRound, payload: dict[str, Any]) -> None:
        copy_head_in(client.model, payload["head"])

    def prepare_evaluation(self, client: ClientRound) -> None:
        copy_head_in(client.model, self.state["head"])

    def upload(self, client: ClientRound) -> dict[str, Any]:
        return {"head": head_of(client.model)}

    def server_begin(self, rnd: int, sampled: np.ndarray) -> None:
        self._sum: dict[str, torch.Tensor] | None = None
        self._total = 0

    def server_receive(self, cid: int, upload: dict[str, Any], num_train: int) -> None:
        head = upload["head"]
        if self._sum is None:
            self._sum = {k: torch.zeros_like(v) for k, v in head.items()}
        for k, v in head.items():
            self._sum[k].add_(v, alpha=float(num_train))
        self._total += num_train

    def server_end(self, rnd: int) -> None:
        self.state["head"] = {k: v / self._total for k, v in self._sum.items()}
