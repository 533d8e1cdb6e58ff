"""Nearest-Neighbour Mixing (Allouah, Farhadkhani, Guerraoui, Gupta, Pinot & Stephan,
AISTATS 2023, "Fixing by Mixing: A Recipe for Optimal Byzantine ML under Heterogeneity").

Every row is replaced by the mean of its n − f nearest rows (itself included), Euclidean
distance: y_i = (1/(n − f)) Σ_{j ∈ N_i} x_j. Followed by any robust rule, NNM gives it the
optimal error under heterogeneous honest data; ByzFL's ``NNM(f)`` computes the same.
Distances are float64 and cancellation-checked (``_ops.pairwise_sq_dists``); on distance
ties the lower index is taken first. The Gram pass leaves ~1e-13 relative noise, enough to
order two equal distances either way, so a row whose cut (its (n − f)-th distance) has
other distances within 1e-9 of it has those recomputed by direct differences, exactly
symmetric, and ordered by (distance, index) (:func:`neighbours`).
"""

from __future__ import annotations

from typing import Any

import torch
from pydantic import Field
from torch import Tensor

from fedshield.aggregators._ops import W, column_blocks, pairwise_sq_dists
from fedshield.core.params import Params
from fedshield.errors import ConfigError
from fedshield.preaggregators.base import PRE_AGGREGATORS, PreAggregator, mix_rows

_F_HELP = (
    "Byzantine rows tolerated: each row becomes the mean of its n − f nearest; unset: "
    "the rule's own f when it has one, else ⌊(n − 1)/2⌋"
)


class NNMParams(Params):
    f: int | None = Field(None, ge=0, description=_F_HELP)


def default_f(f: int | None, num_rows: int) -> int:
    """f as given (capped at n − 1), else ⌊(n − 1)/2⌋: the most an honest majority allows."""
    return (num_rows - 1) // 2 if f is None else min(f, num_rows - 1)


#: Distances within this fraction of a row's largest distance of its cut are re-measured.
_TIE = 1e-9


def direct_sq_dists(x: Tensor, i: int, cols: Tensor) -> Tensor:
    """‖x_i − x_j‖² for j in ``cols`` by direct differences in float64 column blocks: the
    same arithmetic for (i, j) and (j, i), so equal geometry gives bitwise-equal values."""
    out = torch.zeros(cols.numel(), dtype=W, device=x.device)
    for blk in column_blocks(x):
        diff = x[cols, blk].to(W) - x[i, blk].to(W)
        out += (diff * diff).sum(dim=1)
    return out


def neighbours(updates: Tensor, d2: Tensor, k: int) -> Tensor:
    """``[n, k]`` indices of each row's k nearest rows (itself included), ties to the lower
    index: from the Gram distances ``d2``, except where the k-th distance has others within
    ``_TIE`` (relative) of it, which are re-measured directly and ordered by (distance, j)."""
    order = torch.argsort(d2, dim=1, stable=True)
    idx = order[:, :k].clone()
    cut = d2.gather(1, order[:, k - 1 : k])
    tol = _TIE * d2.max(dim=1, keepdim=True).values
    near = (d2 - cut).abs() <= tol
    for i in (near.sum(dim=1) > 1).nonzero().flatten().tolist():
        cand = near[i].nonzero().flatten()
        below = order[i, :k][~near[i, order[i, :k]]]  # surely among the k nearest
        exact = direct_sq_dists(updates, i, cand)
        rank = sorted(range(cand.numel()), key=lambda t: (float(exact[t]), int(cand[t])))
        take = cand[torch.tensor(rank[: k - below.numel()], dtype=torch.long)]
        idx[i] = torch.cat([below, take.to(below.device)])
    return idx


def nnm(updates: Tensor, f: int) -> Tensor:
    """``[n, d]`` NNM of the ``[n, d]`` finite rows: row i → mean of its n − f nearest rows."""
    n = updates.shape[0]
    if not 0 <= f < n:
        raise ValueError(f"nnm: need 0 <= f < n = {n}, got f={f}")
    d2, _ = pairwise_sq_dists(updates)
    k = n - f
    idx = neighbours(updates, d2, k)
    coef = torch.zeros(n, n, dtype=W, device=updates.device)
    coef.scatter_(1, idx, 1.0 / k)
    return mix_rows(coef, updates)


def rule_f(rule: Any) -> int | None:
    """The Byzantine count f of a rule that has one (Krum, Trimmed Mean, Bulyan, ...)."""
    f = getattr(rule, "f", None)
    return f if isinstance(f, int) and not isinstance(f, bool) else None


@PRE_AGGREGATORS.register("nnm")
class NNM(PreAggregator):
    """Nearest-Neighbour Mixing (Allouah et al. 2023): each row becomes the mean of its n − f
    nearest rows."""

    params_schema = NNMParams
    f: int | None

    def transform(
        self, updates: Tensor, weights: Tensor | None, generator: torch.Generator | None
    ) -> tuple[Tensor, Tensor | None]:
        return nnm(updates, default_f(self.f, updates.shape[0])), weights

    def validate(self, num_rows: int) -> None:
        super().validate(num_rows)
        if self.f is not None and self.f >= num_rows:
            raise ConfigError(f"nnm: f={self.f} needs more than f rows, got {num_rows}")

    def adapted(self, num_rows: int) -> PreAggregator | None:
        if num_rows < 1:
            return None
        if self.f is not None and self.f >= num_rows:
            return self.replace(f=num_rows - 1)
        return self

    def bind(self, rule: Any) -> PreAggregator:
        f = rule_f(rule)
        return self.replace(f=f) if self.f is None and f is not None else self


__all__ = ["NNM", "default_f", "direct_sq_dists", "neighbours", "nnm", "rule_f"]
