"""Preflight: every distinct job shape of a config, run through the real path before GPU hours are spent.

    python -m fedrepro.preflight --configfile config/paper.yaml [--sample N] [--device auto] [--out FILE]

Jobs are grouped by what decides their memory and time (federation, method, model, data set and input size,
clients, batch, server data, and the switches of a method); each group's first job runs the real train job
(``pipeline.partition``'s partitioner, ``pipeline.train``, and for a transfer setting ``pipeline.finetune``)
for two rounds and one fine-tuning epoch, on synthetic data of the data set's real shape and classes, with the
real client count and partition kind, each client holding about one batch, in a forked process of its own
(its peak resident memory is its own). What it reports per group, against the config's ``train_resources``:

- ran, or the error (last line);
- measured: peak host memory (RSS), on CUDA peak GPU memory, seconds per local step, checkpoint size;
- projected to the paper's numbers: the data set on the device at its real size (train and test images as
  floats, sim/tensors.py), state kept per client (SCAFFOLD's control variates, CA2FL's cache: a method's
  ``state_bytes_per_client``) for every client, activations at the real batch when the preflight ran a
  smaller one, and the job's hours (steps x measured seconds per step; on a CPU preflight the GPU hours come
  from ``fedrepro.cost``'s FLOP model instead, and say so);
- the jobs of the group that would exceed mem_mb or runtime, by name.

Shortcuts taken, so a whole config fits minutes on a laptop (each one stated in the table's header): two
rounds (the second timed: ``warm_step_seconds``), every update on time (async delays 0, so the server's merge
and search run), every count of server epochs at one (``one_pass``), the in-domain server set and the
out-of-domain set at two chunks, each model's facts (FLOPs, saved bytes) measured once per preflight
(``model_facts``), a batch cut to ``--max-batch-flops`` per step (activations are then projected linearly from the
bytes autograd saves per sample, which is what scales with the batch; the test set is then two server sets), and
on a CPU ``--max-clients`` trained a round (half as many, at least 2, where one sample's forward exceeds the cut:
``heavy_clients``), a heterogeneous group holding one client of each architecture (or
``--max-clients`` if more; ``built_clients``) with the other clients' models projected by architecture.

Not a shortcut, as nothing measured changes: a model the preflight has built before from the same RNG state is
loaded instead of initialised again (``memoised_build``; FedL2G's groups build the same architectures from the
same seeds), and the engines are imported once, before the children fork.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib
import json
import math
import multiprocessing as mp
import os
import resource
import tempfile
import time
import traceback
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from fedrepro.config import REPO, merge_configfiles, resolve_config
from fedrepro.cost import model_input
from fedrepro.io import atomic_write, atomic_write_json
from fedrepro.study import grid_runs, job_resources, run_spec, transfer_runs

PREFLIGHT_ROUNDS = 2
HETERO_BATCHES = 3  # batches a hetero client holds in a preflight run (75% of them train)
SERVER_SAMPLES = 64  # the in-domain server set and the OOD set of the preflight (two batches where the batch is cut)
MIB = 1 << 20


@dataclass
class Job:
    """One train job: its name (study/setting/method), run spec and number of seeds."""

    name: str
    spec: dict
    seeds: int
    resources: dict  # train_resources with the study's overrides (config.job_resources)


@dataclass
class Group:
    """Jobs of one shape; the first one's spec is the one the preflight runs."""

    key: str
    jobs: list[Job] = field(default_factory=list)
    finetune: dict | None = None  # the first transfer job's fine-tuning spec (FedGTST)

    @property
    def spec(self) -> dict:
        return self.jobs[0].spec


def shape_key(spec: dict) -> str:
    """What decides a job's memory and time per step: federation, method and its switches, model, input shape,
    classes, clients, batch and server data. Not the data set's size (projected per job), nor the numbers a
    method is tuned with or the schedule (rounds, rates, delays, participation), which change neither the
    tensors nor the cost of a step."""
    switches = {k: v for k, v in spec["hparams"].items() if isinstance(v, (bool, str)) or v is None}
    asyn = {k: v for k, v in spec.get("async", {}).items() if k in ("ood_dataset", "true_update")}
    key = [spec["federation"], spec["algorithm"], spec["model"], *model_input(spec),
           spec["partition"]["clients"], spec["training"]["batch_size"], switches, asyn]
    return json.dumps(key, sort_keys=True, default=str)


def job_groups(config: dict) -> list[Group]:
    """Every train job of ``config`` in groups of one shape, in study and grid order."""
    from fedrepro.study import finetune_spec

    groups: dict[str, Group] = {}
    for name, study in config["studies"].items():
        transfers = set(transfer_runs(study))
        for setting, method in grid_runs(study):
            spec = run_spec(study, setting, method)
            key = shape_key(spec)
            group = groups.setdefault(key, Group(key))
            group.jobs.append(Job(f"{name}/{setting}/{method}", spec, len(study["seeds"]),
                                  job_resources(config["train_resources"], study, setting, method)))
            if (setting, method) in transfers and group.finetune is None:
                group.finetune = finetune_spec(study, setting, method)
    return list(groups.values())


def sample_groups(groups: list[Group], n: int) -> list[Group]:
    """At most ``n`` groups covering every federation and model first, then every data set."""
    picked: list[Group] = []
    for facet in (lambda g: (g.spec["federation"], g.spec["model"]), lambda g: g.spec["dataset"],
                  lambda g: g.spec["algorithm"]):
        seen = {facet(g) for g in picked}
        for g in groups:
            if len(picked) >= n:
                return picked
            if facet(g) not in seen and g not in picked:
                picked.append(g)
                seen.add(facet(g))
    return picked


