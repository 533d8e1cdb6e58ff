"""ResNet-18 with the CIFAR stem (torchvision's blocks) and WRN-28-k (Zagoruyko 2016)."""

from __future__ import annotations

import torch.nn.functional as F
from pydantic import Field
from torch import Tensor, nn
from torchvision.models import resnet18 as tv_resnet18

from fedshield.core.params import NoParams, Params
from fedshield.models.base import MODELS, Classifier

TAGS = ["family=classifier", "batchnorm"]


class WRNParams(Params):
    drop: float = Field(
        0.0, ge=0.0, lt=1.0, description="dropout rate between a block's two convolutions"
    )


class ResNet18(Classifier):
    """torchvision ResNet-18 with a 3×3 stride-1 stem and no max-pool (32×32 inputs)."""

    def __init__(self, input_shape: tuple[int, int, int], num_classes: int) -> None:
        super().__init__()
        net = tv_resnet18(num_classes=num_classes)
        net.conv1 = nn.Conv2d(input_shape[0], 64, 3, stride=1, padding=1, bias=False)
        net.maxpool = nn.Identity()
        self.head = net.fc
        net.fc = nn.Identity()
        self.body = net
        self.num_features = self.head.in_features

    def forward_features(self, x: Tensor) -> Tensor:
        return self.body(x)


# no channels_last tag: on CPU it measured within noise of NCHW, 0.84-1.23x per step across
# runs (docs/results/bench_layout.txt)
@MODELS.register("resnet18", schema=NoParams, tags=TAGS)
def resnet18(input_shape: tuple[int, int, int], num_classes: int) -> ResNet18:
    """ResNet-18 with the CIFAR stem (3×3 stride 1, no max-pool), FedCART's backbone."""
    return ResNet18(input_shape, num_classes)


class _WideBlock(nn.Module):
    def __init__(self, cin: int, cout: int, stride: int, drop: float) -> None:
        super().__init__()
        self.bn1 = nn.BatchNorm2d(cin)
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.drop = drop
        self.short = (
            nn.Conv2d(cin, cout, 1, stride, bias=False) if (stride != 1 or cin != cout) else None
        )

    def forward(self, x: Tensor) -> Tensor:
        o = F.relu(self.bn1(x))
        skip = x if self.short is None else self.short(o)
        o = self.conv1(o)
        o = F.relu(self.bn2(o))
        if self.drop > 0:
            o = F.dropout(o, self.drop, self.training)
        return self.conv2(o) + skip


class WideResNet(Classifier):
    """Pre-activation WRN-depth-k for 32×32 inputs. Written by hand: neither torchvision nor
    timm ships the CIFAR variant (theirs are ImageNet bottleneck nets)."""

    def __init__(
        self,
        input_shape: tuple[int, int, int],
        num_classes: int,
        depth: int = 28,
        widen: int = 4,
        drop: float = 0.0,
    ) -> None:
        super().__init__()
        if (depth - 4) % 6:
            raise ValueError(f"WRN depth must be 6n+4, got {depth}")
        n = (depth - 4) // 6
        widths = [16, 16 * widen, 32 * widen, 64 * widen]
        self.stem = nn.Conv2d(input_shape[0], widths[0], 3, 1, 1, bias=False)
        blocks: list[nn.Module] = []
        cin = widths[0]
        for stage, cout in enumerate(widths[1:]):
            for i in range(n):
                blocks.append(_WideBlock(cin, cout, 2 if (i == 0 and stage > 0) else 1, drop))
                cin = cout
        self.blocks = nn.Sequential(*blocks)
        self.bn = nn.BatchNorm2d(cin)
        self.num_features = cin
        self.head = nn.Linear(cin, num_classes)

    def forward_features(self, x: Tensor) -> Tensor:
        o = F.relu(self.bn(self.blocks(self.stem(x))))
        return F.adaptive_avg_pool2d(o, 1).flatten(1)


@MODELS.register("wrn28_4", schema=WRNParams, tags=TAGS)
def wrn28_4(input_shape: tuple[int, int, int], num_classes: int, *, drop: float) -> WideResNet:
    """Wide ResNet 28-4, pre-activation, for 32×32 inputs (DRAG paper, Fig. 6)."""
    return WideResNet(input_shape, num_classes, 28, 4, drop)
