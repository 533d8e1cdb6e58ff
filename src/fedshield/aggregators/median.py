"""Coordinate-wise median (Yin et al., ICML 2018), SPEC §5.

For even S the median of a coordinate is the mean of its two middle values, as in
``numpy.median``, ``torch.quantile(q=0.5)`` (ByzFL) and Flower's ``aggregate_median``.
Sample weights play no part (an order statistic of the updates).
"""

from __future__ import annotations

import torch
from torch import Tensor

from fedshield.aggregators.base import AGGREGATORS, Aggregator, Diagnostics, check_updates


def coordinate_median(updates: Tensor) -> Tensor:
    """``[d]`` coordinate-wise median of the rows of ``updates``."""
    s = updates.shape[0]
    if s % 2 == 1:
        # torch.median is a selection (no full sort) and exact for odd S.
        return torch.median(updates, dim=0).values
    mid = torch.sort(updates, dim=0).values[s // 2 - 1 : s // 2 + 1]
    return mid.mean(dim=0)


@AGGREGATORS.register("median")
class Median(Aggregator):
    """Coordinate-wise median (Yin 2018); mean of the two middle values for even S."""

    def aggregate(
        self, updates: Tensor, weights: Tensor | None = None, *, reference: Tensor | None = None
    ) -> tuple[Tensor, Diagnostics]:
        check_updates(updates, weights)
        return coordinate_median(updates), {}
