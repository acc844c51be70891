"""MOON's frozen features (z_glob, z_prev) looked up per sample against recomputed in every batch, FedAvg beside.

    python benchmarks/moon_features.py               # laptop-full's FedDisco: 6,000 of 60,000 28x28 images, 2 epochs
    python benchmarks/moon_features.py --epochs 10   # the paper's 10 local epochs

The global and previous vectors stay fixed while a client trains, so the sequential engine computes each
sample's features of them in its first local epoch and looks them up in the later ones
(fedrepro.algorithms.moon.FrozenFeatures). Rows: FedAvg (no extra passes), MOON recomputing them in every
batch (as before, and as for a body with BatchNorm or dropout), MOON looking them up. Made-up images of
Fashion-MNIST's shape and count (the speed does not depend on the pixels), --samples of them partitioned as
laptop-full's FedDisco partitions its 6,000 (spread over the whole index range), the simple CNN, 10 clients
(Dirichlet 0.5), batch 64, short last batch dropped, one evaluation per run; median of --repeats, interleaved.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

from fedrepro import seeding
from fedrepro.algorithms import build_algorithm
from fedrepro.models import build_model
from fedrepro.partition import make_partition
from fedrepro.sim.sync import FederatedRun, TrainingConfig
from fedrepro.sim.tensors import to_device_data

sys.path.insert(0, str(Path(__file__).parent))
from engine import MadeUpImages  # noqa: E402  (benchmarks/ is not a package)


def seconds(data, parts, cfg: TrainingConfig, method: str, look_up: bool, seed: int) -> float:
    torch.manual_seed(seeding.derive_seed(seed, seeding.INIT))
    model = build_model("simple_cnn", data.shape, data.num_classes)
    alg = build_algorithm(method, **({"mu": 0.1} if method == "moon" else {}))
    run = FederatedRun(model, alg, data, parts, cfg, {"kind": "size"}, seed, log=lambda m: None,
                       engine="sequential")
    if method == "moon" and not look_up:
        alg.body_per_sample = False  # what a body with BatchNorm or dropout gets: recomputed in every batch
    t0 = time.perf_counter()
    run.run()
    return time.perf_counter() - t0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--images", type=int, default=60_000)
    parser.add_argument("--samples", type=int, default=6000)
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    torch.set_num_threads(1)
    data = to_device_data(MadeUpImages(args.images, 28, 28, 1), torch.device("cpu"))
    spec = {"kind": "dirichlet", "clients": 10, "beta": 0.5, "min_size": 1, "samples": args.samples}
    parts = make_partition(data.y_train.numpy(), spec, seed=0)
    cfg = TrainingConfig(rounds=args.rounds, local_epochs=args.epochs, batch_size=64, lr=0.01, momentum=0.9,
                         drop_last=True, eval_every=args.rounds)
    rows = {"fedavg": ("fedavg", True), "moon, recomputed": ("moon", False), "moon, looked up": ("moon", True)}
    times: dict[str, list[float]] = {name: [] for name in rows}
    for r in range(args.repeats):  # interleaved, so drift in machine load hits every row alike
        for name, (method, look_up) in rows.items():
            times[name].append(seconds(data, parts, cfg, method, look_up, r))
    med = {name: statistics.median(t) for name, t in times.items()}
    print(f"{args.samples} of {args.images} images, {args.epochs} local epochs, {args.rounds} rounds; cpu, 1 thread; "
          f"torch {torch.__version__}; median of {args.repeats}")
    print(f"{'':18s} {'seconds':>8s} {'/ fedavg':>9s} {'/ recomputed':>13s}")
    for name, s in med.items():
        print(f"{name:18s} {s:8.2f} {s / med['fedavg']:9.2f} {s / med['moon, recomputed']:13.2f}")


if __name__ == "__main__":
    main()
