"""Made-up image sets in the prepared format."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import torch

CPU = torch.device("cpu")


def image_set(n_train: int, n_test: int, side: int, channels: int) -> SimpleNamespace:
    """A prepared-like image set of random pixels; int32 labels, so that moving them allocates (as on a GPU)
    rather than sharing the numpy memory."""
    rng = np.random.default_rng(0)
    return SimpleNamespace(
        x_train=rng.integers(0, 256, (n_train, side, side, channels), dtype=np.uint8),
        y_train=rng.integers(0, 10, n_train, dtype=np.int32),
        x_test=rng.integers(0, 256, (n_test, side, side, channels), dtype=np.uint8),
        y_test=rng.integers(0, 10, n_test, dtype=np.int32), meta={"num_classes": 10})
