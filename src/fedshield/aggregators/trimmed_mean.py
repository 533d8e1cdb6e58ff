"""Coordinate-wise trimmed mean (Yin et al., ICML 2018), SPEC §5.

Per coordinate, drop the f largest and the f smallest values and average the S − 2f left
(needs 2f < S). ``f`` is a count, as in ByzFL's ``TrMean(f)``; Flower's
``aggregate_trimmed_avg(proportiontocut=β)`` trims ⌊βS⌋ per side, i.e. f = ⌊βS⌋.
Sample weights play no part (an order statistic of the updates).
"""

from __future__ import annotations

import torch
from torch import Tensor

from fedshield.aggregators._ops import check_int
from fedshield.aggregators.base import (
    AGGREGATORS,
    Aggregator,
    ConfigError,
    Diagnostics,
    check_updates,
)


def trimmed_mean(updates: Tensor, f: int) -> Tensor:
    """``[d]`` mean of each coordinate after dropping its f largest and f smallest values."""
    if f == 0:
        return updates.mean(dim=0)
    s = updates.shape[0]
    # A full sort, not (sum − top f − bottom f): that subtraction cancels catastrophically
    # when one Byzantine value is huge, which is exactly the case the rule exists for.
    return torch.sort(updates, dim=0).values[f : s - f].mean(dim=0)


@AGGREGATORS.register("trimmed_mean")
class TrimmedMean(Aggregator):
    """Coordinate-wise trimmed mean (Yin 2018): drop the f largest and f smallest values."""

    def __init__(self, f: int = 0) -> None:
        self.f = check_int("trimmed_mean", "f", f)

    def validate(self, num_clients: int) -> None:
        if 2 * self.f >= num_clients:
            raise ConfigError(
                f"trimmed_mean: f={self.f} trims 2f = {2 * self.f} values per coordinate, "
                f"which needs more than 2f clients per round, got S={num_clients}"
            )

    def aggregate(
        self, updates: Tensor, weights: Tensor | None = None, *, reference: Tensor | None = None
    ) -> tuple[Tensor, Diagnostics]:
        check_updates(updates, weights)
        self.validate(updates.shape[0])
        return trimmed_mean(updates, self.f), {}