# ----- synthetic data of the real shapes
def data_shape(dataset: str) -> tuple[int, tuple[int, ...], int]:
    """(training samples, sample shape, classes) of ``dataset`` as the paper uses it (fedrepro.cost)."""
    from fedrepro.cost import DATASETS

    if dataset not in DATASETS:
        raise ValueError(f"preflight: no shape known for data set {dataset!r}; declare its size in its "
                         "fedrepro.data.registry.DATASETS entry")
    return DATASETS[dataset]


def write_synthetic(path: Path, dataset: str, x_rows: int, labels: np.ndarray, test_rows: int,
                    groups: np.ndarray | None = None) -> dict:
    """A prepared .npz of ``x_rows`` random samples of ``dataset``'s shape with ``labels`` (train) and
    ``test_rows`` test samples (labels cycling through the classes: a test set holding every one of DomainNet's
    345 classes cost a 224-pixel forward each, per evaluation, for no shape the job does not already have)."""
    from fedrepro.data.format import save_prepared

    _, shape, classes = data_shape(dataset)
    rng = np.random.default_rng(0)
    text = len(shape) == 1
    vocab = 30_000
    meta = {"name": dataset, "num_classes": classes, "classes": [str(c) for c in range(classes)],
            "shape": list(shape), "source": "synthetic (preflight)",
            **({"kind": "text", "vocab_size": vocab} if text else {})}

    def x(n: int) -> np.ndarray:
        if text:
            return rng.integers(0, vocab, (n, *shape), dtype=np.int32)
        return rng.integers(0, 256, (n, *shape), dtype=np.uint8)

    y_test = np.arange(test_rows) % classes
    extras = {"groups_train": groups} if groups is not None else None
    return save_prepared(path, x(len(labels)), labels, x(len(y_test)), y_test, meta, extras)


