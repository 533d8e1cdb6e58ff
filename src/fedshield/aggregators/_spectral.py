"""Shared numerics of the covariance rules (CAF, SMEA): the rows' Gram matrix about a robust
centre, and the top eigenpair of a (weighted, subset) covariance computed from it.

The rules need covariances of subsets of the rows, Σ_K = (1/|K|) Σ_{i∈K} (x_i − μ_K)(x_i −
μ_K)ᵀ, and their largest eigenvalue and direction. Σ_K is d × d; its non-zero spectrum is
that of the |K| × |K| centred Gram matrix J G_K J (J = I − 11ᵀ/|K|), so after one blocked
float64 Gram pass over the rows everything is O(S³), with no further pass over d.

The Gram matrix is taken about the coordinate-wise median of the finite rows, not their
mean: with an outlier at 1e30 the mean sits 1e29 from every honest row, and the honest
rows' Gram entries (their spread, ~1) would then be lost to cancellation in entries of
~1e58; about the median they are exact to float64 precision.
"""

from __future__ import annotations

import torch
from pydantic import Field
from torch import Tensor

from fedshield.aggregators._ops import W, _block, centered_gram, column_blocks, row_sq_norms
from fedshield.aggregators.base import require_finite_rows
from fedshield.aggregators.median import coordinate_median
from fedshield.core.params import Params


class PowerMethodParams(Params):
    """The eigen-solver fields of CAF and SMEA."""

    power_iters: int | None = Field(
        None,
        ge=1,
        le=1000,
        description="unset: exact eigenvalues (the paper); k: k power-method steps from a "
        "random start per eigenpair, ByzFL's estimator (it uses 1)",
    )
    seed: int = Field(0, ge=0, description="seed of the power method's random starts")


class RobustGram:
    """``g``: [k, k] float64 Gram matrix of the finite rows ``keep`` about ``centre`` (the
    coordinate-wise median of those rows, float64 [d]); ``dropped``: non-finite rows."""

    def __init__(self, owner: str, x: Tensor) -> None:
        ok = torch.isfinite(row_sq_norms(x))
        self.keep = ok.nonzero().squeeze(1)
        self.dropped = x.shape[0] - self.keep.numel()
        require_finite_rows(owner, self.keep.numel(), self.dropped)
        rows = x if not self.dropped else x[self.keep]
        self.centre = coordinate_median(rows.to(W) if rows.dtype == torch.float16 else rows).to(W)
        self.g, _ = centered_gram(x, self.keep, self.centre)
        self.x = x

    def projections(self, v: Tensor) -> Tensor:
        """``[k]`` float64 ⟨x_i − centre, v⟩ over the kept rows (one blocked GEMV)."""
        out = torch.zeros(self.keep.numel(), dtype=W, device=self.x.device)
        rows = None if not self.dropped else self.keep
        for blk in column_blocks(self.x):
            out += (_block(self.x, blk, rows) - self.centre[blk]) @ v[blk]
        return out


def centred(g: Tensor, c: Tensor) -> Tensor:
    """The Gram matrix of the rows x_i − μ_c, μ_c = Σ c_j x_j / Σ c_j, from ``g`` (about any
    centre): P g Pᵀ with P = I − 1 (c/Σc)ᵀ."""
    a = c / c.sum()
    ga = g @ a
    return g - ga[:, None] - ga[None, :] + a @ ga


def random_unit(gen: torch.Generator, d: int, device: torch.device) -> Tensor:
    """ByzFL's power-method start: ``torch.randn(d)`` (float32, drawn from ``gen``) made a
    unit vector, as float64."""
    v = torch.randn(d, generator=gen).to(W)
    return (v / v.norm()).to(device)


__all__ = ["PowerMethodParams", "RobustGram", "centred", "random_unit"]
