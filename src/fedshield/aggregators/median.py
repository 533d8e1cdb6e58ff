"""Coordinate-wise median (Yin et al., ICML 2018).

For even S the median of a coordinate is the mean of its two middle values, as in
``numpy.median``, ``torch.quantile(q=0.5)`` (ByzFL) and Flower's ``aggregate_median``.
Sample weights play no part (an order statistic of the updates). Rows holding NaN/Inf are
dropped first (``agg/nonfinite``, one blocked float64 pass to find them); the midpoint of
two huge middle values (±3e38 in float32) is taken in float64, so it cannot overflow.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import Tensor

from fedshield.aggregators._ops import W, row_sq_norms
from fedshield.aggregators._select import partitioned, selectable, selection_blocks
from fedshield.aggregators.base import (
    AGGREGATORS,
    Aggregator,
    Diagnostics,
    normalised_weights,
    require_finite_rows,
)


def _mean_of_middles(x: Tensor) -> Tensor:
    """Definition for even S: sort, average the two middle values in float64 (no overflow);
    NaN if a NaN is present (as numpy.median and torch.median do — sort would quietly move
    NaN to the end)."""
    s = x.shape[0]
    # The float64 midpoint of two values of x's dtype lies between them: the cast back
    # rounds into [a, b], so it never overflows (and ±inf stays ±inf).
    mid = torch.sort(x, dim=0).values[s // 2 - 1 : s // 2 + 1].to(W).mean(dim=0).to(x.dtype)
    return mid.masked_fill(torch.isnan(x).any(dim=0), torch.nan)


def _median_by_selection(x: Tensor) -> Tensor:
    """The definition (middle value; for even S the float64 midpoint of the two middle
    values, cast back) from a selection of the middle rank(s) instead of a sort, per
    block (:mod:`._select`: ≈ 1.5x faster than ``torch.quantile`` on one CPU thread at
    S = 40, d = 10^5, and at or below Flower's ``numpy.median``)."""
    s = x.shape[0]
    lo, hi = (s - 1) // 2, s // 2
    out = torch.empty(x.shape[1], dtype=x.dtype)
    for blk in selection_blocks(x):
        part = partitioned(x[:, blk], [lo, hi, s - 1])
        if lo == hi:
            mid = torch.from_numpy(part[lo].copy())
        else:  # float64 midpoint: between a and b, so the cast back cannot overflow
            pair = part[lo : hi + 1].astype(np.float64)
            mid = torch.from_numpy((pair[0] + pair[1]) * 0.5).to(x.dtype)
        # NaN ranks last: a column whose largest value is NaN holds one, its median is NaN
        out[blk] = mid.masked_fill_(torch.from_numpy(np.isnan(part[s - 1])), torch.nan)
    return out


def coordinate_median(updates: Tensor) -> Tensor:
    """``[d]`` coordinate-wise median of the rows of ``updates`` (NaN where a column has one)."""
    if selectable(updates) and updates.shape[0] > 0:
        return _median_by_selection(updates)
    if updates.shape[0] % 2 == 1:
        # A selection, no full sort; returns the middle value, exact for odd S.
        return torch.median(updates, dim=0).values
    if updates.dtype not in (torch.float32, torch.float64):  # quantile's dtypes
        return _mean_of_middles(updates)
    # torch.quantile selects instead of sorting (~1.4x faster than a sort on CPU) and, at
    # q = 0.5, interpolates halfway between the two middle values. Its lerp turns a middle
    # value of ±inf into NaN and overflows on two huge ones of opposite signs, so those
    # (rare) columns are redone by the definition.
    try:
        out = torch.quantile(updates, 0.5, dim=0)
    except RuntimeError:  # older torch refuses inputs of more than 2^24 elements
        return _mean_of_middles(updates)
    bad = ~torch.isfinite(out)
    if bool(bad.any()):
        out[bad] = _mean_of_middles(updates[:, bad])
    return out


def finite_rows(owner: str, updates: Tensor) -> tuple[Tensor, int]:
    """(the rows without NaN/Inf — ``updates`` itself when all are finite, dropped count)."""
    ok = torch.isfinite(row_sq_norms(updates))
    dropped = int((~ok).sum())
    require_finite_rows(owner, updates.shape[0] - dropped, dropped)
    return (updates[ok] if dropped else updates), dropped


@AGGREGATORS.register("median", tags=["robust", "reference_free"])
class Median(Aggregator):
    """Coordinate-wise median (Yin 2018); mean of the two middle values for even S."""

    def aggregate(
        self, updates: Tensor, weights: Tensor | None = None, *, reference: Tensor | None = None
    ) -> tuple[Tensor, Diagnostics]:
        normalised_weights(updates, weights)
        x, dropped = finite_rows("median", updates)
        return coordinate_median(x), {"agg/nonfinite": float(dropped)}
