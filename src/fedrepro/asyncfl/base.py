"""The hooks of an asynchronous federated method. The base class *is* FedAvg in asynchronous mode: every
round, the updates that arrived are averaged (weighted by the clients' sample counts) and added to the
global model, however stale they are. A method overrides only what it changes.

A round (asyncfl/engine.py): ``server_begin``; for each update that arrives this round, in a fixed order,
``server_receive`` (which may change the global model at once: FedAsync, FedBuff when its buffer fills); then
``server_end`` (FedAvg's average, Feddle's coefficient search). ``server_data`` says which server-side data
set a method trains on (None, "in_domain" or "out_of_domain"); the engine hands it over in ``setup``.
Everything that must survive a checkpoint lives in ``self.state`` (tensors, numbers, lists and dicts of them);
what ``server_receive`` buffers within a round is cleared by ``server_end`` before any checkpoint. State that grows with
the number of clients is declared (``state_bytes_per_client``, to project memory to a paper's client count) and
kept in host memory, never on the run's device (``host_state``: CA2FL's cache).

BatchNorm running statistics (the model's floating-point buffers, sim/flat.py ``FlatModel.buffers``; None
everywhere for a model without any) are part of the global model, ``run.global_buffers``, and follow one rule:

- they travel with the model: a client starts from the buffers of the model it was sent, trains in train
  mode (its statistics move with its data) and reports its buffers after training (``Update.buffers``);
- they merge with the coefficients the method gives the parameters, in the form FedAvg of a state dict
  takes: a step w <- w + sum_i c_i Delta_i (or a mix w <- (1 - c) w + c w_i) gives
  b <- (1 - s) b + s sum_i p_i b_i with s = sum_i c_i and p_i = c_i / s (``merge_buffers``): FedAvg's mean
  of the arrived clients' buffers, FedAsync's mix, FedBuff's buffered mean at a flush, Feddle's searched
  coefficients (times its Eq. 5 normalisation factors, i.e. the coefficients of the raw updates). Running
  statistics must stay a mixture of statistics (a variance must not turn negative), so negative
  coefficients count as 0 and s is at most 1;
- server passes that do not train (Feddle's coefficient search and its OOD feature pass, FedDF's teachers)
  run in eval mode (sim/tensors.py ``eval_mode``): they normalise with the running statistics and never
  change them;
- server training (Center, Fed+FT, HFCL's server client) runs in train mode from the global buffers and
  keeps the statistics it ends with, as a client's training does; FedDF's distillation trains in train mode
  too but keeps the merged client statistics, its server images (possibly out-of-domain) being no client's.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar, Literal

import torch
import torch.nn.functional as F
from torch import Tensor

from fedrepro import seeding
from fedrepro.asyncfl.server_train import train_vector
from fedrepro.sim.runs import to_device

if TYPE_CHECKING:  # the engine imports this module, so only for annotations
    from fedrepro.asyncfl.engine import AsyncRun

HOST = torch.device("cpu")
# the server's own data a method may train on: a held-out part of the test set, or another data set's images
ServerData = Literal["in_domain", "out_of_domain"]  # where ``host_state`` lives, whatever the run's device


@dataclass(frozen=True)
class ServerPass:
    """``samples`` images a run's server puts through its model (over all rounds), in batches of ``batch`` (None:
    the device's inference batch, sim/tensors.py ``inference_batch``), forward only or forward and backward."""

    samples: float
    batch: int | None
    backward: bool


@dataclass(frozen=True)
class ServerWork:
    """What a run's server passes depend on (fedrepro.cost reads it off the run spec): its rounds, the size of the
    server data the method trains on (``server_data``'s set) and of the in-domain set, the clients sent a round,
    and the clients' local epochs and batch size."""

    rounds: int
    samples: int
    in_domain_samples: int
    clients_per_round: int
    local_epochs: int
    client_batch: int


@dataclass
class Update:
    """One client's report: Delta = w_local - w_start, where w_start is the model it was sent."""

    cid: int
    delta: Tensor
    w_start: Tensor  # read-only: shared by every client dispatched in the same round
    dispatch_round: int
    staleness: int  # rounds between dispatch and arrival (its delay)
    num_samples: int
    buffers: Tensor | None = None  # the client's BatchNorm statistics after training (None: the model has none)


