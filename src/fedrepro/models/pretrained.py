"""Feddle's ImageNet-pretrained models: torchvision's ResNet-18 (full fine-tuning) and ViT-B/16 with LoRA.

Data stay at the project's small sizes (32x32); the model resizes to ``input_size`` (224, the paper's) with
bilinear interpolation as its first step, and replicates a single grey channel to three. With ``weights`` (a
torchvision state dict file, fedrepro.data.weights) the backbone loads it; without (tests, the embedded
default) it is randomly initialised. torchvision is imported only when one of these models is built.

Unlike the rest of the zoo, the ResNet-18 keeps torchvision's BatchNorm: its pretrained statistics are part
of what the paper fine-tunes. The running statistics are buffers, not parameters: the asynchronous engine sends,
trains and merges them beside the parameter vector (asyncfl/base.py states the rule).
"""

from __future__ import annotations

from pathlib import Path

import torch
import torch.nn.functional as F  # noqa: N812 (the usual name)
from torch import Tensor, nn

from fedrepro.models.cnn import SplitModel
from fedrepro.models.lora import QueryValueLoRA, add_lora, freeze_except


class ToImageNetInput(nn.Module):
    """[B, C, h, w] -> [B, 3, size, size]: grey replicated to RGB, bilinear resize."""

    def __init__(self, size: int) -> None:
        super().__init__()
        self.size = size

    def forward(self, x: Tensor) -> Tensor:
        if x.shape[1] == 1:
            x = x.expand(-1, 3, -1, -1)
        if tuple(x.shape[-2:]) != (self.size, self.size):
            x = F.interpolate(x, size=(self.size, self.size), mode="bilinear", align_corners=False)
        return x


def _check_channels(shape: tuple[int, int, int], name: str) -> None:
    if shape[2] not in (1, 3):
        raise ValueError(f"{name} takes 1 or 3 channels (ImageNet RGB), got shape {shape}")


def load_state(module: nn.Module, weights: str | Path) -> None:
    """Load a torchvision state dict file into ``module`` (strict: every key must match)."""
    path = Path(weights)
    if not path.exists():
        raise FileNotFoundError(f"pretrained weights {path} do not exist (the download_weights rule fetches them)")
    state = torch.load(path, map_location="cpu", weights_only=True)
    try:
        module.load_state_dict(state)
    except RuntimeError as e:
        raise ValueError(f"pretrained weights {path} do not fit {type(module).__name__}: {e}") from None


def resnet18_imagenet(shape: tuple[int, int, int], num_classes: int, weights: str | Path | None = None,
                      input_size: int = 224) -> SplitModel:
    """torchvision's resnet18 (ImageNet weights from ``weights``), fc replaced by a new head; all trainable."""
    from torchvision.models import resnet18

    _check_channels(shape, "resnet18_imagenet")
    net = resnet18()
    if weights is not None:
        load_state(net, weights)
    net.fc = nn.Identity()
    return SplitModel(nn.Sequential(ToImageNetInput(input_size), net), 512, num_classes)


def vit_b16_lora(shape: tuple[int, int, int], num_classes: int, weights: str | Path | None = None,
                 input_size: int = 224, lora_rank: int = 4, lora_alpha: float = 8.0) -> SplitModel:
    """torchvision's vit_b_16 (ImageNet weights from ``weights``), frozen; LoRA (rank ``lora_rank``, scale
    ``lora_alpha / lora_rank``) on every block's query and value projections, and a new head, trainable.

    ``input_size`` other than 224 interpolates the pretrained position embeddings (torchvision's helper)."""
    from torchvision.models import vision_transformer as vt

    _check_channels(shape, "vit_b16_lora")
    net = vt.vit_b_16(image_size=input_size)
    if weights is not None:
        if input_size == 224:
            load_state(net, weights)
        else:
            state = torch.load(Path(weights), map_location="cpu", weights_only=True)
            state = vt.interpolate_embeddings(input_size, 16, state)
            net.load_state_dict(state)
    net.heads = nn.Identity()
    add_lora(net, lora_rank, lora_alpha)
    model = SplitModel(nn.Sequential(ToImageNetInput(input_size), net), net.hidden_dim, num_classes)
    freeze_except(model, (QueryValueLoRA,), also=model.head)
    return model
