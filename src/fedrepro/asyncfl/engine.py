"""The asynchronous round loop (Feddle's setting): clients report after a delay, the server merges when its
method says.

Each round: (1) sample ``clients_per_round`` clients among those with no update in flight (a client is not
re-sampled while its update is in flight) and send them the current global model; each gets a delay of
round(|x|) rounds, x ~ N(0, delay_sigma^2) (half-normal, as FedBuff's simulation); (2) every update whose delay
ends this round arrives: the client trains from the model it was sent (possibly many rounds old) with the sync
engine's local SGD (sim/sync.py ``FederatedRun.train_client``) and reports Delta = w_local - w_start; (3) the
method (asyncfl/methods/) receives them one by one and ends the round. A delay of 0 arrives in the round it was
sent, so with every delay 0 the loop is synchronous FL. BatchNorm running statistics travel with the model
(sent, trained, reported and merged with the parameters' coefficients): asyncfl/base.py states the rule.

Server data: the in-domain set is ``server_samples`` test samples drawn per seed and removed from the test set
(for every method of the setting, so all are tested on the same samples); the out-of-domain set is another
data set's train split (other images, other labels). Each method says which one it trains on.

With ``true_update`` (Feddle's Fig. 2), each evaluation round also trains every client from the round's model
and takes the paper's true model update, Delta = sum_j |D_j| / |D| Delta_j over all J clients (Sec. 2), and
logs the cosine of each update sent and received in this round to it; every evaluation round's true update is
kept for the cosine between rounds (Fig. 2b, ``true_update_cosines``). A client's batches are those it would
draw if sent that round, so a sampled client's update is its own term of the sum. A diagnostic: the global
random state and the global BatchNorm statistics are untouched, so the run's metrics do not change.

Clients are trained when their update arrives, from a snapshot of the model of their dispatch round (one
snapshot per round, shared by that round's clients, dropped when the last of them arrives): the same result as
training at dispatch, with fewer vectors held. Every random draw is a pure function of (seed, purpose, round,
client) (fedrepro.seeding), so a run resumed from a checkpoint ends with the metrics of an uninterrupted one.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import get_args

import numpy as np
import torch
from torch import Tensor, nn

from fedrepro import defaults, seeding
from fedrepro.algorithms.base import Algorithm
from fedrepro.asyncfl.base import AsyncMethod, ServerData, Update
from fedrepro.sim.checkpoint import CheckpointError
from fedrepro.sim.loop import RoundLoop, RoundPlay, draw_clients
from fedrepro.sim.runs import RoundTrace, RunResult, all_finite, to_device
from fedrepro.sim.sync import FederatedRun, TrainingConfig, client_accuracy
from fedrepro.sim.tensors import DeviceData, evaluate

# purposes beyond fedrepro.seeding's (1..6) and the heterogeneous engine's (101..105)
SERVER_SPLIT, OOD_SUBSET = 201, 202
SERVER_DATA_KINDS = (None, *get_args(ServerData))
# the asynchronous engine's checkpoint layout, beside sim/checkpoint.py's FORMAT; 2: the global BatchNorm
# statistics and each dispatch round's are vectors (global_buffers, buffer_snapshots), methods' state holds
# clients' statistics
ASYNC_FORMAT = 2


_ASYNC = defaults.asynchrony()  # the study schema's (fedrepro.defaults)


@dataclass
class AsyncConfig:
    """The asynchronous settings of a run (a study's `async` block, workflow/schemas/study.schema.yaml)."""

    delay_sigma: float = _ASYNC["delay_sigma"]  # delays round(|x|), x ~ N(0, sigma^2) rounds
    server_samples: int = _ASYNC["server_samples"]  # in-domain server set carved from the test set
    ood_dataset: str | None = _ASYNC["ood_dataset"]  # the out-of-domain server data set (its train split)
    ood_samples: int | None = _ASYNC["ood_samples"]  # a seeded subset of it (None: all)
    measure_cost: bool = _ASYNC["measure_cost"]  # log the server's FLOPs and cache size (Table 6)
    true_update: bool = _ASYNC["true_update"]  # log the clients' cosine to the all-client mean update (Fig. 2)


def draw_delay(seed: int, rnd: int, cid: int, sigma: float) -> int:
    """The delay in rounds of client ``cid`` sent the model in round ``rnd``: round(|x|), x ~ N(0, sigma^2)."""
    if sigma == 0:
        return 0
    return int(round(abs(seeding.rng_for(seed, seeding.DELAYS, rnd, cid).normal(0.0, sigma))))


def carve_server_set(n_test: int, n_server: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """(server, test) positions in the test set: ``n_server`` drawn per seed, the rest stay the test set."""
    if not 0 < n_server < n_test:
        raise ValueError(f"async.server_samples = {n_server} must be between 1 and the test set's size - 1 "
                         f"({n_test - 1})")
    perm = seeding.rng_for(seed, SERVER_SPLIT).permutation(n_test)
    return np.sort(perm[:n_server]), np.sort(perm[n_server:])


@dataclass
class InFlight:
    """A client's update on its way: sent the model of ``dispatch_round``, arriving in ``arrival``."""

    arrival: int
    dispatch_round: int
    cid: int


class AsyncRun(RoundLoop):
    """One seed of one asynchronous method on one setting."""

    def __init__(
        self,
        model: nn.Module,
        method: AsyncMethod,
        data: DeviceData,
        client_indices: list[np.ndarray],
        training: TrainingConfig,
        asynchrony: AsyncConfig,
        seed: int,
        ood: DeviceData | None = None,
        log: Callable[[str], None] = print,
    ) -> None:
        if method.server_data not in SERVER_DATA_KINDS:
            raise ValueError(f"{method.name}: server_data {method.server_data!r} is not one of {SERVER_DATA_KINDS}")
        self.method, self.cfg, self.asyn, self.seed, self.log = method, training, asynchrony, seed, log
        server_pos, test_pos = carve_server_set(len(data.y_test), asynchrony.server_samples, seed)
        dev = data.x_test.device
        server_pos, test_pos = torch.as_tensor(server_pos, device=dev), torch.as_tensor(test_pos, device=dev)
        self.data = dataclasses.replace(data, x_test=data.x_test[test_pos], y_test=data.y_test[test_pos])
        # local SGD is the sync engine's (FedAvg's hooks: cross-entropy, upload Delta)
        self.clients = FederatedRun(model, Algorithm(), self.data, client_indices, training, {"kind": "size"},
                                    seed, log, engine="sequential")
        self.flat, self.model, self.w_init = self.clients.flat, model, self.clients.w_init
        # the global model's BatchNorm statistics (None without any), as seeded at construction like w_init
        b_init = self.flat.buffers()
        self.b_init = b_init if b_init.numel() else None
        self.global_buffers = self.b_init
        self.measuring = False  # count the server hooks' FLOPs this round (measure_cost, evaluation rounds)
        self.num_clients = len(client_indices)
        self.true_updates: dict[int, Tensor] = {}  # evaluation round -> true update (true_update, on the CPU)
        self.clients_per_round = max(1, int(round(training.join_ratio * self.num_clients)))
        self.server_x = self.server_y = None
        self.server_classes = data.num_classes
        # the in-domain set, whatever the method trains on: diagnostics compare against it (Feddle's Fig. 7)
        self.id_x, self.id_y = data.x_test[server_pos], data.y_test[server_pos]
        if method.server_data == "in_domain":
            self.server_x, self.server_y = self.id_x, self.id_y
        elif method.server_data == "out_of_domain":
            if ood is None:
                raise ValueError(f"{method.name} trains on out-of-domain server data, but the setting names none: "
                                 "set async.ood_dataset")
            x, y = ood.x_train, ood.y_train
            if asynchrony.ood_samples is not None and asynchrony.ood_samples < len(y):
                keep = seeding.rng_for(seed, OOD_SUBSET).permutation(len(y))[: asynchrony.ood_samples]
                keep_t = torch.as_tensor(np.sort(keep), device=y.device)
                x, y = x[keep_t], y[keep_t]
            self.server_x, self.server_y, self.server_classes = x, y, ood.num_classes
        method.setup(self)

    # ----- clients
    def sample_clients(self, rnd: int, busy: set[int]) -> list[int]:
        """``clients_per_round`` clients drawn uniformly among those with no update in flight."""
        free = np.array([c for c in range(self.num_clients) if c not in busy], dtype=np.int64)
        return draw_clients(self.seed, rnd, free, self.clients_per_round).tolist()

    def train_from(self, cid: int, batch_round: int, w_start: Tensor,
                   b_start: Tensor | None) -> tuple[Tensor, Tensor | None, Tensor, int]:
        """(Delta, buffers after, summed loss, samples seen): ``cid`` trained in train mode from the model
        (w_start, b_start) with the batches of ``batch_round``."""
        if b_start is not None:
            self.flat.load_buffers(b_start)
        self.model.train()
        upload, loss_sum, seen = self.clients.train_client(cid, batch_round, w_start)
        return upload["delta"], (self.flat.buffers() if b_start is not None else None), loss_sum, seen

    def client_update(self, cid: int, dispatch_round: int, w_start: Tensor, rnd: int,
                      b_start: Tensor | None = None) -> tuple[Update, Tensor, int]:
        """Local training of ``cid`` from (``w_start``, ``b_start``) (its batches seeded by its dispatch round)."""
        delta, buffers, loss_sum, seen = self.train_from(cid, dispatch_round, w_start, b_start)
        update = Update(cid=cid, delta=delta, w_start=w_start, dispatch_round=dispatch_round,
                        staleness=rnd - dispatch_round, num_samples=len(self.clients.clients[cid]), buffers=buffers)
        return update, loss_sum, seen

    # ----- the true update (Fig. 2)
    def true_update(self, w: Tensor, rnd: int) -> Tensor:
        """sum_j |D_j| / |D| Delta_j: every client trained from ``w`` and the global BatchNorm statistics with
        the batches of round ``rnd``; the global random state is restored afterwards (the global statistics
        are never written: each client trains on the model's copy of them)."""
        devices = [w.device] if w.device.type == "cuda" else []
        total = sum(len(idx) for idx in self.clients.clients)
        true = torch.zeros_like(w)
        with torch.random.fork_rng(devices=devices):
            for cid, idx in enumerate(self.clients.clients):  # summed as they come: 500 deltas would not fit
                true.add_(self.train_from(cid, rnd, w, self.global_buffers)[0], alpha=len(idx) / total)
        return true

    def true_update_cosines(self) -> tuple[np.ndarray, np.ndarray]:
        """(rounds, the cosine matrix of their true updates): Fig. 2b."""
        rounds = sorted(self.true_updates)
        if not rounds:
            return np.zeros(0, dtype=np.int64), np.zeros((0, 0))
        stacked = torch.stack([self.true_updates[r] for r in rounds]).double()
        unit = stacked / stacked.norm(dim=1, keepdim=True).clamp_min(1e-30)
        return np.asarray(rounds, dtype=np.int64), (unit @ unit.T).numpy()

    # ----- server cost (Table 6)
    def server_call(self, hook: Callable[..., Tensor | None], *args: object) -> Tensor | None:
        """Run a server hook; with ``measure_cost``, count its FLOPs (torch.utils.flop_counter: matrix
        products and convolutions, forward and backward; element-wise vector arithmetic such as FedAvg's
        weighted sum is not counted by it). Counted in the evaluation rounds only (``measuring``): the counter
        sends every operation through Python (it doubled Feddle's run time), and the per-round mean over
        every ``eval_every``-th round is the same quantity, sampled."""
        if not self.measuring:
            return hook(*args)
        from torch.utils.flop_counter import FlopCounterMode  # imports triton (0.4 s): only where it counts

        counter = FlopCounterMode(display=False)
        with counter:
            out = hook(*args)
        self.server_flops += counter.get_total_flops()
        return out

    def cache_mb(self, w: Tensor) -> float:
        """What the server holds between rounds, in MB (10^6 bytes): the whole global model (the trained vector
        ``w``, frozen parameters such as ViT's backbone under LoRA, buffers) and every tensor of the method's
        state (FedBuff's buffer, CA2FL's per-client cache, Feddle's atlas)."""
        fixed = [p for p in self.model.parameters() if not p.requires_grad] + list(self.model.buffers())
        return (_tensor_bytes([w, *fixed]) + _tensor_bytes(self.method.state)) / 1e6

    def load_global(self, w: Tensor) -> None:
        """The global model (``w`` and the global BatchNorm statistics) into the run's model."""
        self.flat.load(w)
        if self.global_buffers is not None:
            self.flat.load_buffers(self.global_buffers)

    # ----- the round, as the shared loop (sim/loop.py) asks for it
    def new_result(self) -> RunResult:
        self.w = self.w_init.clone()
        self.global_buffers = None if self.b_init is None else self.b_init.clone()
        self.inflight: list[InFlight] = []
        self.snapshots: dict[int, Tensor] = {}  # dispatch round -> the model sent (parameters)
        self.buffer_snapshots: dict[int, Tensor] = {}  # dispatch round -> its BatchNorm statistics (models with any)
        self.server_flops, self.measured = 0, 0
        return RunResult()

    def engine_state(self) -> dict:
        """The global model, the updates in flight and the models they were sent, the method's state. The method's
        ``host_state`` (CA2FL's cache) is on the CPU already: saved as it is, not copied (at paper scale a copy would
        double tens of GB of host memory)."""
        return dict(async_format=ASYNC_FORMAT, w=self.w.cpu(), state=to_device(self.method.state, "cpu"),
                    global_buffers=to_device(self.global_buffers, "cpu"),
                    inflight=[dataclasses.astuple(f) for f in self.inflight],
                    snapshots={r: v.cpu() for r, v in self.snapshots.items()},
                    buffer_snapshots={r: v.cpu() for r, v in self.buffer_snapshots.items()},
                    true_updates=self.true_updates, server_flops=self.server_flops, measured_rounds=self.measured)

    def restore(self, resumed: dict, checkpoint: Path) -> None:
        if resumed.get("async_format") != ASYNC_FORMAT:
            raise CheckpointError(
                f"checkpoint {checkpoint} was written by an older asynchronous engine (layout "
                f"{resumed.get('async_format', 1)}, this one reads {ASYNC_FORMAT}: BatchNorm statistics now "
                "travel with client updates); delete it to start this run from scratch")
        dev = self.w.device
        self.w = resumed["w"].to(dev)
        self.method.load_state(resumed["state"], dev)
        self.global_buffers = to_device(resumed["global_buffers"], dev)
        self.inflight = [InFlight(*entry) for entry in resumed["inflight"]]
        self.snapshots = {int(r): v.to(dev) for r, v in resumed["snapshots"].items()}
        self.buffer_snapshots = {int(r): v.to(dev) for r, v in resumed["buffer_snapshots"].items()}
        self.true_updates = {int(r): v for r, v in resumed.get("true_updates", {}).items()}
        self.server_flops = resumed.get("server_flops", 0)
        self.measured = resumed.get("measured_rounds", 0)

    def before_round(self, rnd: int) -> None:
        # the diagnostic trains outside the round's seconds: it is not the method's work
        self.evaluating = rnd % self.cfg.eval_every == 0 or rnd == self.cfg.rounds
        self.true = self.true_update(self.w, rnd) if self.asyn.true_update and self.evaluating else None

    def play_round(self, rnd: int) -> RoundPlay:
        method, totals, w = self.method, self.totals, self.w
        # what a client receives and sends back: the parameters and the BatchNorm statistics
        model_bytes = w.numel() * w.element_size() + _tensor_bytes(self.global_buffers)
        self.true_cos: list[float] = []
        self.measuring = self.asyn.measure_cost and self.evaluating
        self.measured += self.measuring
        if method.uses_clients:
            sent = self.sample_clients(rnd, {f.cid for f in self.inflight})
            if sent:
                self.snapshots[rnd] = w.clone()
                if self.global_buffers is not None:
                    self.buffer_snapshots[rnd] = self.global_buffers.clone()
                totals.bytes_down += model_bytes * len(sent)
            for cid in sent:
                self.inflight.append(InFlight(rnd + draw_delay(self.seed, rnd, cid, self.asyn.delay_sigma), rnd, cid))
        self.arriving = sorted((f for f in self.inflight if f.arrival == rnd), key=lambda f: (f.dispatch_round, f.cid))
        self.inflight = [f for f in self.inflight if f.arrival != rnd]
        self.server_call(method.server_begin, w, rnd)
        loss_sum = torch.zeros((), device=w.device)
        seen = 0
        trace = RoundTrace()
        for f in self.arriving:
            update, client_loss, client_seen = self.client_update(
                f.cid, f.dispatch_round, self.snapshots[f.dispatch_round], rnd,
                self.buffer_snapshots.get(f.dispatch_round))
            trace.note(f"client {f.cid}'s training loss (sent in round {f.dispatch_round})", client_loss)
            trace.note(f"client {f.cid}'s update", update.delta)
            totals.bytes_up += _tensor_bytes([update.delta, update.buffers])
            loss_sum += client_loss
            seen += client_seen
            if self.true is not None and update.staleness == 0:  # trained from this round's model, as the truth
                self.true_cos.append(torch.nn.functional.cosine_similarity(update.delta, self.true, dim=0).item())
            with torch.no_grad():
                w = self.server_call(method.server_receive, w, update)
        still_needed = {f.dispatch_round for f in self.inflight}
        self.snapshots = {r: v for r, v in self.snapshots.items() if r in still_needed}
        self.buffer_snapshots = {r: v for r, v in self.buffer_snapshots.items() if r in still_needed}
        self.w = self.server_call(method.server_end, w, rnd).detach()
        if self.true is not None:
            self.true_updates[rnd] = self.true.cpu()
        return RoundPlay(loss_sum.item() / seen if seen else None, bad=not all_finite(self.w), trace=trace)

    def note_divergence(self, trace: RoundTrace) -> None:
        trace.note("the global model", self.w)
        trace.note("the method's state", self.method.state)

    def evaluate_round(self, rnd: int, play: RoundPlay, result: RunResult) -> float:
        self.load_global(self.w)
        acc, test_loss, result.per_class_acc = evaluate(
            self.model, self.data.x_test, self.data.y_test, self.data.num_classes)
        totals = self.totals
        result.history.append(dict(
            round=rnd, test_acc=acc, test_loss=test_loss,
            train_loss=math.nan if play.train_loss is None else play.train_loss, bytes_up=totals.bytes_up,
            bytes_down=totals.bytes_down, seconds=round(totals.seconds, 4),
            **client_accuracy(self.clients.class_counts, result.per_class_acc),
            in_flight=len(self.inflight), arrived=len(self.arriving), **self.method.round_metrics(),
            **({"server_gflops": self.server_flops / 1e9 / max(self.measured, 1), "cache_mb": self.cache_mb(self.w)}
               if self.asyn.measure_cost else {}),
            **(_spread("true_cos", self.true_cos) if self.asyn.true_update else {})))
        self.log(f"round {rnd}/{self.cfg.rounds} acc {acc:.2f} loss {test_loss:.4f} arrived {len(self.arriving)} "
                 f"in flight {len(self.inflight)} {totals.seconds:.1f}s")
        return acc

    def finish(self, result: RunResult) -> None:
        self.load_global(self.w)
        if result.per_class_acc is None:  # resumed from a finished checkpoint
            result.per_class_acc = evaluate(self.model, self.data.x_test, self.data.y_test, self.data.num_classes)[2]


def _spread(name: str, values: list[float]) -> dict[str, float]:
    """{name}_mean, _min and _max of ``values`` (NaN when empty)."""
    if not values:
        return {f"{name}_{k}": math.nan for k in ("mean", "min", "max")}
    return {f"{name}_mean": float(np.mean(values)), f"{name}_min": min(values), f"{name}_max": max(values)}


def _tensor_bytes(obj: object) -> int:
    """Bytes of every tensor in a state tree (tensors in dicts and lists)."""
    if isinstance(obj, Tensor):
        return obj.numel() * obj.element_size()
    if isinstance(obj, dict):
        return sum(_tensor_bytes(v) for v in obj.values())
    if isinstance(obj, list | tuple):
        return sum(_tensor_bytes(v) for v in obj)
    return 0