class AsyncMethod:
    """FedAvg (asynchronous mode): each round, w += sum_i p_i Delta_i over the arrived updates, p_i ~ n_i."""

    name: ClassVar[str] = "fedavg"
    uses_clients: ClassVar[bool] = True  # False: no client is ever sampled (Center)
    # entries of ``state`` kept in host memory on any device: per-client vectors would not fit on a GPU
    host_state: ClassVar[tuple[str, ...]] = ()

    def __init__(self) -> None:
        self.state: dict[str, Any] = {}
        self.server_data: ServerData | None = None  # None: the method trains on no server data
        self._arrived: list[Update] = []

    def setup(self, run: AsyncRun) -> None:
        """Called once before round 1 (and before a checkpoint's state is loaded): ``run.server_x`` and
        ``run.server_y`` hold the server data this method asked for (None without)."""
        self.run = run
        self.flat, self.model = run.flat, run.model

    def server_passes(self, work: ServerWork) -> list[ServerPass]:
        """The passes over its own data that the server makes in a run of ``work`` (fedrepro.cost's estimate),
        counted in every round (a round where no update arrives skips them: a few at the start under long
        delays). FedAvg: none."""
        return []

    def state_bytes_per_client(self, num_params: int) -> int:
        """Bytes of state kept for every client that ever reports (for a model of ``num_params`` parameters):
        the part of the server's memory and checkpoints that grows with the number of clients."""
        return 0

    def load_state(self, state: dict[str, Any], device: torch.device | str) -> None:
        """Restore ``state`` (a checkpoint's, on the CPU) onto ``device``, the ``host_state`` entries in host
        memory, where torch.load put them: they are used as loaded, without a copy."""
        self.state = {k: to_device(v, HOST if k in self.host_state else device) for k, v in state.items()}

    # ----- server
    def server_begin(self, w: Tensor, rnd: int) -> None:
        """Start of round ``rnd``."""

    def server_receive(self, w: Tensor, update: Update) -> Tensor:
        """One arrived update; returns the global model (default: unchanged, the update is buffered)."""
        self._arrived.append(update)
        return w

    def server_end(self, w: Tensor, rnd: int) -> Tensor:
        """End of round ``rnd``: the next global model (default: the sample-weighted mean update)."""
        if not self._arrived:
            return w
        counts = [u.num_samples for u in self._arrived]
        w = w + weighted_mean([u.delta for u in self._arrived], counts)
        total = float(sum(counts))
        self.mix_buffers([n / total for n in counts], [u.buffers for u in self._arrived])
        self._arrived = []
        return w

    def round_metrics(self) -> dict[str, float]:
        """Extra columns for this round's evaluation row in metrics.csv (Feddle: coefficient statistics)."""
        return {}

    # ----- BatchNorm statistics (the rule in this module's docstring)
    def mix_buffers(self, coefficients: list[float] | Tensor, buffers: list[Tensor | None]) -> None:
        """run.global_buffers <- merge_buffers(them, coefficients, buffers); nothing for a model without buffers."""
        if buffers and buffers[0] is not None:
            self.run.global_buffers = merge_buffers(self.run.global_buffers, coefficients, buffers)

    def load_global_buffers(self) -> None:
        """Put the global buffers into the model (before a server pass: client training left its own there)."""
        if self.run.global_buffers is not None:
            self.flat.load_buffers(self.run.global_buffers)

    def keep_trained_buffers(self) -> None:
        """Make the model's buffers, as server training in train mode left them, the global ones."""
        if self.run.global_buffers is not None:
            self.run.global_buffers = self.flat.buffers()

    # ----- helpers for methods that train on the server data
    def server_generator(self, rnd: int, purpose: int = 0) -> torch.Generator:
        """A CPU generator for the server's batches in round ``rnd`` (a pure function of seed and round)."""
        return torch.Generator().manual_seed(seeding.derive_seed(self.run.seed, seeding.SERVER, rnd, purpose))

    def server_ce(self, idx: Tensor) -> Tensor:
        """Cross-entropy of the run's model on the server samples ``idx``."""
        return F.cross_entropy(self.model(self.run.server_x[idx]), self.run.server_y[idx])

    def train_on_server_data(self, w: Tensor, rnd: int) -> Tensor:
        """``w`` trained on the server's own data (Center, Fed+FT) with the method's lr, epochs, batch size and
        optimiser; like any training, in train mode from the global statistics, which it then updates."""
        self.load_global_buffers()
        self.model.train()
        w = train_vector(self.flat, w, self.server_ce, len(self.run.server_y), self.epochs, self.lr,
                         self.batch_size, self.server_generator(rnd), self.optimizer)
        self.keep_trained_buffers()
        return w


def merge_buffers(b_global: Tensor, coefficients: list[float] | Tensor, buffers: list[Tensor]) -> Tensor:
    """(1 - s) b_global + s sum_i p_i b_i, the buffers' counterpart of the parameter step w + sum_i c_i Delta_i:
    c_i clipped at 0, s = min(sum_i c_i, 1), p_i = c_i / sum_i c_i. b_global unchanged if no c_i is positive.
    Within those bounds (FedAvg, FedAsync, FedBuff with server lr <= 1) this is exactly the parameters' weighting;
    the clipping keeps the result a mixture of statistics (an extrapolated running variance can go negative)."""
    c = torch.as_tensor(coefficients, dtype=torch.float64).clamp_min(0.0)
    total = float(c.sum())
    if total <= 0.0:
        return b_global
    s = min(total, 1.0)
    out = b_global * (1.0 - s)
    for ci, b in zip(c.tolist(), buffers, strict=True):
        if ci > 0.0:
            out.add_(b, alpha=s * ci / total)
    return out


def weighted_mean(vectors: list[Tensor], weights: list[float]) -> Tensor:
    """sum_i (w_i / sum w) v_i."""
    total = float(sum(weights))
    out = torch.zeros_like(vectors[0])
    for v, wt in zip(vectors, weights, strict=True):
        out.add_(v, alpha=float(wt) / total)
    return out
