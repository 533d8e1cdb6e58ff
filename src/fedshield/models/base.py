"""The model interface shared by every registered network.

A :class:`Classifier` is ``head(forward_features(x))`` with a linear ``head`` over a
``num_features``-dim representation, as timm's ``forward_features``/``forward_head`` split.
Methods that need the feature extractor (FedCART's dual head, prototypes) rely on it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor, nn

from fedshield.errors import ConfigError
from fedshield.registry import Registry

ModelFactory = Callable[..., nn.Module]
MODELS: Registry[ModelFactory] = Registry("model", context=("input_shape", "num_classes"))


class Classifier(nn.Module):
    num_features: int
    head: nn.Linear

    def forward_features(self, x: Tensor) -> Tensor:
        raise NotImplementedError

    def forward_head(self, z: Tensor) -> Tensor:
        return self.head(z)

    def forward(self, x: Tensor) -> Tensor:
        return self.forward_head(self.forward_features(x))


def flat_dim(trunk: nn.Module, input_shape: tuple[int, int, int]) -> int:
    """Output size of a convolutional trunk for one input, found by a dry run."""
    with torch.no_grad():
        return int(trunk(torch.zeros(1, *input_shape)).flatten(1).shape[1])


def build_model(
    name: str, input_shape: tuple[int, int, int], num_classes: int, **params: Any
) -> nn.Module:
    factory = MODELS.get(name)
    try:
        return factory(input_shape=tuple(input_shape), num_classes=num_classes, **params)
    except TypeError as err:
        raise ConfigError(f"model.params for model {name!r}: {err}") from None
