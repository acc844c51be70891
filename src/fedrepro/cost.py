"""What a full regeneration costs before it is submitted: jobs, runs, SGD steps and estimated hours.

    python -m fedrepro.cost --configfile config/paper.yaml [--gpu-tflops 60 --step-floor-ms 1.5]

Per run, SGD steps = rounds x sampled clients x local steps (epochs over ~N/K samples in batches, or the
stragglers' mean; plus Feddle's Fig. 2 diagnostic, every client's local steps in each evaluation round),
counted from the study file and each data set's training size. Per-step FLOPs (forward
and backward) come from torch.utils.flop_counter on the setting's model at its batch size. CPU seconds
per step are measured here on a reference model and scaled by FLOPs; GPU seconds per step are
max(step floor, FLOPs / sustained throughput) — small models on a GPU are bound by per-step latency, not
FLOPs; both numbers are assumptions you can set (defaults: a sustained 60 TFLOP/s, a 1.5 ms floor).
Evaluation, data loading and start-up are not counted (a few % for the papers' budgets).
"""

from __future__ import annotations

import argparse
import math
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from torch.utils.flop_counter import FlopCounterMode

from fedrepro.config import REPO, grid_runs, load_yaml, resolve_config, run_spec
from fedrepro.models import TEXT_MODELS, build_model
from fedrepro.sim.batches import batches_per_epoch

# (training samples, input shape, classes) of each data set, so an estimate needs no download
DATASETS = {
    "digits": (1347, (28, 28, 1), 10), "digits_m": (1347, (28, 28, 3), 10),
    "mnist": (60000, (28, 28, 1), 10), "fashion_mnist": (60000, (28, 28, 1), 10),
    "cifar10": (50000, (32, 32, 3), 10), "cifar100": (50000, (32, 32, 3), 100),
    "svhn": (73257, (32, 32, 3), 10), "cinic10": (90000, (32, 32, 3), 10),
    "ham10000": (9805, (56, 56, 3), 7), "ag_news": (120000, (64,), 4),
    "mnist_m": (60000, (28, 28, 3), 10),
    "flowers102": (2040, (32, 32, 3), 102), "tiny_imagenet": (100000, (32, 32, 3), 200),
    # Feddle: CIFAR-100 under its 20 superclasses; FEMNIST and CelebA keep 1000 writers / people with 90% of
    # each one's samples for training (data/feddle_sets.py), so their sizes are estimates: ~165 samples of
    # the first 40 classes per NIST writer, ~21 images per CelebA person with >= 5
    "cifar100_coarse": (50000, (32, 32, 3), 20),
    "femnist": (150000, (28, 28, 1), 40), "celeba_smiling": (19000, (32, 32, 3), 2),
}
# test-split sizes, for partitions that pool train and test (`pool_test`, FedL2G)
TEST_SIZES = {"digits": 360, "cifar10": 10000, "cifar100": 10000, "flowers102": 6149, "tiny_imagenet": 10000}
# DomainNet (FedGTST): train sizes of the official splits, images prepared at 64x64 (data/domainnet.py)
_DOMAINNET_TRAIN = {"clipart": 33525, "infograph": 36023, "painting": 50426, "quickdraw": 120750,
                    "real": 120906, "sketch": 48212}
DATASETS.update({f"domainnet_{d}": (n, (64, 64, 3), 345) for d, n in _DOMAINNET_TRAIN.items()})
DATASETS.update({f"domainnet_no_{d}": (sum(_DOMAINNET_TRAIN.values()) - n, (64, 64, 3), 345)
                 for d, n in _DOMAINNET_TRAIN.items()})


def step_flops(model_name: str, shape: tuple[int, ...], classes: int, batch: int, group_of: int = 0) -> float:
    """FLOPs of one SGD step (forward + backward) of ``model_name`` on a batch; with ``group_of`` = K clients,
    ``model_name`` is a model group and the step is the mean over the K clients' architectures (i mod X)."""
    if group_of:
        from fedrepro.models.groups import build_arch, group_members

        members = group_members(model_name)
        flops = {m: _flops(build_arch(m, shape, classes), shape, batch, text=False) for m in set(members)}
        return sum(flops[members[i % len(members)]] for i in range(group_of)) / group_of
    return _flops(build_model(model_name, shape, classes), shape, batch, text=model_name in TEXT_MODELS)


def _flops(model: torch.nn.Module, shape: tuple[int, ...], batch: int, text: bool) -> float:
    x = torch.zeros(batch, shape[0], dtype=torch.long) if text else torch.zeros(batch, shape[2], shape[0], shape[1])
    counter = FlopCounterMode(display=False)
    with counter:
        F.cross_entropy(model(x), torch.zeros(batch, dtype=torch.long)).backward()
    return float(counter.get_total_flops())


