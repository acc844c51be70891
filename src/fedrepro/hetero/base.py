"""The hooks of a heterogeneous-model federated method. The base class *is* local training (HtFLlib's "Local"):
every client trains its own model on its own data and nothing is shared; a method overrides what it changes.

A round, per sampled client (hetero/engine.py): ``broadcast`` (server -> client, counted in bytes down),
``receive`` (the client installs it), local SGD over ``local_indices`` with ``local_loss`` on the
``trainables`` (skipped where ``trains`` says so, e.g. FedL2G's warm-up), ``upload`` (client -> server,
counted in bytes up), ``server_receive``; then ``server_end`` once. ``predict`` turns features and logits into
class predictions for evaluation (FedProto classifies by nearest prototype); ``prepare_evaluation`` installs
what the server sends every client before it is evaluated (LG-FedAvg's and FedGH's global head).
Everything that must survive a checkpoint lives in ``self.state`` (tensors, dicts and lists of tensors);
modules a method builds in ``setup`` are scratch space reloaded from ``self.state`` when used.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor

from fedrepro.sim.flat import FlatModel

if TYPE_CHECKING:  # the engine imports this module, so only for annotations
    from fedrepro.hetero.engine import HeteroRun
    from fedrepro.models.cnn import SplitModel


@dataclass
class ClientRound:
    """One client's turn in one round: what the client-side hooks see."""

    cid: int
    round: int
    arch: str
    model: SplitModel  # the architecture's shared module, loaded with this client's parameters and buffers
    flat: FlatModel  # the flat binding of ``model``'s parameters
    train_idx: Tensor  # this client's training samples: indices into run.data.x_train
    steps: int = 0  # local SGD steps taken so far
    extras: dict[str, Any] = field(default_factory=dict)  # a method's per-round scratch (targets, statistics)

    @property
    def num_train(self) -> int:
        return len(self.train_idx)


def class_means(values: Tensor, labels: Tensor, num_classes: int) -> tuple[Tensor, Tensor]:
    """(per-class sums [C, D], per-class counts [C]) of the rows of ``values``."""
    sums = torch.zeros(num_classes, values.shape[1], device=values.device, dtype=values.dtype)
    sums.index_add_(0, labels, values)
    counts = torch.bincount(labels, minlength=num_classes)
    return sums, counts


class HeteroMethod:
    """Local training: each client minimises its own cross-entropy; nothing is uploaded or averaged."""

    name: ClassVar[str] = "local"
    homogeneous_heads: ClassVar[bool] = False  # True: every architecture's head must have the same shapes
    clip_norm: ClassVar[float | None] = None  # per-trainable gradient-norm clipping of local steps (None: off)

    def __init__(self) -> None:
        self.state: dict[str, Any] = {}

    def setup(self, run: HeteroRun) -> None:
        """Called once before round 1 (and before a checkpoint's state is loaded)."""
        self.run = run
        self.num_classes = run.num_classes
        self.feature_dim = run.feature_dim
        self.device = run.device
        if self.homogeneous_heads:
            shapes = {arch: [tuple(p.shape) for p in m.head.parameters()] for arch, m in run.modules.items()}
            if len({str(s) for s in shapes.values()}) > 1:
                raise ValueError(f"{self.name} shares classifier heads, so it needs one head shape for every "
                                 f"architecture of the group; got {shapes}")

    # ----- server -> client
    def broadcast(self, cid: int, rnd: int) -> dict[str, Any]:
        """What the server sends client ``cid`` at the start of round ``rnd`` (counted in bytes down)."""
        return {}

    # ----- client
    def receive(self, client: ClientRound, payload: dict[str, Any]) -> None:
        """Install the broadcast on the client (e.g. overwrite its head, load the shared auxiliary model)."""

    def trains(self, rnd: int) -> bool:
        """Whether clients run local SGD this round (FedL2G: not during warm-up)."""
        return True

    def local_indices(self, client: ClientRound) -> Tensor:
        """The samples local SGD runs over (FedL2G: the study set, without the quiz set)."""
        return client.train_idx

    def trainables(self, client: ClientRound) -> list[FlatModel]:
        """The flat models one local SGD step updates (FML, FedKD: also the auxiliary model)."""
        return [client.flat]

    def local_loss(self, client: ClientRound, x: Tensor, y: Tensor) -> tuple[Tensor, Tensor]:
        """(objective to minimise, its plain cross-entropy part) on one batch; the second is logged as the
        clients' original local loss (FedL2G Fig. 3)."""
        ce = F.cross_entropy(client.model(x), y)
        return ce, ce

    def upload(self, client: ClientRound) -> dict[str, Any]:
        """What the client sends after local training (counted in bytes up)."""
        return {}

    # ----- server
    def server_begin(self, rnd: int, sampled: np.ndarray) -> None:
        """Start of round ``rnd`` on the server."""

    def server_receive(self, cid: int, upload: dict[str, Any], num_train: int) -> None:
        """One client's upload (streamed: the server never holds all uploads unless it must)."""

    def server_end(self, rnd: int) -> None:
        """Aggregate this round's uploads into the server state."""

    # ----- evaluation and logging
    def prepare_evaluation(self, client: ClientRound) -> None:
        """Change the loaded client's model into the one evaluated (the stored state is left as it is)."""

    def predict(self, client: ClientRound, features: Tensor, logits: Tensor) -> Tensor:
        """Class predictions of the client's model (default: the head's argmax)."""
        return logits.argmax(1)

    def anchors(self) -> tuple[str, Tensor] | None:
        """Server-held per-class vectors to plot beside the clients' representations (FedL2G Fig. 4): the
        space they live in ("feature" or "logit") and a C x D tensor; None for methods that hold none."""
        return None

    def diverged(self) -> bool:
        """Whether the server state has gone non-finite."""
        return False

    def round_metrics(self) -> dict[str, float]:
        """Extra columns for this round's evaluation row."""
        return {}


def copy_head_in(model: SplitModel, head: dict[str, Tensor]) -> None:
    """Overwrite ``model.head``'s parameters in place (they are views into the client's flat vector)."""
    with torch.no_grad():
        for name, p in model.head.named_parameters():
            p.copy_(head[name])


def head_of(model: SplitModel) -> dict[str, Tensor]:
    """A copy of ``model.head``'s parameters by name."""
    return {name: p.detach().clone() for name, p in model.head.named_parameters()}
