"""Geometric median by the smoothed Weiszfeld algorithm: ``geomed``, ``rfa``, ``raga`` (SPEC §5).

GeoMed(x_1..x_S; α) = argmin_z Σ_i α_i ‖z − x_i‖, solved as in RFA (Pillutla, Kakade &
Harchaoui, IEEE TSP 2022): start at the α-weighted mean, then repeat

    β_i = α_i / max(ν, ‖z − x_i‖),   z ← Σ_i β_i x_i / Σ_i β_i

for at most ``max_iter`` iterations, stopping once the objective Σ_i α_i ‖z − x_i‖ improves
by less than ``tol`` relatively. SPEC defaults: ν = 1e-6, 100 iterations, tol = 1e-6.

Every iterate is a convex combination z = Σ_j β_j x_j, so ‖z − x_i‖² = βᵀGβ − 2(Gβ)_i + G_ii
with G the Gram matrix of the (mean-centred) rows: one O(S²·d) matmul pass up front, then
each iteration is O(S²) on an ``[S, S]`` float64 matrix, and one GEMV builds z at the end.
The cost hardly depends on the iteration count; a textbook loop pays O(S·d) per iteration.

* ``geomed`` / ``rfa`` use the caller's weights (RFA: sample counts n_m), ``raga`` is uniform.
* RFA is stated on models, θ^{t+1} = GeoMed({θ_m^{t,U}}). The minimiser is translation
  equivariant, and so is this solver (mean start, weights from distances, relative stopping
  rule), hence GeoMed({θ^t + g_m}) = θ^t + GeoMed({g_m}) iterate by iterate: the server
  aggregates pseudo-gradients and adds θ^t, like every other rule.
* ``init="zeros"`` starts from z = 0 instead (ByzFL's ``GeometricMedian``); with ``tol=0`` and
  ``max_iter=T`` this reproduces ByzFL's fixed T iterations exactly. Not translation
  equivariant, so not the RFA default.
"""

from __future__ import annotations

import torch
from torch import Tensor

from fedshield.aggregators._ops import centered_gram, check_float, check_int, row_norms
from fedshield.aggregators.base import (
    AGGREGATORS,
    Aggregator,
    ConfigError,
    Diagnostics,
    check_updates,
)

_INITS = ("mean", "zeros")


def geometric_median(
    updates: Tensor,
    alpha: Tensor,
    *,
    nu: float = 1e-6,
    max_iter: int = 100,
    tol: float = 1e-6,
    init: str = "mean",
) -> tuple[Tensor, int, float]:
    """Smoothed Weiszfeld with normalised weights ``alpha``: (z [d], iterations, objective)."""
    # The S-space iteration runs in float64: it is tiny, and it keeps the distance
    # formula's cancellation at float64 level on top of the input-precision Gram matrix.
    g = centered_gram(updates).to(torch.float64)
    a = alpha.to(torch.float64)
    g_diag = g.diagonal()

    def dists(beta: Tensor) -> Tensor:
        gb = g @ beta
        return (beta @ gb - 2.0 * gb + g_diag).clamp_min(0.0).sqrt()

    if init == "mean":
        beta: Tensor | None = a
        dist = dists(a)
    else:  # z = 0 lies outside the rows' affine hull: measure ‖x_i‖ directly, once
        beta = None
        dist = row_norms(updates).to(torch.float64)
    obj = float(a @ dist)
    it = 0
    while it < max_iter:
        it += 1
        inv = a / dist.clamp_min(nu)
        beta = inv / inv.sum()
        dist = dists(beta)
        new_obj = float(a @ dist)
        improved = abs(obj - new_obj)
        obj = new_obj
        if tol > 0 and improved <= tol * new_obj:  # tol = 0: always max_iter iterations
            break
    if beta is None:  # init="zeros" with max_iter=0
        return updates.new_zeros(updates.shape[1]), 0, obj
    return beta.to(updates.dtype) @ updates, it, obj


@AGGREGATORS.register("geomed")
class GeoMed(Aggregator):
    """Weighted geometric median by smoothed Weiszfeld (SPEC §5 RFA solver)."""

    #: False for RAGA: the median of the updates, every client counted once.
    use_weights: bool = True
    _name = "geomed"

    def __init__(
        self, nu: float = 1e-6, max_iter: int = 100, tol: float = 1e-6, init: str = "mean"
    ) -> None:
        self.nu = check_float(self._name, "nu", nu, strict=True)
        self.max_iter = check_int(self._name, "max_iter", max_iter)
        self.tol = check_float(self._name, "tol", tol)
        if init not in _INITS:
            raise ConfigError(f"{self._name}: init must be one of {_INITS}, got {init!r}")
        self.init = init

    def aggregate(
        self, updates: Tensor, weights: Tensor | None = None, *, reference: Tensor | None = None
    ) -> tuple[Tensor, Diagnostics]:
        alpha = check_updates(updates, weights)  # validates the weights' shape either way
        if not self.use_weights:
            alpha = torch.full_like(alpha, 1.0 / alpha.numel())
        z, iters, obj = geometric_median(
            updates, alpha, nu=self.nu, max_iter=self.max_iter, tol=self.tol, init=self.init
        )
        return z, {"agg/iterations": float(iters), "agg/objective": obj}


@AGGREGATORS.register("rfa")
class RFA(GeoMed):
    """RFA (Pillutla 2022): sample-weighted geometric median; θ + GeoMed(g) = GeoMed(θ_m)."""

    _name = "rfa"


@AGGREGATORS.register("raga")
class RAGA(GeoMed):
    """RAGA: θ^{t+1} = θ^t + GeoMed({g_m}) with uniform weights (SPEC §5)."""

    use_weights = False
    _name = "raga"