def cpu_seconds_per_flop(repeats: int = 30) -> float:
    """Measured here: one thread, the 4-layer CNN at batch 32 (a typical small-model step)."""
    torch.set_num_threads(1)
    model = build_model("cnn4", (28, 28, 1), 10)
    x, y = torch.randn(32, 1, 28, 28), torch.randint(0, 10, (32,))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    for _ in range(3):
        opt.zero_grad(), F.cross_entropy(model(x), y).backward(), opt.step()
    t0 = time.perf_counter()
    for _ in range(repeats):
        opt.zero_grad(), F.cross_entropy(model(x), y).backward(), opt.step()
    return (time.perf_counter() - t0) / repeats / step_flops("cnn4", (28, 28, 1), 10, 32)


def run_steps(spec: dict) -> float:
    """SGD steps of one run of ``spec``."""
    n, _, _ = DATASETS[spec["dataset"]]
    part, t = spec["partition"], spec["training"]
    if part.get("pool_test"):
        n += TEST_SIZES[spec["dataset"]]
    if spec.get("federation") == "hetero":
        n *= 0.75  # each client trains on its own 75% (fedrepro.hetero.engine.HeteroConfig.train_fraction)
    clients = part["clients"]
    if part["kind"] == "imbalance":  # long tail keeps about sum rho^(-c/(C-1)) of the classes
        c = DATASETS[spec["dataset"]][2]
        n = n / c * sum(part["rho"] ** (-i / (c - 1)) for i in range(c))
    per_client = n / clients
    sampled = max(1, round(t["join_ratio"] * clients))
    if t.get("straggler_steps"):
        local = sum(t["straggler_steps"]) / 2
    else:
        local = t["local_epochs"] * batches_per_epoch(math.ceil(per_client), t["batch_size"], t["drop_last"])
    steps = t["rounds"] * sampled * local
    if spec.get("async", {}).get("true_update"):  # Feddle's Fig. 2: every client trains in each evaluation
        steps += math.ceil(t["rounds"] / t["eval_every"]) * clients * local
    return steps


def estimate(config: dict, gpu_tflops: float, step_floor_ms: float, cpu_spf: float) -> list[dict]:
    rows = []
    flops_cache: dict[tuple, float] = {}
    for name, study in config["studies"].items():
        jobs = grid_runs(study)
        seeds = len(study["seeds"])
        steps = gpu_s = cpu_s = 0.0
        for setting, method in jobs:
            spec = run_spec(study, setting, method)
            _, shape, classes = DATASETS[spec["dataset"]]
            if len(shape) == 3:  # the setting's resizing and grey -> colour expansion (FedGTST's MNIST)
                side = spec.get("image_size")
                shape = (side or shape[0], side or shape[1], spec.get("channels") or shape[2])
            hetero = spec.get("federation") == "hetero"
            key = (spec["model"], shape, classes, spec["training"]["batch_size"],
                   spec["partition"]["clients"] if hetero else 0)
            if key not in flops_cache:
                flops_cache[key] = step_flops(*key)
            s = run_steps(spec) * seeds
            steps += s
            gpu_s += s * max(step_floor_ms / 1e3, flops_cache[key] / (gpu_tflops * 1e12))
            cpu_s += s * flops_cache[key] * cpu_spf
        rows.append({"study": name, "jobs": len(jobs), "runs": len(jobs) * seeds, "steps": steps,
                     "gpu_hours": gpu_s / 3600, "cpu_hours": cpu_s / 3600})
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--configfile", default=str(REPO / "config" / "paper.yaml"))
    parser.add_argument("--gpu-tflops", type=float, default=60.0, help="sustained fp32/tf32 TFLOP/s of one GPU")
    parser.add_argument("--step-floor-ms", type=float, default=1.5, help="GPU seconds per step at least (ms)")
    args = parser.parse_args()
    config = resolve_config(load_yaml(Path(args.configfile)), source=args.configfile)
    cpu_spf = cpu_seconds_per_flop()
    rows = estimate(config, args.gpu_tflops, args.step_floor_ms, cpu_spf)
    print(f"{args.configfile}: CPU cost measured here ({1 / cpu_spf / 1e9:.1f} GFLOP/s, one thread); GPU assumed "
          f"{args.gpu_tflops:g} TFLOP/s sustained with a {args.step_floor_ms:g} ms step floor")
    print(f"{'study':12s} {'jobs':>6s} {'runs':>6s} {'SGD steps':>12s} {'GPU-hours':>10s} {'CPU core-hours':>15s}")
    for r in rows:
        print(f"{r['study']:12s} {r['jobs']:6d} {r['runs']:6d} {r['steps']:12.3g} {r['gpu_hours']:10.1f} "
              f"{r['cpu_hours']:15.1f}")
    print(f"{'total':12s} {sum(r['jobs'] for r in rows):6d} {sum(r['runs'] for r in rows):6d} "
          f"{sum(r['steps'] for r in rows):12.3g} {sum(r['gpu_hours'] for r in rows):10.1f} "
          f"{sum(r['cpu_hours'] for r in rows):15.1f}")


if __name__ == "__main__":
    main()
