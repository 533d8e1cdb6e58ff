"""Clipping pre-aggregators: static clipping and ARC (Adaptive Robust Clipping, Allouah,
Guerraoui, Gupta, Jellouli, Rizk & Stephan, 2024, "Boosting Robustness by Clipping
Gradients in Distributed Learning").

* ``clip``: every row of norm above c is scaled to norm c (ByzFL ``Clipping(c)``).
* ``arc``: the ⌊2f/n · (n − f)⌋ rows of largest norm are clipped to the norm of the
  largest row left unclipped (ByzFL ``ARC(f)``): the radius adapts to the honest scale.

Norms are float64 (row by row: ``_ops.row_norms``); a clipped row is multiplied by its
factor r/‖g‖ ≤ 1 in the input's dtype, as ByzFL does, so it cannot overflow, and the rows
left alone are copied, not rescaled (no float64 copy of the matrix). Ties in norm are
ordered by row index (a stable sort), as ByzFL's.
"""

from __future__ import annotations

from typing import Any

import torch
from pydantic import Field
from torch import Tensor

from fedshield.aggregators._ops import W, row_norms
from fedshield.core.params import Params
from fedshield.errors import ConfigError
from fedshield.preaggregators.base import PRE_AGGREGATORS, PreAggregator
from fedshield.preaggregators.nnm import default_f, rule_f


def scale_to(updates: Tensor, norms: Tensor, radius: Tensor) -> Tensor:
    """Rows with norm above ``radius`` ([n] or scalar) scaled down to it: the factor in
    float64, the product in the input's dtype (a factor ≤ 1 cannot overflow it)."""
    factor = torch.where(norms > radius, radius / norms.clamp_min(1e-300), 1.0)
    if updates.device.type != "cpu":
        return updates * factor.to(updates.dtype)[:, None]  # one kernel; x·1 = x exactly
    # On CPU a broadcast [n, d] × [n, 1] product runs ~8× slower than row-wise products
    # (13.8 vs 1.8 ms at n = 50, d = 1e5, one thread): one pass, row by row.
    out = torch.empty_like(updates)
    for i, c in enumerate(factor.tolist()):
        if c < 1.0:
            torch.mul(updates[i], c, out=out[i])
        else:
            out[i].copy_(updates[i])
    return out


def clip(updates: Tensor, c: float) -> Tensor:
    """Static clipping: rows of norm > c scaled to norm c."""
    norms = row_norms(updates)
    return scale_to(updates, norms, torch.tensor(c, dtype=W, device=updates.device))


def arc_count(n: int, f: int) -> int:
    """Rows ARC clips: ⌊(2f/n)(n − f)⌋."""
    return int((2 * f / n) * (n - f))


def arc(updates: Tensor, f: int) -> Tensor:
    """ARC: clip the ⌊(2f/n)(n − f)⌋ largest rows to the largest norm among the others."""
    n = updates.shape[0]
    if not 0 <= f <= n:
        raise ValueError(f"arc: need 0 <= f <= n = {n}, got f={f}")
    clipped = arc_count(n, f)
    if clipped == 0:
        return updates.clone()
    norms = row_norms(updates)
    order = torch.argsort(norms, stable=True)
    radius = norms[order[n - clipped - 1]]
    return scale_to(updates, norms, radius)


class ClipParams(Params):
    c: float = Field(2.0, gt=0.0, description="clipping radius c (ByzFL's default 2.0)")


class ARCParams(Params):
    f: int | None = Field(
        None,
        ge=0,
        description="Byzantine rows tolerated; unset: the rule's own f, else ⌊(n − 1)/2⌋",
    )


@PRE_AGGREGATORS.register("clip")
class StaticClip(PreAggregator):
    """Static clipping: every row scaled to norm at most c before the rule sees it."""

    params_schema = ClipParams
    c: float

    def transform(
        self, updates: Tensor, weights: Tensor | None, generator: torch.Generator | None
    ) -> tuple[Tensor, Tensor | None]:
        return clip(updates, self.c), weights


@PRE_AGGREGATORS.register("arc")
class ARC(PreAggregator):
    """Adaptive Robust Clipping (Allouah et al. 2024): the largest rows are clipped to the norm
    of the largest other row."""

    params_schema = ARCParams
    f: int | None

    def transform(
        self, updates: Tensor, weights: Tensor | None, generator: torch.Generator | None
    ) -> tuple[Tensor, Tensor | None]:
        n = updates.shape[0]
        f = (n - 1) // 2 if self.f is None else min(self.f, n)
        return arc(updates, f), weights

    def validate(self, num_rows: int) -> None:
        super().validate(num_rows)
        if self.f is not None and self.f > num_rows:
            raise ConfigError(f"arc: f={self.f} exceeds the {num_rows} rows")

    def adapted(self, num_rows: int) -> PreAggregator | None:
        if num_rows < 1:
            return None
        return self.replace(f=num_rows) if self.f is not None and self.f > num_rows else self

    def bind(self, rule: Any) -> PreAggregator:
        f = rule_f(rule)
        return self.replace(f=f) if self.f is None and f is not None else self


__all__ = ["ARC", "StaticClip", "arc", "arc_count", "clip", "default_f", "scale_to"]
