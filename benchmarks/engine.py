"""Engine speed against the plain-PyTorch floor, in one process on the same data and SGD steps.

    python benchmarks/engine.py                  # the embedded FedDisco setting (simple CNN, Dir 0.5)
    python benchmarks/engine.py --preset peers   # issue #4's setting (4-layer CNN, Dir 0.1, 20 clients)

"plain loop" is one model trained with torch.optim.SGD on batches sliced from in-memory tensors, with
exactly the per-client batch sizes the federated run takes and no evaluation: the floor any federated
simulator pays for the same SGD work. Ratios < 1.0 mean faster than that floor.
"""

from __future__ import annotations

import argparse
import math
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
    "embedded": dict(model="simple_cnn", clients=10, beta=0.5, batch_size=32, lr=0.01, momentum=0.9,
                     local_epochs=2, rounds=20),
    "peers": dict(model="cnn4", clients=20, beta=0.1, batch_size=10, lr=0.01, momentum=0.0,
                  local_epochs=1, rounds=20),
}


class Prepared:  # the digits arrays in the shape fedrepro.data.format.Prepared has
    def __init__(self) -> None:
        x_train, y_train, x_test, y_test, meta = DATASETS["digits"].prepare(None)
        self.x_train, self.y_train, self.x_test, self.y_test, self.meta = x_train, y_train, x_test, y_test, meta


def federated(data, parts, p: dict, seed: int) -> tuple[float, int]:
    cfg = TrainingConfig(rounds=p["rounds"], local_epochs=p["local_epochs"], batch_size=p["batch_size"],
                         lr=p["lr"], momentum=p["momentum"], eval_every=1)
    torch.manual_seed(seeding.derive_seed(seed, seeding.INIT))
    model = build_model(p["model"], data.shape, data.num_classes)
    run = FederatedRun(model, build_algorithm("fedavg"), data, parts, cfg, {"kind": "size"}, seed,
                       log=lambda m: None)
    t0 = time.perf_counter()
    run.run()
    return time.perf_counter() - t0, 0


def batch_sizes(parts, p: dict) -> list[int]:
    sizes = []
    for n in (len(idx) for idx in parts):
        full, rest = divmod(n, p["batch_size"])
        sizes += ([p["batch_size"]] * full + ([rest] if rest else [])) * p["local_epochs"]
    return sizes * p["rounds"]


def plain_loop(data, sizes: list[int], p: dict, seed: int) -> float:
    torch.manual_seed(seed)
    model = build_model(p["model"], data.shape, data.num_classes)
    opt = torch.optim.SGD(model.parameters(), lr=p["lr"], momentum=p["momentum"])
    n = len(data.y_train)
    gen = torch.Generator().manual_seed(seed)
    order = torch.randperm(n, generator=gen)
    t0 = time.perf_counter()
    pos = 0
    for b in sizes:
        if pos + b > n:
            order, pos = torch.randperm(n, generator=gen), 0
        idx = order[pos : pos + b]
        pos += b
        opt.zero_grad()
        F.cross_entropy(model(data.x_train[idx]), data.y_train[idx]).backward()
        opt.step()
    return time.perf_counter() - t0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--preset", choices=sorted(PRESETS), default="embedded")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    p = PRESETS[args.preset]
    data = to_device_data(Prepared(), torch.device("cpu"))
    labels = data.y_train.numpy()
    parts = make_partition(labels, {"kind": "dirichlet", "clients": p["clients"], "beta": p["beta"],
                                    "min_size": 2}, seed=0)
    sizes = batch_sizes(parts, p)
    steps = len(sizes)
    ours, plain = [], []
    for r in range(args.repeats):  # interleaved, so drift in machine load hits both alike
        ours.append(federated(data, parts, p, seed=r)[0])
        plain.append(plain_loop(data, sizes, p, seed=r))
    t_ours, t_plain = statistics.median(ours), statistics.median(plain)
    print(f"preset {args.preset}: {p}")
    print(f"{p['clients']} clients, {steps} client SGD steps over {p['rounds']} rounds, threads {args.threads}, "
          f"torch {torch.__version__}, median of {args.repeats}")
    print(f"{'':28s} {'seconds':>8s} {'steps/s':>9s} {'ratio':>6s}")
    print(f"{'plain PyTorch loop':28s} {t_plain:8.2f} {steps / t_plain:9.0f} {1.0:6.2f}")
    print(f"{'fedrepro FedAvg (+eval/rnd)':28s} {t_ours:8.2f} {steps / t_ours:9.0f} {t_ours / t_plain:6.2f}")
    assert math.isfinite(t_ours)


if __name__ == "__main__":
    np.set_printoptions(precision=3)
    main()
