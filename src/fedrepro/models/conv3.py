"""Feddle's from-scratch CNN: three 3x3 convolutions (padding 1, ReLU), one 2x2 max-pool, two fully connected
layers (the second is the head). The paper gives only this outline; widths are ours: ``cnn3`` (32, 64, 64,
fc 128) at paper scale, ``cnn3_small`` (8, 16, 16, fc 64) for the embedded CPU budget."""

from __future__ import annotations

from torch import nn

from fedrepro.models.cnn import SplitModel


def _conv3(shape: tuple[int, int, int], num_classes: int, widths: tuple[int, int, int], hidden: int) -> SplitModel:
    h, w, c = shape
    if h < 2 or w < 2:
        raise ValueError(f"input of size {h}x{w} is too small for a 2x2 pool")
    layers: list[nn.Module] = []
    for width in widths:
        layers += [nn.Conv2d(c, width, 3, padding=1), nn.ReLU()]
        c = width
    # the last ReLU after the pool: the same outputs and gradients, on a quarter of the values (models/cnn.py)
    layers[-1:] = [nn.MaxPool2d(2), nn.ReLU()]
    layers += [nn.Flatten(), nn.Linear(c * (h // 2) * (w // 2), hidden), nn.ReLU()]
    return SplitModel(nn.Sequential(*layers), hidden, num_classes)


def cnn3(shape: tuple[int, int, int], num_classes: int) -> SplitModel:
    """3 conv (32, 64, 64), 1 pool, fc 128, head."""
    return _conv3(shape, num_classes, (32, 64, 64), 128)


def cnn3_small(shape: tuple[int, int, int], num_classes: int) -> SplitModel:
    """3 conv (8, 16, 16), 1 pool, fc 64, head: the embedded study's laptop-sized variant."""
    return _conv3(shape, num_classes, (8, 16, 16), 64)
