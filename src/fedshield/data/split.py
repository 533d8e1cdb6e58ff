"""Carve server-held subsets (root set, validation) out of the train split before partitioning."""

from __future__ import annotations

import torch

from fedshield.data.bundle import TensorData
from fedshield.errors import ConfigError


def check_carve(n: int, sizes: dict[str, int]) -> int:
    """Refuse subsets that leave no training data out of ``n`` samples; returns what is left
    (the builder runs it on the declared size before loading, :func:`carve` on the data)."""
    total = sum(sizes.values())
    if total >= n:
        wanted = ", ".join(f"data.{k}_size={v}" for k, v in sizes.items())
        raise ConfigError(f"data: carving {wanted} leaves no training data (train split has {n})")
    return n - total


def carve(
    data: TensorData, sizes: dict[str, int], seed: int
) -> tuple[TensorData, dict[str, TensorData]]:
    """Draw disjoint uniform random subsets of the given sizes; return (rest, subsets).

    The subsets follow the training distribution and are disjoint from every client (DRAG paper,
    Sec. IV).
    """
    check_carve(len(data), sizes)
    perm = torch.randperm(len(data), generator=torch.Generator().manual_seed(seed))
    out: dict[str, TensorData] = {}
    start = 0
    for name, size in sizes.items():
        out[name] = data.subset(torch.sort(perm[start : start + size]).values)
        start += size
    return data.subset(torch.sort(perm[start:]).values), out
