"""Nearest-Neighbour Mixing (Allouah, Farhadkhani, Guerraoui, Gupta, Pinot & Stephan,
AISTATS 2023, "Fixing by Mixing: A Recipe for Optimal Byzantine ML under Heterogeneity").

Every row is replaced by the mean of its n − f nearest rows (itself included), Euclidean
distance: y_i = (1/(n − f)) Σ_{j ∈ N_i} x_j. Followed by any robust rule, NNM gives it the
optimal error under heterogeneous honest data; ByzFL's ``NNM(f)`` computes the same.
Distances are float64 and cancellation-checked (``_ops.pairwise_sq_dists``); on exact
distance ties the lower index is taken first (``torch.topk``'s order).
"""

from __future__ import annotations

from typing import Any

import torch
from pydantic import Field
from torch import Tensor

from fedshield.aggregators._ops import W, pairwise_sq_dists
from fedshield.core.params import Params
from fedshield.errors import ConfigError
from fedshield.preaggregators.base import PRE_AGGREGATORS, PreAggregator, check_rows, mix_rows

_F_HELP = (
    "Byzantine rows tolerated: each row becomes the mean of its n − f nearest; unset: "
    "the rule's own f when it has one, else ⌊(n − 1)/2⌋"
)


class NNMParams(Params):
    f: int | None = Field(None, ge=0, description=_F_HELP)


def default_f(f: int | None, num_rows: int) -> int:
    """f as given (capped at n − 1), else ⌊(n − 1)/2⌋: the most an honest majority allows."""
    return (num_rows - 1) // 2 if f is None else min(f, num_rows - 1)


def nnm(updates: Tensor, f: int) -> Tensor:
    """``[n, d]`` NNM of the ``[n, d]`` finite rows: row i → mean of its n − f nearest rows."""
    n = updates.shape[0]
    if not 0 <= f < n:
        raise ValueError(f"nnm: need 0 <= f < n = {n}, got f={f}")
    d2, _ = pairwise_sq_dists(updates)
    k = n - f
    idx = d2.topk(k, dim=1, largest=False).indices
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

    def __call__(
        self, updates: Tensor, weights: Tensor | None, *, generator: torch.Generator | None = None
    ) -> tuple[Tensor, Tensor | None]:
        check_rows("nnm", updates, weights)
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


__all__ = ["NNM", "default_f", "nnm", "rule_f"]
