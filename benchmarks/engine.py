"""Engine speed against the plain-PyTorch floor, in one process on the same data and SGD steps.

    python benchmarks/engine.py                        # the default's FedDisco (Fashion-MNIST's shape, Dir 0.5)
    python benchmarks/engine.py --preset digits        # the same CNN on the 1,347 training digits, batch 16
    python benchmarks/engine.py --preset peers         # issue #4's setting (4-layer CNN, Dir 0.1, 20 clients)
    python benchmarks/engine.py --preset peers --clients 10 20 50 100 --rounds 5
    python benchmarks/engine.py --preset feddisco-cifar10 --device cuda   # on a GPU: the paper-scale shapes
    python benchmarks/engine.py --preset feddle-cnn --device cuda

The two paper-scale presets train on made-up images of the paper's shape (CIFAR-10's 50,000 at 32x32x3; the
engines' speed does not depend on the pixels): FedDisco's simple CNN with its 10 clients, batch 64, and Feddle's
CNN with 500 clients, 10 sampled a round, batch 32 (its engine is asynchronous, but each arrival trains one
client as the sequential engine does, so this says which engine its clients' steps would prefer). Besides the
two engines, the "auto" row is what ``engine: {mode: auto}`` chose on the device (sim/engine_choice.py), and its
seconds include that choice's probe.

"plain loop" is one model trained with torch.optim.SGD on batches sliced from in-memory tensors (PyTorch's
default NCHW layout), with exactly the per-client batch sizes the federated run takes and no evaluation:
the floor any federated simulator pays for the same SGD work. fedrepro's rows include an evaluation on
the test set every round. Ratios are seconds / plain-loop seconds: < 1.0 is faster than that floor.
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np
import torch
import torch.nn.functional as F

from fedrepro import seeding
from fedrepro.algorithms import build_algorithm
from fedrepro.data.registry import DATASETS
from fedrepro.models import build_model
from fedrepro.partition import make_partition
from fedrepro.sim.sync import FederatedRun, TrainingConfig
from fedrepro.sim.tensors import to_device_data

PRESETS = {
    "digits": dict(model="simple_cnn", clients=10, beta=0.5, batch_size=16, lr=0.01, momentum=0.9,
                   local_epochs=2, rounds=12),
    # the default's FedDisco on Fashion-MNIST (config/config.yaml): 30,000 images at 28x28, batch 64, 2 epochs
    "embedded": dict(model="simple_cnn", clients=10, beta=0.5, batch_size=64, lr=0.01, momentum=0.9,
                     local_epochs=2, rounds=2, eval_every=2, images=(30_000, 28, 28, 1)),
    "peers": dict(model="cnn4", clients=20, beta=0.1, batch_size=10, lr=0.01, momentum=0.0,
                  local_epochs=1, rounds=20),
    # paper scale, on made-up images of the paper's shape; one local epoch (FedDisco's are 10) keeps a run short,
    # and one evaluation at the end keeps the time the engines'
    "feddisco-cifar10": dict(model="simple_cnn", clients=10, beta=0.5, batch_size=64, lr=0.01, momentum=0.9,
                             local_epochs=1, rounds=3, eval_every=3, images=(50_000, 32, 32, 3)),
    "feddle-cnn": dict(model="cnn3", clients=500, beta=0.1, batch_size=32, lr=0.01, momentum=0.9,
                       local_epochs=2, rounds=20, eval_every=20, join_ratio=0.02, images=(50_000, 32, 32, 3)),
}


class Digits:  # the embedded digits arrays, shaped like fedrepro.data.format.Prepared
    def __init__(self) -> None:
        self.x_train, self.y_train, self.x_test, self.y_test, self.meta = DATASETS["digits"].prepare(None)


class MadeUpImages:  # random uint8 images and labels of a paper's shape, like fedrepro.data.format.Prepared
    def __init__(self, n: int, height: int, width: int, channels: int, classes: int = 10) -> None:
        rng = np.random.default_rng(0)
        shape = (height, width, channels)
        self.x_train = rng.integers(0, 256, (n, *shape), dtype=np.uint8)
        self.y_train = rng.integers(0, classes, n)
        self.x_test = rng.integers(0, 256, (n // 5, *shape), dtype=np.uint8)
        self.y_test = rng.integers(0, classes, n // 5)
        self.meta = {"name": "made-up", "num_classes": classes, "shape": list(shape)}


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def federated(data, parts, p: dict, seed: int, engine: str) -> tuple[float, dict | None]:
    """Seconds of one federated run (and the engine it used: ``auto``'s choice, measured on CUDA)."""
    cfg = TrainingConfig(rounds=p["rounds"], local_epochs=p["local_epochs"], batch_size=p["batch_size"],
                         lr=p["lr"], momentum=p["momentum"], eval_every=p.get("eval_every", 1),
                         join_ratio=p.get("join_ratio", 1.0))
    torch.manual_seed(seeding.derive_seed(seed, seeding.INIT))
    device = data.x_train.device
    model = build_model(p["model"], data.shape, data.num_classes).to(device)
    run = FederatedRun(model, build_algorithm("fedavg"), data, parts, cfg, {"kind": "size"}, seed,
                       log=lambda m: None, engine=engine, side_by_side=128)
    _sync(device)
    t0 = time.perf_counter()
    result = run.run()
    _sync(device)
    return time.perf_counter() - t0, result.engine


def batch_sizes(parts, p: dict) -> list[int]:
    """The batches of every round, each with the clients' mean share when only some are sampled a round."""
    sizes = []
    for n in (len(idx) for idx in parts):
        full, rest = divmod(n, p["batch_size"])
        sizes += ([p["batch_size"]] * full + ([rest] if rest else [])) * p["local_epochs"]
    per_round = max(1, round(p.get("join_ratio", 1.0) * len(parts)))
    return sizes[: len(sizes) * per_round // len(parts)] * p["rounds"]


def plain_loop(x: torch.Tensor, y: torch.Tensor, sizes: list[int], p: dict, seed: int, channels_last: bool) -> float:
    torch.manual_seed(seed)
    model = build_model(p["model"], (x.shape[2], x.shape[3], x.shape[1]), 10).to(x.device)
    if channels_last:
        model, x = model.to(memory_format=torch.channels_last), x.contiguous(memory_format=torch.channels_last)
    else:
        x = x.contiguous()
    opt = torch.optim.SGD(model.parameters(), lr=p["lr"], momentum=p["momentum"])
    n = len(y)
    gen = torch.Generator().manual_seed(seed)
    order, pos = torch.randperm(n, generator=gen).to(x.device), 0
    _sync(x.device)
    t0 = time.perf_counter()
    for b in sizes:
        if pos + b > n:
            order, pos = torch.randperm(n, generator=gen).to(x.device), 0
        idx = order[pos : pos + b]
        pos += b
        opt.zero_grad()
        F.cross_entropy(model(x[idx]), y[idx]).backward()
        opt.step()
    _sync(x.device)
    return time.perf_counter() - t0


def partition(labels, p: dict) -> tuple[list, float]:
    """Dirichlet(beta) over the clients; 1347 digits cannot give 100 clients a sample each at beta 0.1, so a
    sweep raises beta until every client has one (the printed beta says which)."""
    beta = p["beta"]
    while True:
        try:
            spec = {"kind": "dirichlet", "clients": p["clients"], "beta": beta, "min_size": 1}
            return make_partition(labels, spec, seed=0), beta
        except ValueError:
            beta *= 2


def measure(data, p: dict, repeats: int) -> dict[str, float]:
    parts, beta = partition(data.y_train.cpu().numpy(), p)
    sizes = batch_sizes(parts, p)
    engines = ("sequential", "vectorized", "auto") if data.x_train.device.type == "cuda" else ("sequential",
                                                                                                "vectorized")
    times: dict[str, list[float]] = {k: [] for k in ("plain", "plain_cl", *engines)}
    chosen = None
    for r in range(repeats):  # interleaved, so drift in machine load hits every row alike
        times["plain"].append(plain_loop(data.x_train, data.y_train, sizes, p, r, channels_last=False))
        times["plain_cl"].append(plain_loop(data.x_train, data.y_train, sizes, p, r, channels_last=True))
        for engine in engines:
            seconds, used = federated(data, parts, p, r, engine)
            times[engine].append(seconds)
            chosen = used if engine == "auto" else chosen
    out = {k: statistics.median(v) for k, v in times.items()}
    out["steps"], out["beta"], out["auto_choice"] = len(sizes), beta, chosen
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--preset", choices=sorted(PRESETS), default="embedded")
    parser.add_argument("--clients", type=int, nargs="*", help="client counts to sweep (default: the preset's)")
    parser.add_argument("--rounds", type=int, help="override the preset's rounds")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--device", default="cpu", help="cpu or cuda")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    p = dict(PRESETS[args.preset])
    if args.rounds:
        p["rounds"] = args.rounds
    device = torch.device(args.device)
    data = to_device_data(MadeUpImages(*p.pop("images")) if "images" in p else Digits(), device)
    where = torch.cuda.get_device_name(device) if device.type == "cuda" else f"cpu, {args.threads} thread(s)"
    print(f"preset {args.preset}: {p}; {where}; torch {torch.__version__}; "
          f"median of {args.repeats}; ratio = seconds / plain loop (NCHW)")
    print(f"{'clients':>7s} {'beta':>4s} {'steps':>6s} | {'plain':>7s} {'plain-cl':>8s} | "
          f"{'sequential':>10s} {'ratio':>5s} | {'vectorized':>10s} {'ratio':>5s} | "
          f"{'auto':>7s} {'ratio':>5s} | steps/s seq")
    for k in args.clients or [p["clients"]]:
        t = measure(data, {**p, "clients": k}, args.repeats)
        base = t["plain"]
        auto = f"{t['auto']:7.2f} {t['auto'] / base:5.2f}" if "auto" in t else f"{'-':>7s} {'-':>5s}"
        print(f"{k:7d} {t['beta']:4.1f} {t['steps']:6d} | {base:7.2f} {t['plain_cl']:8.2f} | {t['sequential']:10.2f} "
              f"{t['sequential'] / base:5.2f} | {t['vectorized']:10.2f} {t['vectorized'] / base:5.2f} | {auto} | "
              f"{t['steps'] / t['sequential']:.0f}")
        if t["auto_choice"]:
            print(f"        auto chose: {t['auto_choice']}")


if __name__ == "__main__":
    main()
