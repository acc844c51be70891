"""How much any side-by-side (vectorised) engine could gain over the plain loop on this CPU, measured.

    python benchmarks/roofline.py [--threads 1]

Prints, in one run:
1. this core's matrix-multiply peak (GFLOP/s, the best of a few square sizes);
2. the plain loop's SGD step of the 4-layer CNN (batch 10, digits at 28x28, issue #4's setting) and of
   the embedded simple CNN (batch 16): FLOPs per step (torch.utils.flop_counter) and the GFLOP/s it reaches;
3. the bound on side-by-side training: the same model with ONE weight set at K times the batch (what K
   clients side by side would compute if they shared weights; per-client weights, as clients side by side
   have, can only be slower: grouped convolutions and batched matrix products). Its time over K plain
   steps is the lowest ratio a vectorised engine can reach against the plain loop here.
"""

from __future__ import annotations

import argparse
import time

import torch
import torch.nn.functional as F
from torch.utils.flop_counter import FlopCounterMode

from fedrepro.models import build_model


def best_seconds(fn, repeats: int = 5, inner: int = 20) -> float:
    fn()
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        for _ in range(inner):
            fn()
        best = min(best, (time.perf_counter() - t0) / inner)
    return best


def gemm_peak() -> tuple[float, int]:
    rates = {}
    for n in (256, 512, 1024):
        a, b = torch.randn(n, n), torch.randn(n, n)
        rates[n] = 2 * n**3 / best_seconds(lambda a=a, b=b: a @ b, inner=10) / 1e9
    n = max(rates, key=rates.get)
    return rates[n], n


def sgd_step(model_name: str, batch: int, shape=(28, 28, 1)):
    torch.manual_seed(0)
    model = build_model(model_name, shape, 10).to(memory_format=torch.channels_last)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x = torch.randn(batch, shape[2], shape[0], shape[1]).contiguous(memory_format=torch.channels_last)
    y = torch.randint(0, 10, (batch,))

    def step() -> None:
        opt.zero_grad(set_to_none=True)
        F.cross_entropy(model(x), y).backward()
        opt.step()

    counter = FlopCounterMode(display=False)
    with counter:
        F.cross_entropy(model(x), y).backward()
    return step, float(counter.get_total_flops())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--clients", type=int, nargs="*", default=[10, 20, 50])
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    peak, n = gemm_peak()
    print(f"threads {args.threads}: matrix-multiply peak {peak:.1f} GFLOP/s (float32 {n}x{n})")
    for model_name, batch in (("cnn4", 10), ("simple_cnn", 16)):
        step, flops = sgd_step(model_name, batch)
        t = best_seconds(step)
        rate = flops / t / 1e9
        print(f"{model_name} batch {batch}: {flops / 1e6:.1f} MFLOP per SGD step, {t * 1e3:.2f} ms -> "
              f"{rate:.1f} GFLOP/s = {rate / peak:.0%} of the peak")
        for k in args.clients:
            big, _ = sgd_step(model_name, batch * k)
            tb = best_seconds(big, repeats=3, inner=3)
            print(f"  {k:3d} clients side by side, shared weights (a lower bound): {tb * 1e3:8.1f} ms vs "
                  f"{k} plain steps {k * t * 1e3:8.1f} ms -> best possible ratio {tb / (k * t):.2f}x")


if __name__ == "__main__":
    main()
