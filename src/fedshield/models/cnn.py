"""The DRAG paper's CNNs (Sec. VI), a small grayscale CNN for CPU runs and an MLP.

The papers' CNNs have a fixed architecture (no ``model.params``); ``cnn_small`` and ``mlp``
take their widths from their schema. Factories are called through
:func:`fedshield.models.build_model`, which validates the parameters first.
"""

from __future__ import annotations

from pydantic import Field
from torch import Tensor, nn

from fedshield.core.params import NoParams, Params
from fedshield.models.base import MODELS, Classifier, flat_dim
from fedshield.models.fast_pool import max_pool
from fedshield.models.gray_conv import conv2d

CLASSIFIER = ["family=classifier"]
#: conv + max-pool nets: channels_last on CPU measured 1.1-2x faster per step
#: (docs/results/bench_layout.txt; fedshield.models.layout)
CONV = [*CLASSIFIER, "channels_last=cpu"]


class CNNSmallParams(Params):
    width: int = Field(
        16, ge=1, le=1024, description="channels of the first conv layer (the second has 2×)"
    )
    hidden: int = Field(64, ge=1, le=65536, description="units of the hidden linear layer")


class MLPParams(Params):
    hidden: int = Field(128, ge=1, le=65536, description="units of the hidden linear layer")
    batchnorm: bool = Field(False, description="BatchNorm1d after the hidden layer")


class ConvNet(Classifier):
    """A conv trunk, flattened, then an MLP and a linear head (the trunk may be empty)."""

    def __init__(
        self,
        trunk: nn.Module,
        hidden: list[int],
        input_shape: tuple[int, int, int],
        num_classes: int,
        batchnorm: bool = False,
    ) -> None:
        super().__init__()
        self.trunk = trunk
        layers: list[nn.Module] = []
        width = flat_dim(trunk, input_shape)
        for h in hidden:
            norm = [nn.BatchNorm1d(h)] if batchnorm else []
            layers += [nn.Linear(width, h), *norm, nn.ReLU(inplace=True)]
            width = h
        self.mlp = nn.Sequential(*layers)
        self.num_features = width
        self.head = nn.Linear(width, num_classes)

    def forward_features(self, x: Tensor) -> Tensor:
        return self.mlp(self.trunk(x).flatten(1))


def _stage(cin: int, cout: int, k: int, pad: int, pool: int = 2) -> list[nn.Module]:
    """conv → max-pool → ReLU: the papers' conv → ReLU → max-pool, computed in the cheaper
    order. Max-pooling commutes with the monotone ReLU (max relu(a) = relu(max a), and the
    gradient reaches the same arg-max entry, or none when the window's max is ≤ 0), so the
    outputs and gradients are the same bit for bit (tests/test_models.py), while ReLU and its
    backward touch a quarter of the elements: cnn_small's training step 1.4x faster
    (docs/results/bench_layout.txt). The convolutions keep their indices (0, 3, 6) in the
    trunk, so state dicts are unchanged. A grayscale first convolution is a
    :class:`~fedshield.models.gray_conv.GrayConv2d` (its CPU input gradient, which every
    attack step runs, by a matmul)."""
    return [conv2d(cin, cout, k, pad), max_pool(pool), nn.ReLU(inplace=True)]


@MODELS.register("cnn_small", schema=CNNSmallParams, tags=CONV)
def cnn_small(
    input_shape: tuple[int, int, int], num_classes: int, *, width: int, hidden: int
) -> ConvNet:
    """Small CNN for CPU runs: two conv3×3 + pool stages, a hidden linear layer, a head.

    Channels ``width`` then 2·``width``; inputs smaller than 16×16 (8×8 digits) skip the
    first pooling, which they could not afford twice."""
    c = input_shape[0]
    pool = 2 if min(input_shape[1:]) >= 16 else 1  # 8×8 digits cannot be pooled twice
    trunk = nn.Sequential(*_stage(c, width, 3, 1, pool), *_stage(width, 2 * width, 3, 1))
    return ConvNet(trunk, [hidden], input_shape, num_classes)


@MODELS.register("cnn_emnist", schema=NoParams, tags=CONV)
def cnn_emnist(input_shape: tuple[int, int, int], num_classes: int) -> ConvNet:
    """The DRAG paper's EMNIST CNN: two conv5×5 layers (32, 64) with pooling, FC 512, FC C."""
    c = input_shape[0]
    trunk = nn.Sequential(*_stage(c, 32, 5, 2), *_stage(32, 64, 5, 2))
    return ConvNet(trunk, [512], input_shape, num_classes)


@MODELS.register("cnn_cifar10", schema=NoParams, tags=CONV)
def cnn_cifar10(input_shape: tuple[int, int, int], num_classes: int) -> ConvNet:
    """The DRAG paper's CIFAR-10 CNN: two padded conv5×5(64) + pool stages, FC 384, 192, C."""
    c = input_shape[0]
    trunk = nn.Sequential(*_stage(c, 64, 5, 2), *_stage(64, 64, 5, 2))
    return ConvNet(trunk, [384, 192], input_shape, num_classes)


@MODELS.register("cnn_cifar100", schema=NoParams, tags=CONV)
def cnn_cifar100(input_shape: tuple[int, int, int], num_classes: int) -> ConvNet:
    """The DRAG paper's CIFAR-100 CNN: three padded conv3×3 + pool stages, FC 256, FC C."""
    c = input_shape[0]
    trunk = nn.Sequential(*_stage(c, 32, 3, 1), *_stage(32, 64, 3, 1), *_stage(64, 128, 3, 1))
    return ConvNet(trunk, [256], input_shape, num_classes)


@MODELS.register("mlp", schema=MLPParams, tags=CLASSIFIER)
def mlp(
    input_shape: tuple[int, int, int], num_classes: int, *, hidden: int, batchnorm: bool
) -> ConvNet:
    """Two-layer perceptron on the flattened input, for tiny inputs and smoke tests
    (``batchnorm = true``: the smallest model with BatchNorm statistics)."""
    return ConvNet(nn.Identity(), [hidden], input_shape, num_classes, batchnorm)


def _mlp_tags(params: Params, tags: dict[str, frozenset[str]]) -> dict[str, frozenset[str]]:
    out = dict(tags)
    if getattr(params, "batchnorm", False):
        out["batchnorm"] = frozenset()
    return out


mlp.tags_for = _mlp_tags  # type: ignore[attr-defined]
