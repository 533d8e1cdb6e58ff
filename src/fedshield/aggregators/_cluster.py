"""Shared pieces of the clustering defenses (SignGuard, ClippedClustering, FLAME): finite rows,
their norms and pairwise cosine distances in float64, and the clipped mean.

Cosine distances 1 − cos(x_i, x_j) come from the rows' Gram matrix about 0 (one blocked
float64 pass, :func:`~fedshield.aggregators._ops.centered_gram`): cosines are ratios, so
rows of any finite size (up to float32's max) give the same distances as their unit
vectors. A zero row has no direction: its distance to every other row is 1 (orthogonal).
sklearn (a dependency) is imported by the rules that cluster, on first use.
"""

from __future__ import annotations

import torch
from torch import Tensor

from fedshield.aggregators._ops import W, centered_gram, combine_rows, row_sq_norms
from fedshield.aggregators.base import require_finite_rows


class FiniteRows:
    """The finite rows of ``x``: ``keep`` (indices), ``norms`` ([k] float64), ``dropped``."""

    def __init__(self, owner: str, x: Tensor) -> None:
        self.x = x
        self.sq = row_sq_norms(x)
        ok = torch.isfinite(self.sq)
        self.ok = ok
        self.keep = ok.nonzero().squeeze(1)
        self.dropped = x.shape[0] - self.keep.numel()
        require_finite_rows(owner, self.keep.numel(), self.dropped)
        self.norms = self.sq[self.keep].sqrt()

    def cosine_distances(self) -> Tensor:
        """``[k, k]`` float64 1 − cos between the kept rows, in [0, 2], 0 on the diagonal."""
        zero = torch.zeros(self.x.shape[1], dtype=W, device=self.x.device)
        g, _ = centered_gram(self.x, self.keep, zero)
        n = g.diagonal().clamp_min(0.0).sqrt()
        ok = n > 0
        denom = torch.where(ok[:, None] & ok[None, :], n[:, None] * n[None, :], 1.0)
        cos = torch.where(ok[:, None] & ok[None, :], g / denom, 0.0).clamp(-1.0, 1.0)
        return (1.0 - cos).fill_diagonal_(0.0)

    def clipped_mean(self, chosen: Tensor, tau: float) -> Tensor:
        """The mean of the kept rows ``chosen`` (indices into ``keep``), each clipped to norm
        ``tau`` first: Σ min(1, τ/‖x_i‖) x_i / |chosen|."""
        norms = self.norms[chosen]
        scale = torch.where(norms > tau, tau / norms.clamp_min(1e-300), 1.0)
        coef = torch.zeros(self.x.shape[0], dtype=W, device=self.x.device)
        coef[self.keep[chosen]] = scale / chosen.numel()
        return combine_rows(coef, self.x, skip=~self.ok if self.dropped else None)


def lower_median(values: Tensor) -> float:
    """The lower median of a 1-D tensor (an actual value: a client's own norm)."""
    return float(values.sort().values[(values.numel() - 1) // 2])


__all__ = ["FiniteRows", "lower_median"]
