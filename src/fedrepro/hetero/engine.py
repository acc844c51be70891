"""The round loop for heterogeneous client models (FedL2G and its baselines).

Client i trains architecture ``group[i mod X]`` and keeps its own parameters (and BatchNorm buffers, where
an architecture has them) between rounds: one module per architecture does the computing, each client's
state is a flat parameter vector (sim/flat.py's layout) plus its buffers, in dicts keyed by client id, on the
run's device or, with ``offload``, on the CPU (only the training client's state is on the device then). No
weights are averaged unless a method (hetero/methods/) says so.

Each client's samples are split once into its own train and test sets (``train_fraction``, 75/25 as PFLlib's
``train_test_split(train_size=0.75, shuffle=True)``: ceil(25%) test samples) by a generator seeded by
(seed, client), or (the partition's ``seed``, client) where a study fixes one (``split_seed``: its trials then
share their clients' train and test sets, as HtFLlib's share the generated files). Accuracy is reported two
ways: ``test_acc`` pools every client's test samples (correct / total, what HtFLlib's ``evaluate`` prints and
the FedL2G tables show), ``client_acc_mean`` / ``client_acc_var`` average the per-client accuracies with equal
weight.

Communication is measured: the bytes of every tensor a method broadcasts or uploads (float32 rows, int32
class ids, SVD factors...), summed over the sampled clients. Client seconds are each sampled client's
compute from receiving the broadcast to its upload (local training, prototypes, FedL2G's feedback), averaged
over the round's clients; server seconds are the method's server hooks. On CUDA the clock synchronises first.

Every random draw is a pure function of (seed, purpose, round, client) (fedrepro.seeding), so a run resumed
from a checkpoint (fedrepro.sim.checkpoint) ends with the metrics of an uninterrupted one.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor

from fedrepro import seeding
from fedrepro.hetero.base import ClientRound, HeteroMethod
from fedrepro.models.cnn import SplitModel
from fedrepro.models.groups import build_arch, group_members
from fedrepro.sim.batches import epoch_batches
from fedrepro.sim.checkpoint import CheckpointError
from fedrepro.sim.flat import FlatModel
from fedrepro.sim.loop import RoundConfig, RoundLoop, RoundPlay, draw_clients
from fedrepro.sim.runs import RoundTrace, RunResult, all_finite, to_device
from fedrepro.sim.tensors import DeviceData, inference_batch

# purposes beyond fedrepro.seeding's (INIT, SAMPLING, BATCHES, DELAYS, SERVER, STRAGGLERS = 1..6)
SPLIT, GUIDE, META, AUX, SERVER_TRAIN = 101, 102, 103, 104, 105
ENGINE = "hetero"  # checkpoints of this engine say so: a homogeneous run's checkpoint is refused


@dataclass
class HeteroConfig(RoundConfig):
    """The shared loop's training keys (sim/loop.py; the names shared with sim.sync.TrainingConfig mean the same);
    HtFLlib's drop_last (floor(n_i / batch) steps per epoch) is set by its studies, and the engine's own settings
    have no study key."""

    train_fraction: float = 0.75  # each client's own train / test split
    offload: bool = False  # keep the clients' states on the CPU between their turns


@dataclass
class HeteroResult(RunResult):
    """RunResult (so train.write_run takes it) plus the final per-client accuracies."""

    per_client_acc: list[float] | None = None


def payload_bytes(obj: Any) -> int:
    """Bytes of every tensor in a (nested) payload of dicts, lists and tuples."""
    if isinstance(obj, Tensor):
        return obj.numel() * obj.element_size()
    if isinstance(obj, dict):
        return sum(payload_bytes(v) for v in obj.values())
    if isinstance(obj, list | tuple):
        return sum(payload_bytes(v) for v in obj)
    return 0


def split_client(n: int, train_fraction: float, seed: int, cid: int) -> tuple[np.ndarray, np.ndarray]:
    """Positions (into the client's sample list) of its train and test samples: a seeded shuffle, then
    ceil((1 - train_fraction) n) test samples, as sklearn's train_test_split(train_size=...). The train
    positions stay in shuffled order: FedL2G's quiz set is the first of them, so it is a random one even
    where a data set or partition lists samples by class."""
    perm = seeding.rng_for(seed, SPLIT, cid).permutation(n)
    n_test = math.ceil(round((1.0 - train_fraction) * n, 9))  # round: 0.25 * n in floats, then ceil
    return perm[: n - n_test], np.sort(perm[n - n_test :])


def pooled(data: DeviceData) -> DeviceData:
    """One pool of a data set's train and test samples (PFLlib partitions the whole set, then every client
    splits its share 75/25): x_train holds all samples, x_test is empty."""
    return DeviceData(
        x_train=torch.cat([data.x_train, data.x_test]), y_train=torch.cat([data.y_train, data.y_test]),
        x_test=data.x_test[:0], y_test=data.y_test[:0], num_classes=data.num_classes,
        model_kwargs=dict(data.model_kwargs),
    )


def clip_grad_(g: Tensor, max_norm: float) -> None:
    """torch.nn.utils.clip_grad_norm_ on one flat gradient vector."""
    norm = g.norm()
    coef = max_norm / (norm + 1e-6)
    if coef < 1:
        g.mul_(coef)


class HeteroRun(RoundLoop):
    """One seed of one method on one setting, with per-client architectures from a model group."""

    def __init__(
        self,
        group: str | Sequence[str],
        method: HeteroMethod,
        data: DeviceData,
        client_indices: list[np.ndarray],
        training: HeteroConfig,
        seed: int,
        feature_dim: int = 512,
        log: Callable[[str], None] = print,
        split_seed: int | None = None,
    ) -> None:
        self.cfg, self.method, self.data, self.seed, self.log = training, method, data, seed, log
        self.device = data.x_train.device
        self.state_device = torch.device("cpu") if training.offload else self.device
        self.num_classes, self.feature_dim = data.num_classes, feature_dim
        self.group = group_members(group)
        self.num_clients = len(client_indices)
        self.arch_of = [self.group[i % len(self.group)] for i in range(self.num_clients)]

        # each client's own train / test split of its samples
        self.train_idx: list[Tensor] = []
        self.test_idx: list[Tensor] = []
        for cid, idx in enumerate(client_indices):
            idx = np.asarray(idx, dtype=np.int64)
            tr, te = split_client(len(idx), training.train_fraction, seed if split_seed is None else split_seed,
                                  cid)
            if len(tr) < 2:
                raise ValueError(f"client {cid} has {len(idx)} samples: too few for a train / test split")
            self.train_idx.append(torch.as_tensor(idx[tr], device=self.device))
            self.test_idx.append(torch.as_tensor(idx[te], device=self.device))

        # one computing module per architecture; every client's initial state from its own seeded build
        self.modules: dict[str, SplitModel] = {}
        self.flats: dict[str, FlatModel] = {}
        self.client_w: dict[int, Tensor] = {}
        self.client_buffers: dict[int, dict[str, Tensor]] = {}
        for cid, arch in enumerate(self.arch_of):
            model = self.build_module(arch, cid)
            if arch not in self.modules:
                self.modules[arch], self.flats[arch] = model, FlatModel(model)
            flat = self.flats[arch]
            self.client_w[cid] = flat.vector_of([p.detach() for p in model.parameters()]).to(self.state_device)
            self.client_buffers[cid] = {n: b.detach().clone().to(self.state_device)
                                        for n, b in model.named_buffers()}
        self.method.setup(self)

    # ----- models
    def build_module(self, arch: str, *coords: int) -> SplitModel:
        """A fresh ``arch`` on the run's device, initialised from the seed derived from (seed, INIT, *coords)."""
        torch.manual_seed(seeding.derive_seed(self.seed, seeding.INIT, *coords))
        model = build_arch(arch, self.data.shape, self.num_classes, self.feature_dim).to(self.device)
        if model.feature_dim != self.feature_dim:
            raise ValueError(f"{arch} ends in {model.feature_dim} features, the group in {self.feature_dim}")
        return model

    def smallest_arch(self) -> str:
        """The group member with the fewest parameters (FML's and FedKD's shared auxiliary model)."""
        return min(self.group, key=lambda a: self.flats[a].numel)

    def client_params(self, cid: int, prefix: str = "") -> dict[str, Tensor]:
        """Client ``cid``'s stored parameters by name (views; with ``prefix``, that submodule's)."""
        return self.flats[self.arch_of[cid]].as_params(self.client_w[cid], prefix)

    def load_client(self, cid: int, rnd: int) -> ClientRound:
        """Client ``cid``'s state in its architecture's module."""
        arch = self.arch_of[cid]
        model, flat = self.modules[arch], self.flats[arch]
        flat.load(self.client_w[cid])
        with torch.no_grad():
            for name, buf in model.named_buffers():
                buf.copy_(self.client_buffers[cid][name])
        model.train()
        return ClientRound(cid=cid, round=rnd, arch=arch, model=model, flat=flat, train_idx=self.train_idx[cid])

    def store_client(self, client: ClientRound) -> None:
        """Write the module's parameters and buffers back to the client's state."""
        self.client_w[client.cid].copy_(client.flat.w)
        for name, buf in client.model.named_buffers():
            self.client_buffers[client.cid][name].copy_(buf)

    # ----- one client
    def sample_clients(self, rnd: int) -> np.ndarray:
        k = self.num_clients
        return draw_clients(self.seed, rnd, np.arange(k), max(1, int(round(self.cfg.join_ratio * k))))

    def local_batches(self, idx: Tensor, gen: torch.Generator) -> Iterator[Tensor]:
        """``local_epochs`` reshuffled passes over ``idx`` in batches (the last partial one dropped with
        ``drop_last``, unless the client has less than one batch; sim/batches.py)."""
        cfg, n = self.cfg, len(idx)
        for _ in range(cfg.local_epochs):
            # HtFLlib's client loaders keep one fixed order (shuffle=False, so drop_last always drops the same
            # samples); here every epoch reshuffles, seeded (documented deviation D-fedl2g-shuffle)
            order = idx[torch.randperm(n, generator=gen).to(idx.device)]
            yield from epoch_batches(order, cfg.batch_size, cfg.drop_last)

    def train_client(self, client: ClientRound) -> tuple[Tensor, Tensor, int]:
        """Local SGD (plain, lr ``cfg.lr``) on the method's trainables; (summed loss, summed CE, samples)."""
        cfg, method = self.cfg, self.method
        trainables = method.trainables(client)
        gen = torch.Generator().manual_seed(seeding.derive_seed(self.seed, seeding.BATCHES, client.round, client.cid))
        loss_sum = torch.zeros((), device=self.device)
        ce_sum = torch.zeros((), device=self.device)
        seen = 0
        x_all, y_all = self.data.x_train, self.data.y_train
        for batch in self.local_batches(method.local_indices(client), gen):
            for f in trainables:
                f.zero_grad()
            loss, ce = method.local_loss(client, x_all[batch], y_all[batch])
            loss.backward()
            with torch.no_grad():
                for f in trainables:
                    if method.clip_norm is not None:
                        clip_grad_(f.g, method.clip_norm)
                    f.w.add_(f.g, alpha=-cfg.lr)
                loss_sum += loss.detach() * len(batch)
                ce_sum += ce.detach() * len(batch)
            seen += len(batch)
            client.steps += 1
        return loss_sum, ce_sum, seen

    # ----- evaluation
    @torch.no_grad()
    def evaluate(self) -> dict[str, Any]:
        """Every client's model on its own test set: pooled and per-client accuracy (percent), pooled loss."""
        batch_size = inference_batch(self.device)
        correct = loss = 0.0
        total = 0
        per_client: list[float] = []
        hits = torch.zeros(self.num_classes, device=self.device)
        counts = torch.zeros(self.num_classes, device=self.device)
        for cid in range(self.num_clients):
            idx = self.test_idx[cid]
            client = self.load_client(cid, 0)
            self.method.prepare_evaluation(client)
            client.model.eval()
            right_c = 0.0
            for start in range(0, len(idx), batch_size):
                b = idx[start : start + batch_size]
                x, y = self.data.x_train[b], self.data.y_train[b]
                feats = client.model.body(x)
                logits = client.model.head(feats)
                right = self.method.predict(client, feats, logits) == y
                right_c += right.sum().item()
                loss += F.cross_entropy(logits, y, reduction="sum").item()
                hits += torch.bincount(y[right], minlength=self.num_classes)
                counts += torch.bincount(y, minlength=self.num_classes)
            client.model.train()
            correct += right_c
            total += len(idx)
            per_client.append(100.0 * right_c / max(len(idx), 1))
        per_class = [None if c == 0 else 100.0 * h / c for h, c in zip(hits.tolist(), counts.tolist(), strict=True)]
        return {
            "test_acc": 100.0 * correct / max(total, 1), "test_loss": loss / max(total, 1),
            "client_acc_mean": float(np.mean(per_client)), "client_acc_var": float(np.var(per_client)),
            "per_client_acc": per_client, "per_class_acc": per_class,
        }

    @torch.no_grad()
    def embeddings(self, space: str = "feature", per_class: int = 10) -> dict[str, np.ndarray]:
        """Each client's representation of its own test samples, at most ``per_class`` per class and client
        (the first in its test order): 512-d features (``space="feature"``) or logits, with labels and client
        ids, for a t-SNE beside a method's anchors (FedL2G Fig. 4)."""
        feats, labels, clients = [], [], []
        for cid in range(self.num_clients):
            idx = self.test_idx[cid]
            y = self.data.y_train[idx]
            keep = torch.cat([torch.nonzero(y == c).squeeze(1)[:per_class] for c in y.unique()])
            idx = idx[keep.sort().values]
            client = self.load_client(cid, 0)
            self.method.prepare_evaluation(client)
            client.model.eval()
            z = client.model.body(self.data.x_train[idx])
            if space == "logit":
                z = client.model.head(z)
            client.model.train()
            feats.append(z.cpu().numpy())
            labels.append(self.data.y_train[idx].cpu().numpy())
            clients.append(np.full(len(idx), cid))
        return {"features": np.concatenate(feats).astype(np.float32), "labels": np.concatenate(labels),
                "clients": np.concatenate(clients)}

    def _clock(self) -> float:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        return time.perf_counter()

    # ----- the round, as the shared loop (sim/loop.py) asks for it
    def new_result(self) -> HeteroResult:
        self.window = _Window()
        return HeteroResult()

    def engine_state(self) -> dict:
        """Every client's state, the method's, and the costs since the last evaluation."""
        return dict(engine=ENGINE,
                    clients={cid: {"w": self.client_w[cid].cpu(), "buffers": to_device(self.client_buffers[cid], "cpu")}
                             for cid in range(self.num_clients)},
                    state=to_device(self.method.state, "cpu"), window=self.window.__dict__)

    def restore(self, resumed: dict, checkpoint: Path) -> None:
        if resumed.get("engine") != ENGINE:
            raise CheckpointError(f"checkpoint {checkpoint} was not written by the heterogeneous-model engine")
        for cid, st in resumed["clients"].items():
            self.client_w[cid].copy_(st["w"])
            for name, buf in st["buffers"].items():
                self.client_buffers[cid][name].copy_(buf)
        self.method.state = to_device(resumed["state"], self.device)
        self.window = _Window(**resumed["window"])

    def play_round(self, rnd: int) -> RoundPlay:
        method, totals = self.method, self.totals
        sampled = self.sample_clients(rnd)
        up = down = 0
        server_s = 0.0
        client_s: list[float] = []
        loss_sum = torch.zeros((), device=self.device)
        ce_sum = torch.zeros((), device=self.device)
        seen = 0
        bad_client = False
        trace = RoundTrace()
        t = self._clock()
        method.server_begin(rnd, sampled)
        server_s += self._clock() - t
        trains = method.trains(rnd)
        for cid in sampled.tolist():
            t = self._clock()
            payload = method.broadcast(cid, rnd)
            server_s += self._clock() - t
            down += payload_bytes(payload)
            trace.note(f"client {cid}'s download", payload)
            client = self.load_client(cid, rnd)
            t = self._clock()
            method.receive(client, payload)
            if trains:
                c_loss, c_ce, c_seen = self.train_client(client)
                trace.note(f"client {cid}'s training loss", c_loss)
                loss_sum += c_loss
                ce_sum += c_ce
                seen += c_seen
            upload = method.upload(client)
            client_s.append(self._clock() - t)
            up += payload_bytes(upload)
            trace.note(f"client {cid}'s model", client.flat.w)
            trace.note(f"client {cid}'s upload", upload)
            bad_client = bad_client or not all_finite(client.flat.w)
            self.store_client(client)
            t = self._clock()
            method.server_receive(cid, upload, client.num_train)
            server_s += self._clock() - t
        t = self._clock()
        method.server_end(rnd)
        server_s += self._clock() - t
        totals.bytes_up, totals.bytes_down = totals.bytes_up + up, totals.bytes_down + down
        self.window.add(up, down, float(np.mean(client_s)), server_s)
        # None (an empty CSV cell) when no client trained: FedL2G's warm-up rounds
        self.train_ce = ce_sum.item() / seen if seen else None
        return RoundPlay(loss_sum.item() / seen if seen else None, bad=bad_client or method.diverged(), trace=trace)

    def note_divergence(self, trace: RoundTrace) -> None:
        trace.note("the method's state", self.method.state)

    def evaluate_round(self, rnd: int, play: RoundPlay, result: HeteroResult) -> float:
        ev = self.evaluate()
        result.per_class_acc, result.per_client_acc = ev["per_class_acc"], ev["per_client_acc"]
        totals = self.totals
        result.history.append(dict(
            round=rnd, test_acc=ev["test_acc"], test_loss=ev["test_loss"], train_loss=play.train_loss,
            bytes_up=totals.bytes_up, bytes_down=totals.bytes_down, seconds=round(totals.seconds, 4),
            client_acc_mean=ev["client_acc_mean"], client_acc_var=ev["client_acc_var"],
            train_ce=self.train_ce, **self.window.row(), **self.method.round_metrics(),
        ))
        self.window = _Window()
        trained = "-" if play.train_loss is None else f"{play.train_loss:.4f}"
        self.log(f"round {rnd}/{self.cfg.rounds} acc {ev['test_acc']:.2f} (per client "
                 f"{ev['client_acc_mean']:.2f}) train {trained} {totals.seconds:.1f}s")
        return ev["test_acc"]

    def finish(self, result: HeteroResult) -> None:
        if result.per_client_acc is None:  # resumed from a finished checkpoint
            ev = self.evaluate()
            result.per_class_acc, result.per_client_acc = ev["per_class_acc"], ev["per_client_acc"]


@dataclass
class _Window:
    """Per-round costs accumulated since the last evaluation row; a row shows their mean per round."""

    rounds: int = 0
    up: int = 0
    down: int = 0
    client_s: float = 0.0
    server_s: float = 0.0

    def add(self, up: int, down: int, client_s: float, server_s: float) -> None:
        self.rounds += 1
        self.up, self.down = self.up + up, self.down + down
        self.client_s, self.server_s = self.client_s + client_s, self.server_s + server_s

    def row(self) -> dict[str, float]:
        k = max(self.rounds, 1)
        return {"round_bytes_up": self.up / k, "round_bytes_down": self.down / k,
                "client_seconds": round(self.client_s / k, 6), "server_seconds": round(self.server_s / k, 6)}
