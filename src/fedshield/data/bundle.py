"""In-memory tensor datasets: no per-sample Python work on the training path."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor


@dataclass(frozen=True)
class TensorData:
    """Images ``x`` ([N, C, H, W], uint8 or float in [0, 1]) and labels ``y`` ([N], int64).

    uint8 storage keeps CIFAR-sized sets at a quarter of the float memory; :meth:`batch`
    converts only the rows it returns.
    """

    x: Tensor
    y: Tensor

    def __post_init__(self) -> None:
        if self.x.shape[0] != self.y.shape[0]:
            raise ValueError(f"x has {self.x.shape[0]} rows but y has {self.y.shape[0]}")

    def __len__(self) -> int:
        return int(self.y.shape[0])

    def subset(self, idx: Tensor) -> TensorData:
        return TensorData(self.x[idx], self.y[idx])

    def batch(
        self, idx: Tensor | None = None, device: torch.device | str = "cpu"
    ) -> tuple[Tensor, Tensor]:
        x = self.x if idx is None else self.x[idx]
        y = self.y if idx is None else self.y[idx]
        x = x.to(device, non_blocking=True)
        if x.dtype == torch.uint8:
            x = x.float().div_(255.0)
        return x, y.to(device, non_blocking=True)

    def to(self, device: torch.device | str) -> TensorData:
        return TensorData(self.x.to(device), self.y.to(device))

    def class_counts(self, num_classes: int) -> Tensor:
        return torch.bincount(self.y, minlength=num_classes)


@dataclass(frozen=True)
class DataBundle:
    """A dataset as the engine sees it: train/test tensors plus its shape and classes."""

    name: str
    train: TensorData
    test: TensorData
    num_classes: int
    input_shape: tuple[int, int, int]
    class_names: tuple[str, ...]
