"""Model zoo: every model is ``head(body(x))`` with ``body`` -> flat features and ``head`` a Linear.

The split lets methods that need representations (MOON, FedL2G, FedGTST) use ``model.body`` and
``model.feature_dim`` without knowing the architecture. No BatchNorm anywhere (averaging running
statistics across non-IID clients is wrong; GroupNorm instead) and no dropout, except Feddle's pretrained
torchvision models (PRETRAINED_MODELS, models/pretrained.py), which keep what their weights were trained with.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from torch import nn

from fedrepro.models.cnn import SplitModel, cnn4, lenet5, simple_cnn
from fedrepro.models.conv3 import cnn3, cnn3_small
from fedrepro.models.pretrained import resnet18_imagenet, vit_b16_lora
from fedrepro.models.resnet import resnet18_gn
from fedrepro.models.text import textcnn

__all__ = ["MODELS", "PRETRAINED_MODELS", "TEXT_MODELS", "SplitModel", "build_model"]

# name -> builder(shape=(H, W, C), num_classes, **kwargs); text models take shape=(L,) token ids
MODELS: dict[str, Callable[..., SplitModel]] = {
    "simple_cnn": simple_cnn,
    "lenet5": lenet5,
    "cnn4": cnn4,
    "resnet18_gn": resnet18_gn,
    "textcnn": textcnn,
    "cnn3": cnn3,  # Feddle's from-scratch CNN
    "cnn3_small": cnn3_small,
    # Feddle's ImageNet-pretrained models (torchvision; BatchNorm and frozen parameters, unlike the rest)
    "resnet18_imagenet": resnet18_imagenet,
    "vit_b16_lora": vit_b16_lora,
}
TEXT_MODELS = frozenset({"textcnn"})
# models that load pretrained weights (build_model's ``weights``) and may freeze part of themselves
PRETRAINED_MODELS = frozenset({"resnet18_imagenet", "vit_b16_lora"})


def build_model(name: str, shape: tuple[int, ...], num_classes: int, weights: str | Path | None = None,
                **kwargs: Any) -> nn.Module:
    """Build model ``name`` for inputs of ``shape`` = (H, W, C), or (L,) for text models, and
    ``num_classes`` outputs (text models also take ``vocab_size``). ``weights``: the pretrained weights
    file of a PRETRAINED_MODELS model (the run spec's ``weights``; None: randomly initialised)."""
    if name not in MODELS:
        raise ValueError(f"unknown model {name!r}; known models: {', '.join(sorted(MODELS))}")
    if weights is not None:
        if name not in PRETRAINED_MODELS:
            raise ValueError(f"model {name} loads no pretrained weights, got weights={weights!r}")
        kwargs["weights"] = weights
    if name in TEXT_MODELS and len(shape) != 1:
        raise ValueError(f"{name} takes token ids: shape must be (L,), got {shape}")
    if name not in TEXT_MODELS and len(shape) != 3:
        raise ValueError(f"shape must be (H, W, C), got {shape}")
    return MODELS[name](tuple(int(s) for s in shape), int(num_classes), **kwargs)
