"""FedAvg's weighted mean (McMahan et al. 2017; DRAG paper, eq. 3): Δ = Σ_m w_m g_m / Σ_m w_m.

The caller chooses the weighting: sample counts n_m for FedAvg, or ``None`` for the DRAG paper's
uniform (1/S) Σ form. One GEMV, so it is the O(S·d) floor every other rule is timed against.
When that GEMV is not finite (a NaN/Inf row, or float32 partial sums that overflowed on
huge finite rows), the non-finite rows are dropped (``agg/nonfinite``) and the mean of the
others is redone in float64, then clamped to the dtype's range. Not a robust rule: one
huge finite row moves it by its size / S.
"""

from __future__ import annotations

import torch
from torch import Tensor

from fedshield.aggregators._ops import all_finite, combine_rows, row_sq_norms
from fedshield.aggregators.base import (
    AGGREGATORS,
    Aggregator,
    Diagnostics,
    kept_weights,
    normalised_weights,
)


def weighted_mean(
    updates: Tensor, w: Tensor, *, uniform: bool = False, owner: str = "mean"
) -> tuple[Tensor, int]:
    """(Σ_m w_m x_m over the finite rows, number of non-finite rows dropped); ``w`` is the
    float64 ``[S]`` weights summing to 1 (``uniform``: they are 1/S, use the plain mean)."""
    if updates.dtype in (torch.float32, torch.float64):
        # the plain reduction is a little faster than a uniform GEMV
        out = updates.mean(dim=0) if uniform else w.to(updates.dtype) @ updates
        if all_finite(out):
            return out, 0
    ok = torch.isfinite(row_sq_norms(updates))
    coef = kept_weights(owner, w, ok)
    return combine_rows(coef, updates, skip=~ok), int((~ok).sum())


@AGGREGATORS.register("mean", tags=["uses_weights", "reference_free"])
class Mean(Aggregator):
    """Weighted mean of the updates (FedAvg, McMahan et al. 2017); uniform when ``weights`` is
    None."""

    def aggregate(
        self, updates: Tensor, weights: Tensor | None = None, *, reference: Tensor | None = None
    ) -> tuple[Tensor, Diagnostics]:
        w = normalised_weights(updates, weights)
        out, dropped = weighted_mean(updates, w, uniform=weights is None)
        return out, {"agg/nonfinite": float(dropped)}