def synthetic_inputs(spec: dict, seed: int, workdir: Path, test_rows: int = 2 * SERVER_SAMPLES,
                     drawn_clients: int | None = None) -> tuple[Path, Path]:
    """(prepared data, partition) for one preflight run: the partition is drawn with the real spec over the
    real number of samples (labels only), then each client keeps about one batch of its samples, and the data
    set holds just those samples, re-indexed, and ``test_rows`` test samples (an async server set is carved
    from them). With ``drawn_clients`` (more than the spec's clients: a heterogeneous group holding one client
    per architecture, ``built_clients``), the partition is drawn over that many and the first ones are kept (a
    pathological split of 100 classes needs its 20 clients to hold every class)."""
    from fedrepro.partition import make_partition, partition_stats, save_partition

    n, _, classes = data_shape(spec["dataset"])
    part = dict(spec["partition"])
    part.pop("samples", None)
    rng = np.random.default_rng(seed)
    labels = rng.permutation(np.arange(n) % classes)
    groups = None
    meta: dict[str, Any] = {"name": spec["dataset"]}
    if part["kind"] == "writer":  # writers of ~n / clients samples each, a few more writers than clients
        groups = np.arange(n) % (part["clients"] * 2)
    if part["kind"] == "domain":  # equal domains, one per client
        meta["domain_sizes_train"] = [n // part["clients"]] * part["clients"]
        labels = labels[: sum(meta["domain_sizes_train"])]
    held = part["clients"]
    if drawn_clients and drawn_clients > held:
        part["clients"] = drawn_clients
    parts = make_partition(labels, part, seed, meta, groups=groups)[:held]
    hetero = spec["federation"] == "hetero"
    # one local step each; hetero clients keep 75% of their samples for training and FedL2G a quiz set of up
    # to half of those, so they get three batches: 2.25 train, a full quiz batch and a full study batch (a
    # smaller one would under-measure the feedback pass's memory; one of a single sample would trip BatchNorm).
    # A fourth batch cost ~3 s of a ~13 s HtFE8 group, each of the 8 clients trained one step more
    keep = spec["training"]["batch_size"] * (HETERO_BATCHES if hetero else 1)
    kept = [p[:keep] for p in parts]
    rows = np.concatenate(kept)
    remap = np.full(len(labels), -1, dtype=np.int64)
    remap[rows] = np.arange(len(rows))
    small = [remap[p] for p in kept]
    data = workdir / f"{spec['dataset']}.npz"
    write_synthetic(data, spec["dataset"], len(rows), labels[rows], test_rows=test_rows,
                    groups=None if groups is None else groups[rows])
    partition = workdir / "partition.npz"
    save_partition(partition, small, partition_stats(small, labels[rows], classes), spec["partition"])
    return data, partition


def server_rows(batch: int, cut: bool) -> int:
    """Samples of an async server set, and half the test set, of a preflight run: ``SERVER_SAMPLES``, or with
    the batch cut two batches (a server pass costs a client step per batch, and every evaluation a forward per
    sample: a ViT at 224 on a CPU)."""
    return min(SERVER_SAMPLES, max(2, 2 * batch)) if cut else SERVER_SAMPLES


def preflight_spec(spec: dict, max_batch: int | None, max_clients: int | None = None) -> dict:
    """The run spec a preflight trains: two rounds, one local epoch, every round evaluated, a checkpoint,
    updates on time and server sets of two chunks; the batch cut to ``max_batch`` and the clients a round
    trains to ``max_clients`` if given (every client still exists, with its data and any per-client model)."""
    clients = built_clients(spec, max_clients)
    join = spec["training"]["join_ratio"]
    if max_clients and round(join * clients) > max_clients:
        join = max_clients / clients
    # every round evaluated: a run's metrics hold a row per evaluation, and the second round's training seconds
    # (warm_step_seconds) are the difference of two rows
    training = {**spec["training"], "rounds": PREFLIGHT_ROUNDS, "local_epochs": 1, "eval_every": 1,
                "checkpoint_every": PREFLIGHT_ROUNDS, "early_stop": 0, "join_ratio": join}
    if spec["training"].get("straggler_steps"):
        training["straggler_steps"] = [1, 2]
    if max_batch:
        training["batch_size"] = min(training["batch_size"], max_batch)
    per_round = max(1, round(join * clients))
    out = {**spec, "training": training, "study": "preflight", "hparams": one_pass(spec, per_round),
           "partition": {**spec["partition"], "clients": clients}}
    if "async" in spec:
        server = server_rows(training["batch_size"], cut=bool(max_batch))
        out["async"] = {**spec["async"], "delay_sigma": 0, "server_samples": server,
                        **({"ood_samples": server} if spec["async"].get("ood_dataset") else {})}
    return out


def heavy_clients(max_clients: int) -> int:
    """Clients trained a round, on a CPU preflight, in a group whose single sample exceeds the batch cut."""
    return max(2, max_clients // 2)


def built_clients(spec: dict, max_clients: int | None) -> int:
    """The clients a preflight run holds: every client, except in a heterogeneous group on a CPU preflight
    (``max_clients`` given), where it holds one of each architecture of the model group, or ``max_clients`` if
    more: the other clients differ only in their own model's parameters, whose bytes ``project`` adds by
    architecture (``unbuilt_client_bytes``). 100 HtFE8 clients took ~70 s a group, most of it building their
    models and writing their 6.7 GB checkpoint."""
    clients = spec["partition"]["clients"]
    if spec["federation"] != "hetero" or not max_clients:
        return clients
    from fedrepro.models.groups import group_members

    return min(clients, max(max_clients, len(group_members(spec["model"]))))  # one full cycle of i mod X


def unbuilt_client_bytes(spec: dict, m: dict) -> int:
    """The parameter bytes (float32) of the clients a heterogeneous preflight run did not hold (client i has
    architecture i mod X of its group; ``m``: the group's measurements, with ``member_params``)."""
    clients, built = spec["partition"]["clients"], m.get("built_clients", spec["partition"]["clients"])
    if built >= clients or not m.get("member_params"):
        return 0
    from fedrepro.models.groups import group_members

    members = group_members(spec["model"])
    return 4 * sum(m["member_params"][members[i % len(members)]] for i in range(built, clients))


def one_pass(spec: dict, per_round: int | None = None) -> dict:
    """The method's hyper-parameters with every count of server passes (``epochs``, ``*_epochs``: Center's 20,
    Feddle's 10 search and 10 head epochs, Fed+FT's, FedDF's, HFCL's, FedGH's) at most one: each further pass
    repeats the same tensors, so it adds no memory, and its time is counted by ``fedrepro.cost``'s model of the
    server passes, not measured here (a ViT's 10 server epochs took 69 of a group's 87 s on a CPU). A buffer of
    updates (FedBuff's, CA2FL's ``buffer_size``) holds at most ``per_round`` of them, the updates that arrive in
    a round, so its flush runs within the two rounds (FedBuff's 10 never filled from 4 clients a round)."""
    from fedrepro.federations import hyperparameters_of

    defaults = hyperparameters_of(spec["federation"], spec["algorithm"])
    hparams = dict(spec["hparams"])
    for name, default in defaults.items():
        value = hparams.get(name, default)
        if (name == "epochs" or name.endswith("_epochs")) and isinstance(value, int) and value > 1:
            hparams[name] = 1
        if name == "buffer_size" and per_round and value > per_round:
            hparams[name] = per_round
    return hparams


# ----- measuring one group in a process of its own
def saved_bytes_per_sample(model, shape: tuple[int, ...], text: bool) -> float:
    """Bytes autograd keeps for the backward pass per sample of one forward of ``model`` (what grows with the
    batch), measured at batch 2 with saved_tensors_hooks; the parameters it saves are not counted."""
    import torch

    seen: dict[int, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        seen[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
        return t

    x = torch.zeros(2, shape[0], dtype=torch.long) if text else torch.zeros(2, shape[2], shape[0], shape[1])
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        model(x).sum()
    ptrs = {p.untyped_storage().data_ptr() for p in model.parameters()}
    return sum(b for ptr, b in seen.items() if ptr not in ptrs) / 2


def model_facts(spec: dict, cache: Path | None = None) -> dict:
    """What the preflight needs of a setting's model, from one build of it: parameters and trained parameters
    (for a model group, of its largest member), forward+backward FLOPs per sample (a group's: the mean over its
    clients' architectures), autograd's saved bytes per sample, and whether it has BatchNorm. Kept in ``cache``
    (a folder shared by the groups of one preflight) by model, input and clients: 48 groups of paper.yaml share
    six HtFE8 builds, whose 8 architectures and FLOP count took ~8 s of each group's ~36 s."""
    import torch

    from fedrepro.cost import build_members, models_step_flops
    from fedrepro.models import TEXT_MODELS

    shape, classes = model_input(spec)
    group_of = spec["partition"]["clients"] if spec["federation"] == "hetero" else 0
    key = json.dumps([spec["model"], shape, classes, group_of])
    path = cache / f"{hashlib.sha256(key.encode()).hexdigest()[:20]}.json" if cache else None
    if path and path.exists():
        return json.loads(path.read_text())
    kwargs = {"vocab_size": 30_000} if len(shape) == 1 else {}
    models = build_members(spec["model"], shape, classes, bool(group_of), **kwargs)
    model = max(models.values(), key=lambda m: sum(p.numel() for p in m.parameters()))
    facts = {
        "params": sum(p.numel() for p in model.parameters()),
        # what travels and what a method keeps per client: the trained parameters (a LoRA ViT's frozen backbone
        # is in no vector, sim/flat.py)
        "trained": sum(p.numel() for p in model.parameters() if p.requires_grad),
        # per sample, from a batch of 2 (BatchNorm in train mode needs more than one)
        "flops_per_sample": models_step_flops(models, spec["model"], shape, 2, group_of) / 2,
        "act_per_sample": saved_bytes_per_sample(model, shape, spec["model"] in TEXT_MODELS),
        "batchnorm": any(isinstance(m, torch.nn.modules.batchnorm._BatchNorm) for m in model.modules()),
        # each architecture's trained parameters: what a client of it keeps (unbuilt_client_bytes)
        "member_params": {name: sum(p.numel() for p in m.parameters() if p.requires_grad)
                          for name, m in models.items()},
    }
    if path:
        atomic_write_json(path, facts)
    return facts


# the engines' model builders, as each module calls them (its own global): reuse_builds wraps them in a child
BUILDERS = (("fedrepro.hetero.engine", "build_arch"), ("fedrepro.train", "build_model"),
            ("fedrepro.asyncfl.job", "build_model"), ("fedrepro.finetune", "build_model"))


def memoised_build(builder: Any, folder: Path) -> Any:
    """``builder`` whose models are kept in ``folder`` by its arguments and the global RNG state it starts from:
    a later call with the same ones loads the model (unpickled, so no ``__init__`` and no random initialisation
    runs) and leaves the RNG where the build left it, so the engine draws the same numbers after it. A model
    that cannot be pickled (a LoRA ViT: torch's parametrizations refuse) is built every time."""
    import pickle

    import torch
    from torch.nn.utils.parametrize import is_parametrized

    def build(*args: Any, **kwargs: Any) -> Any:
        rng = torch.random.get_rng_state()
        call = pickle.dumps((builder.__module__, builder.__qualname__, args, sorted(kwargs.items())))
        path = folder / f"{hashlib.sha256(call + rng.numpy().tobytes()).hexdigest()[:24]}.pt"
        if path.exists():
            saved = torch.load(path, weights_only=False)
            torch.random.set_rng_state(saved["rng"])
            return saved["model"]
        model = builder(*args, **kwargs)
        # torch refuses to pickle parametrizations (LoRA), and only after writing much of the model: a failed
        # try would add to the measured peak memory, so none is made
        if any(is_parametrized(m) for m in model.modules()):
            return model
        unpicklable = path.with_suffix(".unpicklable")
        if not unpicklable.exists():
            try:
                atomic_write(path, lambda tmp: torch.save({"model": model, "rng": torch.random.get_rng_state()},
                                                          tmp))
            except (pickle.PicklingError, AttributeError, TypeError):  # a lambda or a local class inside
                unpicklable.touch()
        return model

    return build


def reuse_builds(folder: Path) -> None:
    """In a preflight's child: every engine builds its models through ``memoised_build`` on ``folder`` (shared
    by the groups of one preflight). 48 groups of paper.yaml build HtFE8's eight architectures from the same
    seeds, and their random initialisation was ~2 s of each group's ~12 s. The folder, in the preflight's
    temporary scratch (deleted at its end), holds every distinct build: for paper.yaml ~4.8 GB of FedL2G's
    members (their parameters counted) and a few hundred MB more."""
    folder.mkdir(parents=True, exist_ok=True)
    for module_name, name in BUILDERS:
        module = importlib.import_module(module_name)
        setattr(module, name, memoised_build(getattr(module, name), folder))


def state_bytes_per_client(spec: dict, params: int) -> int:
    """Bytes a method keeps per client between rounds (declared by the method class; 0 if it keeps none)."""
    from fedrepro.federations import methods_of

    method = methods_of(spec["federation"])[spec["algorithm"]](**spec["hparams"])
    declared = getattr(method, "state_bytes_per_client", None)
    return int(declared(params)) if callable(declared) else 0


def state_on_host(spec: dict) -> bool:
    """Whether a method keeps its per-client state in host memory (CA2FL's cache: ``host_state``)."""
    from fedrepro.federations import methods_of

    return bool(getattr(methods_of(spec["federation"])[spec["algorithm"]], "host_state", ()))


def run_group(group: Group, device: str, max_batch_flops: float, workdir: Path, max_clients: int | None = None,
              facts_cache: Path | None = None) -> dict:
    """Run one group's preflight in this process (a forked child) and return its measurements
    (``facts_cache``: ``model_facts``'s folder)."""
    import torch

    from fedrepro import pipeline
    from fedrepro.sim.checkpoint import job_footprint

    torch.set_num_threads(1)
    spec = group.spec
    real_batch = spec["training"]["batch_size"]
    facts = model_facts(spec, facts_cache)
    flops = facts["flops_per_sample"]
    # at least 2 where the model has BatchNorm (in train mode it refuses a batch of one where a feature map is
    # 1x1); a ViT's step at 224 on a CPU is ~5 s a sample, so it runs one
    floor = 2 if facts["batchnorm"] else 1
    batch = real_batch if math.isinf(max_batch_flops) else min(real_batch, max(floor, int(max_batch_flops // flops)))
    cut = batch < real_batch
    if max_clients and flops > max_batch_flops:
        # one sample over the cut (ViT-B/16 at 224: ~1 s a step on one CPU thread): half the clients a round, as
        # every client step and every server pass over an update (Feddle's cosines, FedDF's ensemble) costs that
        max_clients = heavy_clients(max_clients)
    run = preflight_spec(spec, batch if cut else None, max_clients)
    data, partition = synthetic_inputs(run, 0, workdir, 2 * server_rows(batch, cut), spec["partition"]["clients"])
    if run.get("async", {}).get("ood_dataset"):
        ood = run["async"]["ood_dataset"]
        labels = np.arange(run["async"]["ood_samples"]) % data_shape(ood)[2]
        write_synthetic(workdir / f"{ood}.npz", ood, len(labels), labels, test_rows=2)
    index = workdir / "runs" / "seeds.json"
    ckpt = workdir / "checkpoints"
    lines: list[str] = []
    cuda = device != "cpu" and torch.cuda.is_available()
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    t0 = time.perf_counter()
    pipeline.train(run, data, [partition], [0], index, ckpt, device, 1, lines.append,
                   keep_model=group.finetune is not None)
    train_s = time.perf_counter() - t0
    disk = job_footprint(ckpt, {0: index.parent / "seed0"})
    finetune_s = None
    if group.finetune is not None:
        # two steps, at the pre-training's cut batch where it was cut (FedGTST's 128 at 64x64 on a CPU)
        ft_batch = group.finetune["finetune"]["batch_size"]
        ft_batch = min(ft_batch, batch) if cut else ft_batch
        ft = {**group.finetune, "finetune": {**group.finetune["finetune"], "epochs": 1, "batch_size": ft_batch,
                                            "max_train_samples": 2 * ft_batch}}
        target = workdir / f"{ft['target']}.npz"
        n_t = 4 * ft["finetune"]["batch_size"]
        write_synthetic(target, ft["target"], n_t, np.arange(n_t) % data_shape(ft["target"])[2],
                        test_rows=server_rows(batch, cut))
        t1 = time.perf_counter()
        pipeline.finetune(ft, index, data, target, ckpt, workdir / "finetune" / "seeds.json", device, 1,
                          lines.append)
        finetune_s = time.perf_counter() - t1
    summary = json.loads((workdir / "runs" / "seed0" / "summary.json").read_text())
    return {
        "status": summary["status"], "batch": batch, "params": facts["params"], "flops_per_sample": flops,
        "built_clients": run["partition"]["clients"], "member_params": facts["member_params"],
        "peak_rss": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
        "peak_gpu": torch.cuda.max_memory_allocated() if cuda else None,
        "train_s": train_s, "finetune_s": finetune_s, "checkpoint_bytes": disk.checkpoint_bytes,
        "kept_bytes": disk.kept_bytes,
        "act_per_sample": facts["act_per_sample"],
        "trained": facts["trained"], "state_per_client": state_bytes_per_client(spec, facts["trained"]),
        "steps": preflight_steps(run),
        "step_s": warm_step_seconds(workdir / "runs" / "seed0" / "metrics.csv", round_steps(run)),
    }


def round_steps(run: dict) -> int:
    """Local steps in one round of the preflight run: each sampled client one batch (a hetero client the
    three of its four batches it trains on: ``synthetic_inputs``)."""
    per_client = HETERO_BATCHES * 3 // 4 if run["federation"] == "hetero" else 1
    return per_client * max(1, round(run["training"]["join_ratio"] * run["partition"]["clients"]))


def preflight_steps(run: dict) -> int:
    """Local steps the preflight run takes: ``round_steps`` a round (plus every client in an evaluation round
    with Feddle's true update)."""
    steps = PREFLIGHT_ROUNDS * round_steps(run)
    if run.get("async", {}).get("true_update"):
        steps += PREFLIGHT_ROUNDS * run["partition"]["clients"]
    return steps


def warm_step_seconds(metrics_csv: Path, steps: int) -> float | None:
    """Seconds per local step of the run's last round, from its metrics' cumulative training ``seconds`` (None
    with fewer than two rounds). The first round pays what a job pays once (CUDA's start, cuDNN's choice of
    kernels, ``engine: auto``'s probe) and the preflight's rounds are one batch per client, so the whole run's
    seconds over its steps would project that once-only cost onto every step of a paper-scale job (measured on an
    H100: 0.085 s per step of FedDisco's CIFAR-10 CNN that way, 0.002 s in a warm round)."""
    import csv

    with open(metrics_csv, newline="") as f:
        seconds = [float(r["seconds"]) for r in csv.DictReader(f)]
    if len(seconds) < 2:
        return None
    return (seconds[-1] - seconds[-2]) / steps


def step_seconds(m: dict) -> float:
    """A group's measured seconds per local step: its warm round's (``warm_step_seconds``); measurements kept from
    before that was measured (``--measurements``) have the whole run's seconds over its steps only."""
    if m.get("step_s") is not None:
        return m["step_s"]
    return m["train_s"] / max(m["steps"], 1)


def torch_cuda_available() -> bool:
    import torch

    return torch.cuda.is_available()


def _child(group: Group, device: str, max_batch_flops: float, max_clients: int | None, conn,
           scratch: Path | None = None) -> None:
    try:
        with tempfile.TemporaryDirectory(prefix="preflight-", dir=scratch) as tmp:
            if scratch:
                reuse_builds(scratch / "builds")
            conn.send({"ok": True, **run_group(group, device, max_batch_flops, Path(tmp), max_clients,
                                               scratch / "model-facts" if scratch else None)})
    except BaseException as e:  # noqa: BLE001 (every failure is a row of the table)
        tb = traceback.format_exc(limit=-3)
        conn.send({"ok": False, "error": f"{type(e).__name__}: {e}".splitlines()[0][:300], "traceback": tb})
    finally:
        conn.close()


def measure(group: Group, device: str, max_batch_flops: float, timeout: float, max_clients: int | None = None,
            scratch: Path | None = None) -> dict:
    """``run_group`` in a forked process (its own peak RSS; a crash or the OOM killer is a row, not the end),
    its files under ``scratch`` (a folder its model facts are shared in too; None: the system's temporary
    folder, nothing shared)."""
    ctx = mp.get_context("fork")
    recv, send = ctx.Pipe(duplex=False)
    proc = ctx.Process(target=_child, args=(group, device, max_batch_flops, max_clients, send, scratch))
    t0 = time.perf_counter()
    proc.start()
    send.close()
    got = recv.recv() if recv.poll(timeout) else None
    proc.join(5)
    if proc.is_alive():
        proc.kill()
    if got is None:
        return {"ok": False, "error": f"no result in {timeout:.0f} s (exit code {proc.exitcode}; killed for "
                                      f"memory if -9)"}
    return {**got, "wall_s": time.perf_counter() - t0}  # the group's whole preflight: where its minutes go


# ----- projection to the paper's numbers
def project(job: Job, m: dict, on_cpu: bool, gpu_mem_gb: float, gpu_tflops: float, step_floor_ms: float) -> dict:
    """Paper-scale memory, disk and hours of one job from its group's measurements ``m``, and what of its
    resources it would exceed.

    Device memory: the data set on the device at its real size (its peak while moving there), every client's
    kept state (in host memory instead where a method keeps it there), the model, the gradient, optimiser
    state and global copy of its trained parameters (3 x those), and the activations of the real batch; on CUDA the
    measured peak replaces the last two. Host memory: the measured peak plus the prepared uint8 arrays at
    their real size (twice: loaded, then copied for pooled or subset splits), plus the device's share when
    the job runs on the CPU. The models of the clients a heterogeneous run did not hold (``built_clients``) are
    added where the others were measured: GPU memory measured on CUDA, else host memory. Disk: the measured
    checkpoint plus the state of the clients the two preflight rounds did not reach and the models of those it
    did not hold; kept per finished job, the measured files of a finished seed times the seeds."""
    from fedrepro.cost import TEST_SIZES, run_steps, server_cost, server_passes
    from fedrepro.sim.tensors import device_data_bytes

    spec = job.spec
    n, raw, _ = data_shape(spec["dataset"])
    shape, _ = model_input(spec)
    n_test = TEST_SIZES.get(spec["dataset"], 10_000)
    peak = device_data_bytes(n, n_test, shape)[1] if len(shape) == 3 else (n + n_test) * (8 * shape[0] + 8)
    raw_bytes = (n + n_test) * math.prod(raw) * (1 if len(raw) == 3 else 4)
    state = m["state_per_client"] * spec["partition"]["clients"]
    batch = spec["training"]["batch_size"]
    measured_gpu = m["peak_gpu"] is not None
    host_state = state if state_on_host(spec) else 0
    if measured_gpu:
        device = m["peak_gpu"] + peak + state - host_state + max(0, batch - m["batch"]) * m["act_per_sample"]
    else:
        device = (peak + state - host_state + 4 * m["params"] + 12 * m["trained"]
                  + batch * m["act_per_sample"])
    unbuilt = unbuilt_client_bytes(spec, m)  # held where the built clients' models were: measured GPU or host
    device += unbuilt if measured_gpu else 0
    host = m["peak_rss"] + 2 * raw_bytes + host_state + (device if on_cpu else 0) + (0 if measured_gpu else unbuilt)
    steps = run_steps(spec) * job.seeds
    s_per_step = step_seconds(m)
    if measured_gpu or on_cpu:
        hours, basis = steps * s_per_step / 3600, "measured"
    else:  # a CPU preflight of a GPU job: cost.py's model of one GPU step (FLOPs at a sustained throughput)
        gpu_step = max(step_floor_ms / 1e3, m["flops_per_sample"] * batch / (gpu_tflops * 1e12))
        hours, basis = steps * gpu_step / 3600, "cost model"
    # the server's passes over its own data (Feddle's search, FedDF's distillation, ...): cost.py's model,
    # whatever device measured the clients (the preflight runs them on 64 samples, not the real sets)
    sample = {True: m["flops_per_sample"], False: m["flops_per_sample"] / 3}  # a backward costs ~2 forwards
    hours += server_cost(server_passes(spec), sample, gpu_tflops, step_floor_ms)[1] * job.seeds / 3600
    over, resources = [], job.resources
    if host > resources["mem_mb"] * MIB:
        over.append(f"host {host / MIB:,.0f} MB > mem_mb {resources['mem_mb']}")
    if not on_cpu and device > gpu_mem_gb * (1 << 30):
        over.append(f"GPU {device / (1 << 30):,.1f} GB > {gpu_mem_gb:g} GB")
    if hours * 60 > resources["runtime"]:
        over.append(f"{hours * 60:,.0f} min > runtime {resources['runtime']}")
    return {"host_mb": host / MIB, "device_mb": device / MIB, "hours": hours, "basis": basis,
            "checkpoint_mb": (m["checkpoint_bytes"] + state + unbuilt) / MIB, "data_mb": peak / MIB,
            "state_mb": state / MIB,
            "kept_mb": m["kept_bytes"] * job.seeds / MIB, "over": over}


def render(rows: list[tuple[Group, dict, list[dict]]], header: list[str]) -> str:
    """The preflight table as Markdown: one row per group, its paper-scale columns the largest over its jobs."""
    lines = [*header, "",
             "| # | jobs | first job | federation / method | model | input | clients | batch (ran) | ran | host MB "
             "(ran) | s/step | ckpt MB | state MB | data peak MB | host MB | GPU MB | h/job | kept MB/job | fits? |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for i, (g, m, ps) in enumerate(rows, 1):
        s = g.spec
        shape = "x".join(map(str, model_input(s)[0]))
        head = (f"| {i} | {len(g.jobs)} | {g.jobs[0].name} | {s['federation']} / {s['algorithm']} | {s['model']} | "
                f"{shape} | {s['partition']['clients']} | {s['training']['batch_size']} ")
        if not m["ok"]:
            lines.append(head + f"| - | **failed**: {m['error']} | | | | | | | | | | |")
            continue

        def top(k: str, ps: list[dict] = ps) -> float:
            return max(p[k] for p in ps)

        over = [f"{j.name}: {'; '.join(p['over'])}" for j, p in zip(g.jobs, ps, strict=True) if p["over"]]
        gpu_basis = "measured" if m["peak_gpu"] is not None else "est."
        lines.append(head + f"({m['batch']}) | {m['status']} | {m['peak_rss'] / MIB:,.0f} | "
                     f"{step_seconds(m):.4f} | {top('checkpoint_mb'):,.1f} | "
                     f"{top('state_mb'):,.0f} | "
                     f"{top('data_mb'):,.0f} | {top('host_mb'):,.0f} | {top('device_mb'):,.0f} ({gpu_basis}) | "
                     f"{top('hours'):.2f} ({ps[0]['basis']}) | {top('kept_mb'):,.1f} | "
                     f"{'<br>'.join(over) or 'fits'} |")
    return "\n".join(lines) + "\n"


HEADROOM = 1.25  # resources asked for: the projection plus a quarter (estimates, allocator slack, slow nodes)


def suggest_resources(rows: list[tuple[Group, dict, list[dict]]]) -> str:
    """For each study method with a job over its resources, the `resources:` to give that method in its study
    file: the largest projection over its jobs plus HEADROOM, runtime in whole hours, memory in GB."""
    need: dict[tuple[str, str], dict[str, int]] = {}
    for g, _, ps in rows:
        for job, p in zip(g.jobs, ps, strict=False):
            if not p["over"]:
                continue
            study, _, method = job.name.split("/")
            want = need.setdefault((study, method), {})
            if p["hours"] * 60 > job.resources["runtime"]:
                want["runtime"] = max(want.get("runtime", 0), 60 * math.ceil(p["hours"] * HEADROOM))
            if p["host_mb"] > job.resources["mem_mb"]:
                want["mem_mb"] = max(want.get("mem_mb", 0), 1000 * math.ceil(p["host_mb"] * HEADROOM / 1000))
    if not need:
        return ""
    lines = ["", "Resources that would fit (`resources:` of the method in its study file; projection + "
             f"{HEADROOM - 1:.0%}):", ""]
    for (study, method), want in sorted(need.items()):
        values = ", ".join(f"{k}: {v}" for k, v in sorted(want.items()))
        lines.append(f"- {study}: `{method}: {{resources: {{{values}}}}}`")
    return "\n".join(lines) + "\n"


def data_set_problems(config: dict) -> tuple[list[str], list[str]]:
    """(the data sets a config reads, what is wrong with their downloads as declared), checked without the
    network: raw files named, each pinned by an md5 or sha256, http(s) addresses."""
    from fedrepro.data.registry import data_sets_read, download_problems

    names = sorted(set().union(*(data_sets_read(study) for study in config["studies"].values())))
    return names, [p for name in names for p in download_problems(name)]


def data_set_section(names: list[str], problems: list[str]) -> str:
    """data_set_problems as a Markdown section of the preflight's report."""
    lines = ["", f"Data sets read ({len(names)}): {', '.join(names)}.",
             "Their downloads as declared (raw files named, each pinned by an md5 or sha256, http(s) addresses): "
             + ("every one in order." if not problems else f"{len(problems)} problem(s):"),
             *(f"- {p}" for p in problems)]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--configfile", nargs="+", default=[str(REPO / "config" / "paper.yaml")])
    parser.add_argument("--sample", type=int, default=0, help="run only this many groups (every engine and model "
                        "family first); 0: all")
    parser.add_argument("--device", default=None, help="cpu, cuda or auto (default: the config's device)")
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 1, help="groups measured at once (one "
                        "thread each; default: every core)")
    parser.add_argument("--max-batch-flops", type=float, default=None,
                        help="cut a step's batch to about this many forward FLOPs, its activations then projected "
                        "(default: 2e9 on a CPU, no cut on CUDA, where the real batch's peak is measured)")
    parser.add_argument("--max-clients", type=int, default=None,
                        help="train at most this many clients a round, the state of every client still projected "
                        "(default: 4 on a CPU, all on CUDA, where clients side by side are measured)")
    parser.add_argument("--timeout", type=float, default=600, help="seconds one group may take")
    parser.add_argument("--gpu-mem-gb", type=float, default=40.0, help="memory of the cluster's GPUs")
    parser.add_argument("--gpu-tflops", type=float, default=60.0)
    parser.add_argument("--step-floor-ms", type=float, default=1.5)
    parser.add_argument("--out", default=None, help="also write the table here (Markdown)")
    parser.add_argument("--measurements", default=None, help="a JSON file of measurements by group: groups found "
                        "there are not run again, and every new one is added (projections change without a rerun)")
    parser.add_argument("--project-only", action="store_true", help="with --measurements: the table of the groups "
                        "measured there, running none")
    args = parser.parse_args(argv)
    config = resolve_config(merge_configfiles(*args.configfile), source=" ".join(args.configfile))
    device = args.device or config["device"]
    cuda = device == "cuda" or (device == "auto" and torch_cuda_available())
    max_batch_flops = args.max_batch_flops or (float("inf") if cuda else 2e9)
    max_clients = args.max_clients or (None if cuda else 4)
    groups = job_groups(config)
    chosen = sample_groups(groups, args.sample) if args.sample else groups
    resources = config["train_resources"]
    on_cpu = device == "cpu"
    header = [f"# Preflight of {' '.join(args.configfile)}", "",
              f"{sum(len(g.jobs) for g in groups)} train jobs in {len(groups)} groups of one shape; {len(chosen)} "
              f"run here on {device} ({args.jobs} at once, one thread each), {PREFLIGHT_ROUNDS} rounds each, on "
              f"synthetic data of the real shapes, classes and client counts (one batch per client), every "
              f"update on time, one epoch of each server pass, server sets of {SERVER_SAMPLES} (two batches where "
              f"cut); batches cut to "
              f"{max_batch_flops:.3g} forward FLOPs and {max_clients or 'all'} clients trained a round"
              f"{f' ({heavy_clients(max_clients)} where one sample exceeds the cut)' if max_clients else ''}"
              f"{', a heterogeneous group holding one client per architecture' if max_clients else ''}. "
              f"train_resources: {resources} (studies may override mem_mb and runtime per setting or method); "
              f"GPUs of "
              f"{args.gpu_mem_gb:g} GB.",
              "host/GPU MB and h/job are projected to the paper's data sizes, batches, clients and steps (see "
              "`fedrepro.preflight`'s docstring); 'est.' and 'cost model' mark numbers not measured on a GPU."]
    import torch  # noqa: F401 (imported once here, before the forks: each child would pay seconds for it)

    import fedrepro.pipeline  # noqa: F401

    for module_name, _ in BUILDERS:  # the engines too (~0.13 s a child otherwise)
        importlib.import_module(module_name)

    t0 = time.perf_counter()
    saved = Path(args.measurements) if args.measurements else None
    known = json.loads(saved.read_text()) if saved and saved.exists() else {}
    results: dict[int, dict] = {i: known[g.key] for i, g in enumerate(chosen) if g.key in known}
    if args.project_only:
        chosen = [g for g in chosen if g.key in known]
        results = {i: known[g.key] for i, g in enumerate(chosen)}
    pending = [(i, g) for i, g in enumerate(chosen) if i not in results]
    with tempfile.TemporaryDirectory(prefix="preflight-") as scratch, \
            ThreadPoolExecutor(max_workers=max(1, args.jobs)) as pool:
        futures = {pool.submit(measure, g, device, max_batch_flops, args.timeout, max_clients, Path(scratch)): i
                   for i, g in pending}
        for done, fut in enumerate(as_completed(futures), 1):
            i = futures[fut]
            results[i] = fut.result()
            if saved and results[i]["ok"]:
                known[chosen[i].key] = results[i]
                atomic_write_json(saved, known)
            state = "ok" if results[i]["ok"] else f"FAILED: {results[i]['error']}"
            took = f"{results[i]['wall_s']:.0f} s, " if "wall_s" in results[i] else ""
            print(f"[{done}/{len(chosen)}] {chosen[i].jobs[0].name} (+{len(chosen[i].jobs) - 1}): {state} "
                  f"({took}{time.perf_counter() - t0:.0f} s in all)", flush=True)
    rows = []
    for i, g in enumerate(chosen):
        m = results[i]
        ps = ([project(j, m, on_cpu, args.gpu_mem_gb, args.gpu_tflops, args.step_floor_ms)
               for j in g.jobs] if m["ok"] else [])
        rows.append((g, m, ps))
    table = render(rows, header)
    failed = [g.jobs[0].name for g, m, _ in rows if not m["ok"]]
    over = [j.name for g, _, ps in rows for j, p in zip(g.jobs, ps, strict=False) if p["over"]]
    disk = sum(p["kept_mb"] for _, _, ps in rows for p in ps)
    kept_checkpoints = sum(p["checkpoint_mb"] * j.seeds for g, _, ps in rows for j, p in zip(g.jobs, ps, strict=False))
    with_checkpoints = (disk + kept_checkpoints) / 1024
    peak_disk = max((p["checkpoint_mb"] for _, _, ps in rows for p in ps), default=0)
    ran = f"{len(rows) - len(failed)} of {len(rows)} groups ran{': failed ' + ', '.join(failed) if failed else ''}"
    table += (f"\n{ran}; {len(over)} jobs would exceed their resources.\n\nDisk: {disk / 1024:,.1f} GB kept by the "
              f"{sum(len(g.jobs) for g, _, _ in rows)} jobs of these groups when finished ({with_checkpoints:,.1f} "
              f"GB with `keep_checkpoints: true`, every seed's last checkpoint kept); the largest "
              f"checkpoint while running {peak_disk:,.0f} MB. Wall time {time.perf_counter() - t0:.0f} s.\n")
    table += suggest_resources(rows)
    names, data_problems = data_set_problems(config)
    table += data_set_section(names, data_problems)
    print(table)
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(table)
    return 1 if failed or over or data_problems else 0


if __name__ == "__main__":
    raise SystemExit(main())
