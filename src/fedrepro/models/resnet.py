"""ResNet-18 with GroupNorm, FedDisco's variant for HAM10000 and CIFAR-100."""

from __future__ import annotations

from torch import Tensor, nn

from fedrepro.models.cnn import SplitModel


class BasicBlock(nn.Module):
    """Two 3x3 convs with a residual; a 1x1 conv shortcut when the shape changes."""

    def __init__(self, c_in: int, c_out: int, stride: int, num_groups: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(c_in, c_out, 3, stride=stride, padding=1, bias=False)
        self.norm1 = nn.GroupNorm(num_groups, c_out)
        self.conv2 = nn.Conv2d(c_out, c_out, 3, padding=1, bias=False)
        self.norm2 = nn.GroupNorm(num_groups, c_out)
        self.relu = nn.ReLU()
        self.shortcut: nn.Module = nn.Identity()
        if stride != 1 or c_in != c_out:
            self.shortcut = nn.Sequential(
                nn.Conv2d(c_in, c_out, 1, stride=stride, bias=False), nn.GroupNorm(num_groups, c_out)
            )

    def forward(self, x: Tensor) -> Tensor:
        out = self.relu(self.norm1(self.conv1(x)))
        out = self.norm2(self.conv2(out))
        return self.relu(out + self.shortcut(x))


def resnet18_gn(shape: tuple[int, int, int], num_classes: int, num_groups: int = 2) -> SplitModel:
    """ResNet-18 (BasicBlock [2, 2, 2, 2], widths 64-512), 3x3 stride-1 stem, no stem max-pool,
    GroupNorm(``num_groups``) in place of BatchNorm, global average pool -> 512 features.
    """
    c = shape[2]
    layers: list[nn.Module] = [
        nn.Conv2d(c, 64, 3, stride=1, padding=1, bias=False),
        nn.GroupNorm(num_groups, 64),
        nn.ReLU(),
    ]
    c_in = 64
    for i, width in enumerate((64, 128, 256, 512)):
        stride = 1 if i == 0 else 2
        layers += [BasicBlock(c_in, width, stride, num_groups), BasicBlock(width, width, 1, num_groups)]
        c_in = width
    layers += [nn.AdaptiveAvgPool2d(1), nn.Flatten()]
    body = nn.Sequential(*layers)
    # torchvision's ResNet initialisation (which FedDisco's copy keeps): He init for convs, unit norms.
    for m in body.modules():
        if isinstance(m, nn.Conv2d):
            nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")
        elif isinstance(m, nn.GroupNorm):
            nn.init.ones_(m.weight)
            nn.init.zeros_(m.bias)
    return SplitModel(body, 512, num_classes)
