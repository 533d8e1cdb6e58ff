"""Long-tailed transform of a training set (SPEC §9; Cao et al. 2019 profile)."""

from __future__ import annotations

import math

import torch

from fedshield.data.bundle import TensorData
from fedshield.errors import ConfigError


def long_tail_counts(n_max: int, num_classes: int, rho: float) -> list[int]:
    """n_c = floor(n_max · rho^(−c/(C−1))), c = 0..C−1 (SPEC §9).

    CIFAR-10 with n_max = 5000 and rho = 50 gives [5000, 3237, ..., 100] (13,996 in all).
    """
    if rho < 1:
        raise ConfigError(f"data.long_tail.rho must be >= 1, got {rho}")
    if num_classes == 1:
        return [n_max]
    # The small epsilon guards floor() against 3236.9999 from float pow.
    return [
        int(math.floor(n_max * rho ** (-c / (num_classes - 1)) + 1e-9)) for c in range(num_classes)
    ]


def make_long_tail(data: TensorData, num_classes: int, rho: float, seed: int) -> TensorData:
    """Keep n_c samples of class c (head = class 0), chosen by a seeded shuffle."""
    counts = data.class_counts(num_classes)
    n_max = int(counts.max())
    target = long_tail_counts(n_max, num_classes, rho)
    g = torch.Generator().manual_seed(seed)
    keep = []
    for c in range(num_classes):
        idx = torch.nonzero(data.y == c, as_tuple=True)[0]
        idx = idx[torch.randperm(len(idx), generator=g)]
        keep.append(idx[: min(target[c], len(idx))])
    return data.subset(torch.sort(torch.cat(keep)).values)
