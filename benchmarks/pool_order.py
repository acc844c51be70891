"""The zoo's CNNs pool before their ReLU (models/cnn.py): one training step against the papers' conv-ReLU-pool order.

    python benchmarks/pool_order.py              # one thread, the default's batch (64) and Fashion-MNIST's shape
    python benchmarks/pool_order.py --batch 10 --shape 32 32 3

Both orders share one set of parameters and give the same outputs and gradients bit for bit
(tests/models/test_models.py), so the only difference is time. Times are CPU seconds of this process
(time.process_time), so another job on the machine does not bias the ratio; the two orders alternate in
blocks, and the median block is printed.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
import torch.nn.functional as F
from torch import nn

from fedrepro.models import build_model
from fedrepro.models.cnn import papers_order
from fedrepro.sim.flat import FlatModel


def step_ms(model: nn.Module, body: nn.Module, flat: FlatModel, x: torch.Tensor, y: torch.Tensor,
            steps: int) -> float:
    """CPU milliseconds of one forward + backward + SGD step through ``body`` and the model's head."""
    start = time.process_time()
    for _ in range(steps):
        flat.zero_grad()
        F.cross_entropy(model.head(body(x)), y).backward()
        with torch.no_grad():
            flat.w.add_(flat.g, alpha=-0.01)
    return (time.process_time() - start) / steps * 1e3


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", nargs="+", default=["simple_cnn", "lenet5", "cnn4", "cnn3_small", "cnn3"])
    ap.add_argument("--shape", nargs=3, type=int, default=[28, 28, 1], metavar=("H", "W", "C"))
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--steps", type=int, default=50, help="steps per timed block")
    ap.add_argument("--blocks", type=int, default=5)
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    h, w, c = args.shape
    print(f"one training step, batch {args.batch}, {h}x{w}x{c}, {args.threads} thread(s), channels-last images, "
          f"CPU ms (median of {args.blocks} blocks of {args.steps} steps)")
    print(f"{'model':<12} {'conv-ReLU-pool':>15} {'conv-pool-ReLU':>15} {'ratio':>7}")
    for name in args.models:
        torch.manual_seed(0)
        model = build_model(name, tuple(args.shape), 10)
        flat = FlatModel(model)  # the engine's binding: channels-last weights in one vector
        x = torch.randn(args.batch, c, h, w).contiguous(memory_format=torch.channels_last)
        y = torch.randint(0, 10, (args.batch,))
        bodies = {"papers": papers_order(model.body), "ours": model.body}
        for body in bodies.values():  # warm-up (oneDNN primitive caches)
            step_ms(model, body, flat, x, y, 5)
        times: dict[str, list[float]] = {k: [] for k in bodies}
        for _ in range(args.blocks):
            for key, body in bodies.items():
                times[key].append(step_ms(model, body, flat, x, y, args.steps))
        papers, ours = (statistics.median(times[k]) for k in ("papers", "ours"))
        print(f"{name:<12} {papers:>15.3f} {ours:>15.3f} {ours / papers:>7.2f}")


if __name__ == "__main__":
    main()
