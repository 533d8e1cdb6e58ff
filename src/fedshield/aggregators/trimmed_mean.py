"""Coordinate-wise trimmed mean (Yin et al., ICML 2018).

Per coordinate, drop the f largest and the f smallest values and average the S − 2f left
(needs 2f < S). ``f`` is a count, as in ByzFL's ``TrMean(f)``; Flower's
``aggregate_trimmed_avg(proportiontocut=β)`` trims ⌊βS⌋ per side, i.e. f = ⌊βS⌋.
Sample weights play no part (an order statistic of the updates). Rows holding NaN/Inf are
dropped first (``agg/nonfinite``); S is then the number of finite rows. The mean of the
kept values is taken in float64, so huge finite values cannot overflow it.
"""

from __future__ import annotations

import torch
from torch import Tensor

from fedshield.aggregators._majority import HonestMajorityRule
from fedshield.aggregators._ops import W, to_dtype
from fedshield.aggregators._select import window_mean
from fedshield.aggregators.base import (
    AGGREGATORS,
    Diagnostics,
    f_field,
    normalised_weights,
)
from fedshield.aggregators.mean import weighted_mean
from fedshield.aggregators.median import finite_rows
from fedshield.core.params import Params


class TrimmedMeanParams(Params):
    f: int | None = f_field("values trimmed per side and coordinate (needs 2f < S)")


def trimmed_mean(updates: Tensor, f: int) -> Tensor:
    """``[d]`` mean of each coordinate after dropping its f largest and f smallest values."""
    s = updates.shape[0]
    if f == 0:
        w = torch.full((s,), 1.0 / s, dtype=W, device=updates.device)
        return weighted_mean(updates, w, uniform=True, owner="trimmed_mean")[0]
    return to_dtype(window_mean(updates, s - 2 * f, start=f), updates.dtype)


@AGGREGATORS.register("trimmed_mean", tags=["robust", "reference_free", "min_clients"])
class TrimmedMean(HonestMajorityRule):
    """Coordinate-wise trimmed mean (Yin 2018): drop the f largest and f smallest values."""

    params_schema = TrimmedMeanParams

    def aggregate(
        self, updates: Tensor, weights: Tensor | None = None, *, reference: Tensor | None = None
    ) -> tuple[Tensor, Diagnostics]:
        normalised_weights(updates, weights)
        x, dropped = finite_rows("trimmed_mean", updates)
        f = self.checked_f(x.shape[0], dropped)
        return trimmed_mean(x, f), {"agg/nonfinite": float(dropped)}
