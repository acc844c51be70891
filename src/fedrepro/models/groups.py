"""Model groups for heterogeneous-model FL (FedL2G): client i gets architecture ``i mod X`` of a group.

Every architecture is a ``SplitModel``: ``body`` -> ``feature_dim`` features, ``head`` -> logits, and all
members of a group end in the same ``feature_dim`` (FedGH, FedKD, FedProto and FedL2G-f need it), as in
HtFLlib's ``BaseHeadSplit``: the backbone's classifier is replaced by an adaptive 1-d average pool to
``feature_dim`` (identity where the backbone already ends in that width) and a new head is added.

Groups:
- ``tiny4`` (embedded default, laptop scale): four small, structurally distinct networks (an MLP, a LeNet,
  PFLlib's 4-layer CNN, a GroupNorm mini ResNet); no BatchNorm, so they follow the repo's model rules.
- The paper's groups (FedL2G Sec. 4.1-4.2; HtFLlib ``main.py``): HtFE2, HtFE3, HtFE4, HtFE8, HtFE9, HtM10,
  from torchvision builders imported lazily (importing torchvision costs seconds) plus HtFLlib's ResNet4-10
  (torchvision's ResNet stem and BasicBlocks with fewer stages). Not pretrained; they keep their
  BatchNorm (the paper's models; no method here averages a BatchNorm model's statistics: the shared
  auxiliary model of FML/FedKD is the group's smallest member, BatchNorm-free in HtFE2/4/8 and HtM10).
  GoogleNet keeps its dropout before the (replaced) classifier as torchvision builds it, and MobileNetV2
  keeps Dropout(0.2) before the pool to K as HtFLlib's own MobileNetV2 (trainmodel/mobilenet_v2.py, the one
  its groups use) has it outside its ``fc`` (torchvision's would lose it with its ``classifier``). ViTs
  (HtM10) get HtFLlib's head Linear(K, 768)-Tanh-Linear(768, C).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from fedrepro.models.cnn import SplitModel, two_conv_mlp


class PoolTo(nn.Module):
    """HtFLlib's ``nn.AdaptiveAvgPool1d(K)`` on a flat feature vector: [B, D] -> [B, K] (identity if D = K)."""

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.dim = dim

    def forward(self, x: Tensor) -> Tensor:
        x = torch.flatten(x, 1)
        if x.shape[1] == self.dim:
            return x
        return F.adaptive_avg_pool1d(x.unsqueeze(1), self.dim).squeeze(1)


# ----- the embedded group (small inputs: 28x28x1 digits, 32x32x3)
def mlp(shape: tuple[int, int, int], num_classes: int, feature_dim: int = 512) -> SplitModel:
    """Flatten, Linear(HWC, 128) ReLU, Linear(128, K) ReLU."""
    h, w, c = shape
    body = nn.Sequential(nn.Flatten(), nn.Linear(h * w * c, 128), nn.ReLU(), nn.Linear(128, feature_dim), nn.ReLU())
    return SplitModel(body, feature_dim, num_classes)


def lenet(shape: tuple[int, int, int], num_classes: int, feature_dim: int = 512) -> SplitModel:
    """LeNet-5's convolutions (6, 16 channels), fc 120, then fc K ReLU."""
    body, dim = two_conv_mlp(shape, (6, 16), (120, feature_dim), padding=2 if shape[0] < 32 else 0)
    return SplitModel(body, dim, num_classes)


def cnn4(shape: tuple[int, int, int], num_classes: int, feature_dim: int = 512) -> SplitModel:
    """PFLlib's FedAvgCNN (the paper's "4-layer CNN"): conv5x5(32) pool conv5x5(64) pool fc 512 ReLU, then the
    pool to K (identity at the paper's K = 512)."""
    body, dim = two_conv_mlp(shape, (32, 64), (512,))
    return SplitModel(nn.Sequential(body, PoolTo(feature_dim)), feature_dim, num_classes)


