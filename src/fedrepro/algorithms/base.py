"""The hooks of a federated method. The base class *is* FedAvg; a method overrides only what it changes.

Client side: ``local_loss`` (the objective on one batch), ``correct_grad`` (gradient terms that need no
autograd: proximal pulls, control variates, drift), ``upload`` (what the client sends).
Server side: ``server_begin`` / ``server_receive`` / ``server_end`` stream the sampled clients' uploads
into the next global vector, so a round holds O(params) memory however many clients it samples.
Everything that must survive a checkpoint lives in ``self.state`` (tensors or dicts of tensors keyed
by client id); ``state_bytes_per_client`` declares how much of it grows with the number of clients.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar, Literal

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from torch.func import functional_call

from fedrepro.sim.flat import FlatModel

if TYPE_CHECKING:  # the engine imports this module, so only for annotations
    from fedrepro.sim.sync import TrainingConfig


@dataclass
class Client:
    """What a hook knows about the client it runs for."""

    cid: int
    round: int
    w_start: torch.Tensor  # the global vector this client started from (read-only)
    num_samples: int
    steps: int = 0  # local SGD steps taken so far
    samples: torch.Tensor | None = None  # its sample indices into the training data (sequential engine)
    batch: torch.Tensor | None = None  # the current batch's, a subset of them (set by the engine before each step)


# what FedDyn and FedDC report (their hyper-parameter `evaluate`): the server model the clients train from (their
# papers), or the aggregate of the client models before the server adds its correction (h / alpha, the drifts;
# what the official FedDyn / FedDC / FedDisco code reports)
EvaluatedModel = Literal["server", "client_mean"]


def clip_grad_norm_(g: torch.Tensor, max_norm: float) -> None:
    """Scale the gradient vector ``g`` in place to norm at most ``max_norm`` (0: off), as
    ``torch.nn.utils.clip_grad_norm_`` does over all of a model's parameters; lanes side by side ([m, P]) each
    to its own norm."""
    if max_norm:
        norm = g.norm(dim=-1, keepdim=True) if g.dim() > 1 else g.norm()
        g.mul_(torch.clamp(max_norm / (norm + 1e-6), max=1.0))


def lane_stack(per_client: dict[int, torch.Tensor], clients: list[Client], like: torch.Tensor) -> torch.Tensor:
    """[m, P]: each client's entry of ``per_client`` (a method's state keyed by client id), zeros where it has none."""
    return torch.stack([per_client.get(c.cid, torch.zeros_like(like)) for c in clients])


def masked_mean(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Mean of ``values`` over the entries where ``mask`` is 1 (0 if none)."""
    return (values * mask).sum() / mask.sum().clamp_min(1.0)


class Algorithm:
    """FedAvg (McMahan et al., 2017): local SGD, weighted average of the client models."""

    name: ClassVar[str] = "fedavg"

    def __init__(self) -> None:
        self.state: dict = {}

    def setup(self, flat: FlatModel, num_clients: int, training: TrainingConfig) -> None:
        """Called once before round 1 (and before a checkpoint's state is loaded)."""
        self.flat, self.num_clients, self.training = flat, num_clients, training
        self.num_params, self.device = flat.numel, flat.w.device

    # ----- client side
    def local_loss(self, model: nn.Module, x: torch.Tensor, y: torch.Tensor, client: Client) -> torch.Tensor:
        return F.cross_entropy(model(x), y)

    def functional_loss(self, model: nn.Module, params: dict[str, torch.Tensor], x: torch.Tensor, y: torch.Tensor,
                        mask: torch.Tensor, extras: dict[str, torch.Tensor]) -> torch.Tensor:
        """``local_loss`` as a pure function of ``params``, for clients trained side by side
        (sim/vectorized.py): the mean over the batch's real samples (``mask`` 1; 0 for padding).
        ``extras`` are this client's ``loss_extras``. A method that overrides ``local_loss`` overrides
        this too, or it is trained one client at a time."""
        per_sample = F.cross_entropy(functional_call(model, params, (x,)), y, reduction="none")
        return masked_mean(per_sample, mask)

    def loss_extras(self, client: Client) -> dict[str, torch.Tensor]:
        """Per-client flat vectors ``functional_loss`` needs (e.g. MOON's previous local model)."""
        return {}

    @classmethod
    def vectorizable(cls) -> bool:
        """Whether its local objective exists as a pure function (``functional_loss``)."""
        return cls.local_loss is Algorithm.local_loss or cls.functional_loss is not Algorithm.functional_loss

    def correct_grad(self, w: torch.Tensor, g: torch.Tensor, client: Client) -> None:
        """Add gradient terms to ``g`` in place (before weight decay and momentum)."""

    def batched_correction(self, clients: list[Client], w_global: torch.Tensor
                           ) -> Callable[[torch.Tensor, torch.Tensor, int], None] | None:
        """``correct_grad`` for clients trained side by side from ``w_global`` (sim/vectorized.py), in one pass
        over every lane: a function (w [m, P], g [m, P], step t) adding each lane's terms in place, or None
        (the default, and for methods without corrections: the engine calls ``correct_grad`` lane by lane). Only
        lanes still stepping matter; it may change a finished lane's gradient, which moves nothing."""
        return None

    def upload(self, client: Client, w_end: torch.Tensor) -> dict[str, torch.Tensor]:
        return {"delta": w_end - client.w_start}

    def download(self, cid: int) -> dict[str, torch.Tensor]:
        """State a client receives besides the global model (counted in bytes down)."""
        return {}

    # ----- server side
    def server_begin(self, w_global: torch.Tensor, sampled: np.ndarray, weights: np.ndarray) -> None:
        self._sum = torch.zeros_like(w_global)

    def server_receive(self, cid: int, upload: dict[str, torch.Tensor], weight: float) -> None:
        self._sum.add_(upload["delta"], alpha=float(weight))

    def server_end(self, w_global: torch.Tensor) -> torch.Tensor:
        return w_global + self._sum

    def state_bytes_per_client(self, num_params: int) -> int:
        """Bytes of state kept for every client that has trained (for a model of ``num_params`` parameters):
        the part of the run's memory and checkpoints that grows with the number of clients."""
        return 0

    def evaluated_model(self, w_global: torch.Tensor) -> torch.Tensor:
        """The vector the engine tests after a round: the global model the clients train from, unless a
        method reports another (FedDyn's and FedDC's ``evaluate: client_mean``)."""
        return w_global

    def round_metrics(self) -> dict[str, float]:
        """Extra columns for this round's evaluation row in metrics.csv (e.g. FedGTST's Jacobian norms)."""
        return {}
