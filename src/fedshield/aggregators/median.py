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
    # torch.median is a selection (no full sort) returning the lower middle value: exact for
    # odd S. For even S the upper middle value is the smallest entry above it, unless the
    # lower one is repeated (> S/2 entries ≤ it). Two O(S·d) passes beat a full sort.
    lo = torch.median(updates, dim=0).values
    if s % 2 == 1:
        return lo
    at_or_below = updates <= lo
    above = updates.masked_fill(at_or_below, torch.inf).amin(dim=0)
    hi = torch.where(at_or_below.sum(dim=0) > s // 2, lo, above)
    return (lo + hi) / 2


@AGGREGATORS.register("median")
class Median(Aggregator):
    """Coordinate-wise median (Yin 2018); mean of the two middle values for even S."""

    def aggregate(
        self, updates: Tensor, weights: Tensor | None = None, *, reference: Tensor | None = None
    ) -> tuple[Tensor, Diagnostics]:
        check_updates(updates, weights)
        return coordinate_median(updates), {}