class _MiniBlock(nn.Module):
    """conv3x3 GN ReLU conv3x3 GN + (1x1 conv GN) shortcut, ReLU."""

    def __init__(self, c_in: int, c_out: int, stride: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(c_in, c_out, 3, stride=stride, padding=1, bias=False)
        self.norm1 = nn.GroupNorm(2, c_out)
        self.conv2 = nn.Conv2d(c_out, c_out, 3, padding=1, bias=False)
        self.norm2 = nn.GroupNorm(2, c_out)
        self.shortcut = nn.Sequential(nn.Conv2d(c_in, c_out, 1, stride=stride, bias=False), nn.GroupNorm(2, c_out))

    def forward(self, x: Tensor) -> Tensor:
        out = F.relu(self.norm1(self.conv1(x)))
        return F.relu(self.norm2(self.conv2(out)) + self.shortcut(x))


def resnet_mini(shape: tuple[int, int, int], num_classes: int, feature_dim: int = 512) -> SplitModel:
    """A two-block GroupNorm ResNet (widths 16, 32; stride 2 in the stem and the second block), global average
    pool, then fc K ReLU: depth and a residual path the other three lack, at a laptop's cost."""
    c = shape[2]
    body = nn.Sequential(
        nn.Conv2d(c, 16, 3, stride=2, padding=1, bias=False), nn.GroupNorm(2, 16), nn.ReLU(),
        _MiniBlock(16, 16, 1), _MiniBlock(16, 32, 2),
        nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(32, feature_dim), nn.ReLU(),
    )
    return SplitModel(body, feature_dim, num_classes)


# ----- the paper's architectures (torchvision, imported when built)
def _torchvision_split(backbone: nn.Module, feature_dim: int, num_classes: int) -> SplitModel:
    """HtFLlib's BaseHeadSplit: the classifier attribute (heads, fc or classifier) becomes the pool to K."""
    for attr in ("heads", "fc", "classifier"):
        if hasattr(backbone, attr):
            setattr(backbone, attr, PoolTo(feature_dim))
            return SplitModel(backbone, feature_dim, num_classes)
    raise ValueError(f"{type(backbone).__name__} has no classifier attribute to replace")


def _tv(builder_name: str, **kwargs) -> Callable[..., SplitModel]:
    def build(shape: tuple[int, int, int], num_classes: int, feature_dim: int = 512) -> SplitModel:
        import torchvision

        if shape[2] != 3:
            raise ValueError(f"{builder_name} takes 3-channel images, got shape {shape}")
        backbone = getattr(torchvision.models, builder_name)(weights=None, num_classes=num_classes, **kwargs)
        return _torchvision_split(backbone, feature_dim, num_classes)

    build.__doc__ = f"torchvision {builder_name} (not pretrained), classifier -> pool to K, Linear head."
    return build


def mobilenet_v2(shape: tuple[int, int, int], num_classes: int, feature_dim: int = 512) -> SplitModel:
    """HtFLlib's MobileNetV2: torchvision's layers, then Dropout(0.2) and the pool to K in the body (HtFLlib
    replaces only its ``fc``, after the dropout), Linear head."""
    model = _tv("mobilenet_v2")(shape, num_classes, feature_dim)
    model.body.classifier = nn.Sequential(nn.Dropout(0.2), PoolTo(feature_dim))
    return model


def _vit(builder_name: str) -> Callable[..., SplitModel]:
    def build(shape: tuple[int, int, int], num_classes: int, feature_dim: int = 512) -> SplitModel:
        import torchvision

        backbone = getattr(torchvision.models, builder_name)(weights=None, image_size=shape[0],
                                                             num_classes=num_classes)
        model = _torchvision_split(backbone, feature_dim, num_classes)
        # HtFLlib's ViT head: not a Linear, so LG-FedAvg and FedGH refuse HtM10 (heads differ)
        model.head = nn.Sequential(nn.Linear(feature_dim, 768), nn.Tanh(), nn.Linear(768, num_classes))
        return model

    build.__doc__ = f"torchvision {builder_name} at the data's image size; HtFLlib's Linear-Tanh-Linear head."
    return build


def _small_resnet(stages: int) -> Callable[..., SplitModel]:
    """HtFLlib's resnet4/6/8/10: torchvision's ResNet stem (conv7x7 s2, BN, max-pool) and one BasicBlock per
    stage for ``stages`` stages of widths 64, 128, 256, 512, global average pool."""

    def build(shape: tuple[int, int, int], num_classes: int, feature_dim: int = 512) -> SplitModel:
        from torchvision.models.resnet import BasicBlock, conv1x1

        layers: list[nn.Module] = [
            nn.Conv2d(shape[2], 64, 7, stride=2, padding=3, bias=False), nn.BatchNorm2d(64), nn.ReLU(inplace=True),
            nn.MaxPool2d(3, stride=2, padding=1),
        ]
        c_in = 64
        for i, width in enumerate((64, 128, 256, 512)[:stages]):
            stride = 1 if i == 0 else 2
            down = None
            if stride != 1 or c_in != width:
                down = nn.Sequential(conv1x1(c_in, width, stride), nn.BatchNorm2d(width))
            layers.append(BasicBlock(c_in, width, stride, down))
            c_in = width
        layers += [nn.AdaptiveAvgPool2d(1), nn.Flatten(), PoolTo(feature_dim)]
        body = nn.Sequential(*layers)
        for m in body.modules():
            if isinstance(m, nn.Conv2d):
                nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")
        return SplitModel(body, feature_dim, num_classes)

    build.__doc__ = f"HtFLlib's resnet{2 + 2 * stages}: {stages} stage(s) of one BasicBlock."
    return build


# name -> builder(shape=(H, W, C), num_classes, feature_dim)
ARCHITECTURES: dict[str, Callable[..., SplitModel]] = {
    "mlp": mlp,
    "lenet": lenet,
    "cnn4": cnn4,
    "resnet_mini": resnet_mini,
    "resnet4": _small_resnet(1),
    "resnet6": _small_resnet(2),
    "resnet8": _small_resnet(3),
    "resnet10": _small_resnet(4),
    "resnet18": _tv("resnet18"),
    "resnet34": _tv("resnet34"),
    "resnet50": _tv("resnet50"),
    "resnet101": _tv("resnet101"),
    "resnet152": _tv("resnet152"),
    "googlenet": _tv("googlenet", aux_logits=False, init_weights=True),
    "mobilenet_v2": mobilenet_v2,
    "vit_b_16": _vit("vit_b_16"),
    "vit_b_32": _vit("vit_b_32"),
}

_HTFE8 = ("cnn4", "googlenet", "mobilenet_v2", "resnet18", "resnet34", "resnet50", "resnet101", "resnet152")
GROUPS: dict[str, tuple[str, ...]] = {
    "tiny4": ("mlp", "lenet", "cnn4", "resnet_mini"),
    "HtFE2": ("cnn4", "resnet18"),
    "HtFE3": ("resnet10", "resnet18", "resnet34"),
    "HtFE4": ("cnn4", "googlenet", "mobilenet_v2", "resnet18"),
    "HtFE8": _HTFE8,
    "HtFE9": ("resnet4", "resnet6", "resnet8", "resnet10", "resnet18", "resnet34", "resnet50", "resnet101",
              "resnet152"),
    "HtM10": (*_HTFE8, "vit_b_16", "vit_b_32"),
}


def group_members(group: str | Sequence[str]) -> list[str]:
    """The architecture names of a group (a name in GROUPS, or an explicit list), validated."""
    names = list(GROUPS[group]) if isinstance(group, str) and group in GROUPS else group
    if isinstance(names, str):
        raise ValueError(f"unknown model group {group!r}; known: {sorted(GROUPS)}")
    unknown = [n for n in names if n not in ARCHITECTURES]
    if unknown or not names:
        raise ValueError(f"unknown architecture(s) {unknown} in group {group!r}; known: {sorted(ARCHITECTURES)}")
    return list(names)


def build_arch(name: str, shape: tuple[int, ...], num_classes: int, feature_dim: int = 512) -> SplitModel:
    """Build architecture ``name`` for images of ``shape`` = (H, W, C) with ``feature_dim`` features."""
    if name not in ARCHITECTURES:
        raise ValueError(f"unknown architecture {name!r}; known: {sorted(ARCHITECTURES)}")
    if len(shape) != 3:
        raise ValueError(f"shape must be (H, W, C), got {shape}")
    return ARCHITECTURES[name](tuple(int(s) for s in shape), int(num_classes), int(feature_dim))
