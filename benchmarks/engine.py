"""Engine speed against the plain-PyTorch floor, in one process on the same data and SGD steps.

    python benchmarks/engine.py                        # the embedded FedDisco setting (simple CNN, Dir 0.5)
    python benchmarks/engine.py --preset peers         # issue #4's setting (4-layer CNN, Dir 0.1, 20 clients)
    python benchmarks/engine.py --preset peers --clients 10 20 50 100 --rounds 5

"plain loop" is one model trained with torch.optim.SGD on batches sliced from in-memory tensors (PyTorch's
default NCHW layout), with exactly the per-client batch sizes the federated run takes and no evaluation:
the floor any federated simulator pays for the same SGD work. fedrepro's rows include an evaluation on
the test set every round. Ratios are seconds / plain-loop seconds: < 1.0 is faster than that floor.
"""

from __future__ import annotations

import argparse
import statistics
import time

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
    "embedded": dict(model="simple_cnn", clients=10, beta=0.5, batch_size=16, lr=0.01, momentum=0.9,
                     local_epochs=2, rounds=12),
    "peers": dict(model="cnn4", clients=20, beta=0.1, batch_size=10, lr=0.01, momentum=0.0,
                  local_epochs=1, rounds=20),
}


class Digits:  # the embedded digits arrays, shaped like fedrepro.data.format.Prepared
    def __init__(self) -> None:
        self.x_train, self.y_train, self.x_test, self.y_test, self.meta = DATASETS["digits"].prepare(None)


def federated(data, parts, p: dict, seed: int, engine: str) -> float:
    cfg = TrainingConfig(rounds=p["rounds"], local_epochs=p["local_epochs"], batch_size=p["batch_size"],
                         lr=p["lr"], momentum=p["momentum"], eval_every=1)
    torch.manual_seed(seeding.derive_seed(seed, seeding.INIT))
    model = build_model(p["model"], data.shape, data.num_classes)
    run = FederatedRun(model, build_algorithm("fedavg"), data, parts, cfg, {"kind": "size"}, seed,
                       log=lambda m: None, engine=engine, side_by_side=128)
    t0 = time.perf_counter()
    run.run()
    return time.perf_counter() - t0


def batch_sizes(parts, p: dict) -> list[int]:
    sizes = []
    for n in (len(idx) for idx in parts):
        full, rest = divmod(n, p["batch_size"])
        sizes += ([p["batch_size"]] * full + ([rest] if rest else [])) * p["local_epochs"]
    return sizes * p["rounds"]


def plain_loop(x: torch.Tensor, y: torch.Tensor, sizes: list[int], p: dict, seed: int, channels_last: bool) -> float:
    torch.manual_seed(seed)
    model = build_model(p["model"], (x.shape[2], x.shape[3], x.shape[1]), 10)
    if channels_last:
        model, x = model.to(memory_format=torch.channels_last), x.contiguous(memory_format=torch.channels_last)
    else:
        x = x.contiguous()
    opt = torch.optim.SGD(model.parameters(), lr=p["lr"], momentum=p["momentum"])
    n = len(y)
    gen = torch.Generator().manual_seed(seed)
    order, pos = torch.randperm(n, generator=gen), 0
    t0 = time.perf_counter()
    for b in sizes:
        if pos + b > n:
            order, pos = torch.randperm(n, generator=gen), 0
        idx = order[pos : pos + b]
        pos += b
        opt.zero_grad()
        F.cross_entropy(model(x[idx]), y[idx]).backward()
        opt.step()
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
    parts, beta = partition(data.y_train.numpy(), p)
    sizes = batch_sizes(parts, p)
    times: dict[str, list[float]] = {k: [] for k in ("plain", "plain_cl", "sequential", "vectorized")}
    for r in range(repeats):  # interleaved, so drift in machine load hits every row alike
        times["plain"].append(plain_loop(data.x_train, data.y_train, sizes, p, r, channels_last=False))
        times["plain_cl"].append(plain_loop(data.x_train, data.y_train, sizes, p, r, channels_last=True))
        times["sequential"].append(federated(data, parts, p, r, "sequential"))
        times["vectorized"].append(federated(data, parts, p, r, "vectorized"))
    out = {k: statistics.median(v) for k, v in times.items()}
    out["steps"], out["beta"] = len(sizes), beta
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--preset", choices=sorted(PRESETS), default="embedded")
    parser.add_argument("--clients", type=int, nargs="*", help="client counts to sweep (default: the preset's)")
    parser.add_argument("--rounds", type=int, help="override the preset's rounds")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    p = dict(PRESETS[args.preset])
    if args.rounds:
        p["rounds"] = args.rounds
    data = to_device_data(Digits(), torch.device("cpu"))
    print(f"preset {args.preset}: {p}; threads {args.threads}; torch {torch.__version__}; "
          f"median of {args.repeats}; ratio = seconds / plain loop (NCHW)")
    print(f"{'clients':>7s} {'beta':>4s} {'steps':>6s} | {'plain':>7s} {'plain-cl':>8s} | "
          f"{'sequential':>10s} {'ratio':>5s} | {'vectorized':>10s} {'ratio':>5s} | steps/s seq")
    for k in args.clients or [p["clients"]]:
        t = measure(data, {**p, "clients": k}, args.repeats)
        base = t["plain"]
        print(f"{k:7d} {t['beta']:4.1f} {t['steps']:6d} | {base:7.2f} {t['plain_cl']:8.2f} | {t['sequential']:10.2f} "
              f"{t['sequential'] / base:5.2f} | {t['vectorized']:10.2f} {t['vectorized'] / base:5.2f} | "
              f"{t['steps'] / t['sequential']:.0f}")


if __name__ == "__main__":
    main()
