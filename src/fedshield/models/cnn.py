"""The seeds' CNNs (SPEC §9) and a small grayscale CNN for CPU runs."""

from __future__ import annotations

from torch import Tensor, nn

from fedshield.models.base import MODELS, Classifier, flat_dim


class ConvNet(Classifier):
    """conv trunk → flatten → MLP → linear head."""

    def __init__(
        self,
        trunk: nn.Module,
        hidden: list[int],
        input_shape: tuple[int, int, int],
        num_classes: int,
    ) -> None:
        super().__init__()
        self.trunk = trunk
        layers: list[nn.Module] = []
        width = flat_dim(trunk, input_shape)
        for h in hidden:
            layers += [nn.Linear(width, h), nn.ReLU(inplace=True)]
            width = h
        self.mlp = nn.Sequential(*layers)
        self.num_features = width
        self.head = nn.Linear(width, num_classes)

    def forward_features(self, x: Tensor) -> Tensor:
        return self.mlp(self.trunk(x).flatten(1))


def _conv(cin: int, cout: int, k: int, pad: int) -> list[nn.Module]:
    return [nn.Conv2d(cin, cout, k, padding=pad), nn.ReLU(inplace=True)]


@MODELS.register("cnn_small")
def cnn_small(
    input_shape: tuple[int, int, int], num_classes: int, width: int = 16, hidden: int = 64
) -> ConvNet:
    """Small CNN for grayscale CPU runs: 2×(conv3×3 + pool) → FC hidden → FC C."""
    c = input_shape[0]
    pool = 2 if min(input_shape[1:]) >= 16 else 1  # 8×8 digits cannot be pooled twice
    trunk = nn.Sequential(
        *_conv(c, width, 3, 1), nn.MaxPool2d(pool), *_conv(width, 2 * width, 3, 1), nn.MaxPool2d(2)
    )
    return ConvNet(trunk, [hidden], input_shape, num_classes)


@MODELS.register("cnn_emnist")
def cnn_emnist(input_shape: tuple[int, int, int], num_classes: int) -> ConvNet:
    """Seed 000 EMNIST CNN: two 5×5 conv layers (32, 64) with pooling, FC 512, FC C."""
    c = input_shape[0]
    trunk = nn.Sequential(
        *_conv(c, 32, 5, 2), nn.MaxPool2d(2), *_conv(32, 64, 5, 2), nn.MaxPool2d(2)
    )
    return ConvNet(trunk, [512], input_shape, num_classes)


@MODELS.register("cnn_cifar10")
def cnn_cifar10(input_shape: tuple[int, int, int], num_classes: int) -> ConvNet:
    """Seed 000 CIFAR-10 CNN: conv5×5(64)–pool–conv5×5(64)–pool–FC384–FC192–FC C (padded)."""
    c = input_shape[0]
    trunk = nn.Sequential(
        *_conv(c, 64, 5, 2), nn.MaxPool2d(2), *_conv(64, 64, 5, 2), nn.MaxPool2d(2)
    )
    return ConvNet(trunk, [384, 192], input_shape, num_classes)


@MODELS.register("cnn_cifar100")
def cnn_cifar100(input_shape: tuple[int, int, int], num_classes: int) -> ConvNet:
    """Seed 000 CIFAR-100 CNN: 3×(conv3×3 padded + pool) (32, 64, 128), FC 256, FC C."""
    c = input_shape[0]
    trunk = nn.Sequential(
        *_conv(c, 32, 3, 1),
        nn.MaxPool2d(2),
        *_conv(32, 64, 3, 1),
        nn.MaxPool2d(2),
        *_conv(64, 128, 3, 1),
        nn.MaxPool2d(2),
    )
    return ConvNet(trunk, [256], input_shape, num_classes)


@MODELS.register("mlp")
def mlp(input_shape: tuple[int, int, int], num_classes: int, hidden: int = 128) -> ConvNet:
    """Two-layer perceptron (for tiny inputs and smoke tests)."""
    return ConvNet(nn.Identity(), [hidden], input_shape, num_classes)
