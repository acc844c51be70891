"""The synchronous round loop shared by every method: sample, train locally, aggregate, evaluate."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch import nn

from fedrepro import defaults, seeding
from fedrepro.algorithms.base import Algorithm, Client
from fedrepro.algorithms.weighting import make_weighting
from fedrepro.sim.batches import epoch_batches
from fedrepro.sim.checkpoint import module_buffers, restore_buffers
from fedrepro.sim.engine_choice import SIDE_BY_SIDE, EngineChoice, initial_choice, measure
from fedrepro.sim.flat import FlatModel
from fedrepro.sim.loop import RoundConfig, RoundLoop, RoundPlay, draw_clients
from fedrepro.sim.runs import RoundTrace, RunResult, all_finite, to_device
from fedrepro.sim.tensors import DeviceData, evaluate
from fedrepro.sim.vector_optim import VectorOptimizer
from fedrepro.sim.vectorized import train_side_by_side

_DEFAULT = defaults.training()  # the study schema's, the one place defaults live (fedrepro.defaults)


@dataclass
class TrainingConfig(RoundConfig):
    """A run's training keys (a study's `defaults`, workflow/schemas/study.schema.yaml, where each is described):
    the shared loop's (sim/loop.py) and the synchronous engine's."""

    momentum: float = _DEFAULT["momentum"]
    weight_decay: float = _DEFAULT["weight_decay"]
    straggler_steps: list[int] | None = _DEFAULT["straggler_steps"]  # [lo, hi]: local iterations per client, round
    optimizer: str = _DEFAULT["optimizer"]  # the clients' local optimiser: sgd or adam (sim/vector_optim.py)
    lr_decay: float = _DEFAULT["lr_decay"]  # the learning rate is multiplied by this every lr_decay_every rounds
    lr_decay_every: int = _DEFAULT["lr_decay_every"]  # 0: a constant learning rate
    keep_best: bool = _DEFAULT["keep_best"]  # what follows the run (fine-tuning) gets its best evaluated model

    def lr_at(self, rnd: int) -> float:
        """The clients' learning rate in round ``rnd`` (1-based): step decay, lr x lr_decay^floor((rnd-1)/every)."""
        if not self.lr_decay_every:
            return self.lr
        return self.lr * self.lr_decay ** ((rnd - 1) // self.lr_decay_every)

    def local_optimizer(self, rnd: int) -> VectorOptimizer:
        """A fresh optimiser for one local training in round ``rnd``."""
        return VectorOptimizer(self.optimizer, self.lr_at(rnd), self.momentum, self.weight_decay)


@dataclass
class SyncResult(RunResult):
    """RunResult plus how the sampled clients trained: EngineChoice.summary(), summary.json's "engine"
    (None: auto on CUDA, not measured as no round trained in this process: resumed from a finished run)."""

    engine: dict | None = None


def payload_bytes(tensors: dict[str, torch.Tensor]) -> int:
    return sum(t.numel() * t.element_size() for t in tensors.values())


class FederatedRun(RoundLoop):
    """One seed of one method on one setting."""

    def __init__(
        self,
        model: nn.Module,
        algorithm: Algorithm,
        data: DeviceData,
        client_indices: list[np.ndarray],
        training: TrainingConfig,
        weighting: dict,
        seed: int,
        log: Callable[[str], None] = print,
        engine: str | EngineChoice = "sequential",
        side_by_side: int = 32,
    ) -> None:
        self.flat = FlatModel(model)
        self.w_init = self.flat.w.detach().clone()  # the seeded initial model, whatever runs before run()
        self.model, self.alg, self.data, self.cfg = model, algorithm, data, training
        self.seed, self.log = seed, log
        device = data.x_train.device
        self.clients = [torch.as_tensor(idx, dtype=torch.long, device=device) for idx in client_indices]
        self.side_by_side = min(side_by_side, self.clients_per_round)  # the most clients trained at once
        # ``engine`` is the config's mode or an earlier seed's measured choice (train.train_job); None: auto on
        # CUDA, measured in the first round this run trains (sim/engine_choice.py)
        self.engine = engine if isinstance(engine, EngineChoice) else initial_choice(
            engine, self.side_by_side, device, algorithm)
        labels = data.y_train.cpu().numpy()
        self.class_counts = np.stack(
            [np.bincount(labels[idx], minlength=data.num_classes) for idx in client_indices]
        )
        test_counts = np.bincount(data.y_test.cpu().numpy(), minlength=data.num_classes)
        self.weighting = make_weighting(weighting, self.class_counts, test_counts)
        # methods that need more than their hooks' arguments (e.g. FedIIR's per-round gradients on the
        # clients' data) reach the data and client index tensors through the simulation
        self.alg.sim = self
        self.alg.setup(self.flat, len(client_indices), training)

    @property
    def vectorized(self) -> bool:
        """Whether the sampled clients train side by side (sim/vectorized.py)."""
        return self.engine is not None and self.engine.mode == SIDE_BY_SIDE

    @property
    def clients_per_round(self) -> int:
        return max(1, int(round(self.cfg.join_ratio * len(self.clients))))

    # ----- one client
    def sample_clients(self, rnd: int) -> np.ndarray:
        return draw_clients(self.seed, rnd, np.arange(len(self.clients)), self.clients_per_round)

    def train_client(self, cid: int, rnd: int, w_global: torch.Tensor) -> tuple[dict, torch.Tensor, int]:
        """E local epochs of SGD from ``w_global``; returns (upload, summed batch loss, samples seen)."""
        flat = self.flat
        client = self.client(cid, rnd, w_global)
        flat.load(w_global)
        loss_sum, seen = self.local_sgd(client, self.data.x_train, self.data.y_train, self.client_batches(cid, rnd))
        with torch.no_grad():
            upload = self.alg.upload(client, flat.w)
        return upload, loss_sum, seen

    def client(self, cid: int, rnd: int, w_global: torch.Tensor) -> Client:
        """What the hooks know of client ``cid`` starting its local training in round ``rnd``."""
        return Client(cid=cid, round=rnd, w_start=w_global, num_samples=len(self.clients[cid]),
                      samples=self.clients[cid])

    def client_batches(self, cid: int, rnd: int):
        """Client ``cid``'s local batches in round ``rnd`` (``local_batches``) from its own seeded generator:
        whichever engine trains it, or the engine probe times it, draws the same."""
        gen = torch.Generator().manual_seed(seeding.derive_seed(self.seed, seeding.BATCHES, rnd, cid))
        return self.local_batches(self.clients[cid], gen, rnd, cid)

    def local_sgd(self, client: Client, x_all: torch.Tensor, y_all: torch.Tensor,
                  batches: Iterable[torch.Tensor]) -> tuple[torch.Tensor, int]:
        """The clients' optimiser over ``batches`` (index tensors into x_all, y_all), in place on the model's
        flat vector from whatever it holds: the method's local loss and gradient corrections, then the run's
        optimiser (fresh for each call, as every client's; weight decay, momentum or Adam's moments) at the
        round's learning rate. Returns (summed batch loss, samples seen). Also a server that trains "like one
        more client" (HFCL)."""
        flat, alg = self.flat, self.alg
        optimizer = self.cfg.local_optimizer(client.round)
        loss_sum = torch.zeros((), device=flat.w.device, dtype=flat.w.dtype)
        seen = 0
        for batch in batches:
            flat.zero_grad()
            client.batch = batch
            loss = alg.local_loss(self.model, x_all[batch], y_all[batch], client)
            loss.backward()
            with torch.no_grad():
                alg.correct_grad(flat.w, flat.g, client)
                optimizer.step(flat.w, flat.g)
                loss_sum += loss.detach() * len(batch)
            seen += len(batch)
            client.steps += 1
        return loss_sum, seen

    def local_batches(self, idx: torch.Tensor, gen: torch.Generator, rnd: int, cid: int):
        """Index batches of one client's local training: ``local_epochs`` reshuffled passes (each without
        its short last batch with ``drop_last``; sim/batches.py), or, with ``straggler_steps = [lo, hi]``, a
        number of iterations drawn uniformly per client and round (FedDisco's device-heterogeneity
        setting), cycling through reshuffled passes."""
        cfg, n = self.cfg, len(idx)
        if cfg.straggler_steps:
            lo, hi = cfg.straggler_steps
            budget = int(seeding.rng_for(self.seed, seeding.STRAGGLERS, rnd, cid).integers(lo, hi + 1))
        else:
            budget = math.inf
        taken, epoch = 0, 0
        while taken < budget and (cfg.straggler_steps or epoch < cfg.local_epochs):
            order = idx[torch.randperm(n, generator=gen).to(idx.device)]
            for batch in epoch_batches(order, cfg.batch_size, cfg.drop_last):
                if taken >= budget:
                    return
                yield batch
                taken += 1
            epoch += 1

    def client_groups(self, cids: list[int], weights: list[float]):
        """The sampled clients in training order: one at a time, or side by side in groups of at most
        the engine's ``clients_at_once`` (memory: each lane holds a parameter, gradient and momentum vector,
        and a batch's activations). Side by side, clients are bucketed by size first, so a group's lanes
        finish their local steps together instead of idling behind the largest client."""
        if not self.vectorized:
            yield from (([c], [p]) for c, p in zip(cids, weights, strict=True))
            return
        width = self.engine.clients_at_once
        order = sorted(range(len(cids)), key=lambda i: len(self.clients[cids[i]]))
        for start in range(0, len(order), width):
            group = order[start : start + width]
            yield [cids[i] for i in group], [weights[i] for i in group]

    # ----- the round, as the shared loop (sim/loop.py) asks for it
    def new_result(self) -> SyncResult:
        self.w = self.w_init.clone()
        return SyncResult(engine=self.engine.summary() if self.engine else None)

    def restore(self, resumed: dict, checkpoint: Path) -> None:
        self.w = resumed["w"].to(self.w.device)
        self.alg.state = to_device(resumed["state"], self.w.device)
        restore_buffers(self.model, resumed.get("buffers"))

    def engine_state(self) -> dict:
        return dict(w=self.w.cpu(), state=to_device(self.alg.state, "cpu"), buffers=module_buffers(self.model))

    def play_round(self, rnd: int) -> RoundPlay:
        w, totals = self.w, self.totals
        model_bytes = w.numel() * w.element_size()
        sampled = self.sample_clients(rnd)
        weights = self.weighting(sampled)
        self.alg.server_begin(w, sampled, weights)
        if self.engine is None:  # auto on CUDA: measured on this round's model before any client trains
            self.engine = measure(self, rnd, w, sampled.tolist(), self.side_by_side)
            self.result.engine = self.engine.summary()
            self.log(f"engine: {self.engine.mode}, {self.engine.clients_at_once} client(s) at once "
                     f"({self.engine.reason})")
        loss_sum = torch.zeros((), device=w.device, dtype=w.dtype)
        seen = 0
        trace = RoundTrace()
        for cids, ps in self.client_groups(sampled.tolist(), list(weights)):
            for cid in cids:
                download = self.alg.download(cid)
                trace.note(f"client {cid}'s download", download)
                totals.bytes_down += model_bytes + payload_bytes(download)
            if self.vectorized:
                trained = train_side_by_side(self, cids, rnd, w)
            else:
                trained = [self.train_client(cids[0], rnd, w)]
            for cid, p, (upload, client_loss, client_seen) in zip(cids, ps, trained, strict=True):
                trace.note(f"client {cid}'s training loss", client_loss)
                trace.note(f"client {cid}'s upload", upload)
                totals.bytes_up += payload_bytes(upload)
                self.alg.server_receive(cid, upload, p)
                loss_sum += client_loss
                seen += client_seen
        with torch.no_grad():
            self.w = self.alg.server_end(w)
        return RoundPlay(loss_sum.item() / max(seen, 1), bad=not all_finite(self.w), trace=trace)

    def note_divergence(self, trace: RoundTrace) -> None:
        trace.note("the global model", self.w)
        trace.note("the method's state", self.alg.state)

    def evaluate_round(self, rnd: int, play: RoundPlay, result: RunResult) -> float:
        self.flat.load(self.alg.evaluated_model(self.w))
        acc, test_loss, result.per_class_acc = evaluate(
            self.model, self.data.x_test, self.data.y_test, self.data.num_classes)
        totals = self.totals
        result.history.append(
            dict(round=rnd, test_acc=acc, test_loss=test_loss, train_loss=play.train_loss,
                 bytes_up=totals.bytes_up, bytes_down=totals.bytes_down, seconds=round(totals.seconds, 4),
                 **client_accuracy(self.class_counts, result.per_class_acc), **self.alg.round_metrics())
        )
        self.log(f"round {rnd}/{self.cfg.rounds} acc {acc:.2f} loss {test_loss:.4f} "
                 f"train {play.train_loss:.4f} {totals.seconds:.1f}s")
        return acc

    def kept_model(self) -> dict:
        return dict(w=self.flat.w.detach().cpu().clone(), buffers=module_buffers(self.model))

    def hand_on(self, kept: dict) -> None:
        self.flat.load(kept["w"].to(self.flat.w.device))
        restore_buffers(self.model, kept["buffers"])

    def finish(self, result: RunResult) -> None:
        self.flat.load(self.alg.evaluated_model(self.w))  # the reported model, also for what follows (fine-tuning)
        if result.per_class_acc is None:  # resumed from a finished checkpoint
            result.per_class_acc = evaluate(self.model, self.data.x_test, self.data.y_test, self.data.num_classes)[2]


def client_accuracy(class_counts: np.ndarray, per_class_acc: list[float | None]) -> dict[str, float]:
    """Mean and variance over clients of the global model's accuracy on a test set following each
    client's class distribution (sum_c D_k[c] acc_c): FedDisco's client-level fairness (Table 12).
    Classes absent from the test set are left out and each D_k renormalised over the rest."""
    acc = np.array([np.nan if a is None else a for a in per_class_acc], dtype=np.float64)
    present = ~np.isnan(acc)
    dist = class_counts[:, present].astype(np.float64)
    dist /= np.maximum(dist.sum(axis=1, keepdims=True), 1.0)
    per_client = dist @ acc[present]
    return {"client_acc_mean": float(per_client.mean()), "client_acc_var": float(per_client.var())}


