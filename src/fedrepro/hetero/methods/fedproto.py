"""FedProto (Tan et al., 2022) as HtFLlib runs it: clients share per-class average body features
(prototypes), FedDistill's scheme (fed_distill.py) in the feature space.

Local objective: CE(f(x), y) + lamda * MSE(t, h(x)), t = the global prototype of y where the server has one
(else the sample's own detached features: zero loss; the mean still runs over the whole batch, as HtFLlib's).
Server: the equal-weight mean of the clients' class prototypes (``aggregation="clients"``, the default:
HtFLlib's) or the class-count-weighted one (``"samples"``, FedProto's Eq. 6). Inference
(``inference="prototype"``, FedProto's and HtFLlib's): the class of the nearest global prototype (squared
distance; classes without one are never predicted); before the first global prototypes exist, the head's
argmax. ``inference="head"``: the head.
HtFLlib's FedL2G-era scripts run lamda = 10.
"""

from __future__ import annotations

from typing import Literal

import torch
import torch.nn.functional as F
from torch import Tensor

from fedrepro.hetero.base import ClientRound
from fedrepro.hetero.methods.fed_distill import FedDistill
from fedrepro.plugins import NonNegative


class FedProto(FedDistill):
    name = "fedproto"
    space = "feature"

    def __init__(self, lamda: NonNegative = 10.0, aggregation: Literal["samples", "clients"] = "clients",
                 inference: Literal["prototype", "head"] = "prototype") -> None:
        super().__init__(lamda, aggregation)
        self.inference = inference

    def regulariser(self, z: Tensor, target: Tensor) -> Tensor:
        return F.mse_loss(target, z)

    def predict(self, client: ClientRound, features: Tensor, logits: Tensor) -> Tensor:
        protos, present = self.state["global"], self.state["present"]
        if self.inference == "head" or protos is None:
            return logits.argmax(1)
        dist = torch.cdist(features, protos)
        dist[:, ~present] = torch.inf
        return dist.argmin(1)
