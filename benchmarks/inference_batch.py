"""Forward-pass speed against its batch size, per model at the shape a study runs it, one CPU thread.

    python benchmarks/inference_batch.py

fedrepro.sim.tensors.evaluate and in_inference_batches (FedDF's teachers, Feddle-OOD's and FedGH's features,
fine-tuning's frozen body) pass ``inference_batch(device)`` samples at a time (256 on a CPU, 2048 on a GPU).
Rows: microseconds per image of an evaluation at each batch size (best of 2, random inputs in the engine's
channels-last layout: the speed does not depend on the pixels), and the ratios of 256 to the sizes used
before: 2048 (evaluations, fine-tuning's features) and 512 (FedDF's teachers, Feddle-OOD's features).
"""

from __future__ import annotations

import time

import torch

from fedrepro.models import build_model
from fedrepro.sim.flat import FlatModel
from fedrepro.sim.tensors import evaluate, inference_batch

# (model, input shape (H, W, C), test images): the laptop-full studies' evaluations, then paper-scale shapes
CASES = [
    ("simple_cnn", (28, 28, 1), 10_000),   # FedDisco on Fashion-MNIST
    ("cnn3_small", (28, 28, 1), 9_000),    # Feddle's Table 5 on Fashion-MNIST
    ("cnn4", (16, 16, 3), 3_000),          # FedL2G's 4-layer CNN at 16x16
    ("simple_cnn", (32, 32, 3), 10_000),   # FedDisco on CIFAR-10
    ("cnn3", (32, 32, 3), 2_000),          # Feddle's CNN on CIFAR-10
]
SIZES = (64, 128, 256, 512, 2048)


def microseconds_per_image(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor, batch_size: int) -> float:
    best = float("inf")
    for _ in range(2):
        t0 = time.perf_counter()
        evaluate(model, x, y, 10, batch_size=batch_size)
        best = min(best, time.perf_counter() - t0)
    return 1e6 * best / len(y)


def main() -> None:
    torch.set_num_threads(1)
    torch.manual_seed(0)
    print(f"cpu, 1 thread; torch {torch.__version__}; inference_batch(cpu) = {inference_batch(torch.device('cpu'))}")
    sizes = " ".join(f"{b:>7d}" for b in SIZES)
    print(f"{'model':12s} {'input':>10s} {'images':>7s} | {sizes} | 256/2048 256/512")
    for name, shape, n in CASES:
        model = build_model(name, shape, 10)
        FlatModel(model)  # the engine's layout (channels-last convolution weights)
        x = torch.randn(n, shape[2], shape[0], shape[1]).contiguous(memory_format=torch.channels_last)
        y = torch.randint(0, 10, (n,))
        us = {b: microseconds_per_image(model, x, y, b) for b in SIZES}
        print(f"{name:12s} {'x'.join(map(str, shape)):>10s} {n:7d} | " + " ".join(f"{us[b]:7.1f}" for b in SIZES)
              + f" | {us[256] / us[2048]:8.2f} {us[256] / us[512]:7.2f}")


if __name__ == "__main__":
    main()
