"""Small convolutional networks of the papers (FedDisco's simple CNN, LeNet-5, PFLlib's 4-layer CNN)."""

from __future__ import annotations

from torch import Tensor, nn


class SplitModel(nn.Module):
    """``forward(x) = head(body(x))``; ``body`` maps [B, C, H, W] to flat features [B, feature_dim]."""

    def __init__(self, body: nn.Module, feature_dim: int, num_classes: int) -> None:
        super().__init__()
        self.body = body
        self.feature_dim = feature_dim
        self.head = nn.Linear(feature_dim, num_classes)

    def forward(self, x: Tensor) -> Tensor:
        return self.head(self.body(x))


def _after_conv_pool(size: int, kernel: int, padding: int) -> int:
    """Spatial size after a stride-1 conv and a 2x2 max-pool (floor, as nn.MaxPool2d)."""
    out = size + 2 * padding - kernel + 1
    if out < 2:
        raise ValueError(f"input of size {size} is too small for a {kernel}x{kernel} conv and a 2x2 pool")
    return out // 2


def papers_order(body: nn.Sequential) -> nn.Sequential:
    """The same modules (shared parameters) with each max-pool + ReLU pair back in the papers' ReLU, pool order:
    the reference that tests/models/test_models.py and benchmarks/pool_order.py hold the pool-first models against."""
    mods = list(body)
    for i in range(len(mods) - 1):
        if isinstance(mods[i], nn.MaxPool2d) and isinstance(mods[i + 1], nn.ReLU):
            mods[i], mods[i + 1] = mods[i + 1], mods[i]
    return nn.Sequential(*mods)


def two_conv_mlp(
    shape: tuple[int, int, int], channels: tuple[int, int], hidden: tuple[int, ...], padding: int = 0
) -> tuple[nn.Sequential, int]:
    """conv5x5 maxpool2 ReLU (x2), flatten, then Linear+ReLU per ``hidden`` width; returns (body, dim).

    Each block pools before its ReLU: max-pooling commutes with any non-decreasing function, so the outputs and
    gradients are those of the papers' conv-ReLU-pool order bit for bit (tests/models/test_models.py), and the ReLU and
    its backward touch a quarter of the values (a training step of the simple CNN 0.80-0.93x on one CPU core:
    benchmarks/pool_order.py). Parameter names are unchanged (body.0, body.3, body.7, ...).
    """
    h, w, c = shape
    c1, c2 = channels
    h = _after_conv_pool(_after_conv_pool(h, 5, padding), 5, 0)
    w = _after_conv_pool(_after_conv_pool(w, 5, padding), 5, 0)
    layers: list[nn.Module] = [
        nn.Conv2d(c, c1, 5, padding=padding),
        nn.MaxPool2d(2),
        nn.ReLU(),
        nn.Conv2d(c1, c2, 5),
        nn.MaxPool2d(2),
        nn.ReLU(),
        nn.Flatten(),
    ]
    dim = c2 * h * w
    for width in hidden:
        layers += [nn.Linear(dim, width), nn.ReLU()]
        dim = width
    return nn.Sequential(*layers), dim


def simple_cnn(shape: tuple[int, int, int], num_classes: int) -> SplitModel:
    """FedDisco's simple CNN: conv5x5(C->6) pool conv5x5(6->16) pool, fc 120, 84, head.

    Flatten is 400 for 32x32x3 (62,006 parameters with 10 classes) and 256 for 28x28x1.
    """
    body, dim = two_conv_mlp(shape, (6, 16), (120, 84))
    return SplitModel(body, dim, num_classes)


def lenet5(shape: tuple[int, int, int], num_classes: int) -> SplitModel:
    """LeNet-5 (max-pool, ReLU). Inputs smaller than 32x32 get padding 2 on the first conv, as LeNet on
    MNIST pads 28x28 to 32x32, so the flatten is 400 for both MNIST-like and CIFAR-like inputs; otherwise
    it equals ``simple_cnn``.
    """
    padding = 2 if shape[0] < 32 else 0
    body, dim = two_conv_mlp(shape, (6, 16), (120, 84), padding=padding)
    return SplitModel(body, dim, num_classes)


def cnn4(shape: tuple[int, int, int], num_classes: int) -> SplitModel:
    """PFLlib's FedAvgCNN (FedL2G's "4-layer CNN"): conv5x5(C->32) pool conv5x5(32->64) pool, fc 512, head.

    Flatten is 1024 for 28x28x1 and 1600 for 32x32x3.
    """
    body, dim = two_conv_mlp(shape, (32, 64), (512,))
    return SplitModel(body, dim, num_classes)
