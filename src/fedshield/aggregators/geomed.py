"""Geometric median by the smoothed Weiszfeld algorithm: ``geomed``, ``rfa``, ``raga`` (DRAG paper,
Sec. VI-B).

GeoMed(x_1..x_S; α) = argmin_z Σ_i α_i ‖z − x_i‖, solved as in RFA (Pillutla, Kakade &
Harchaoui, IEEE TSP 2022): start at the α-weighted mean, then repeat

    β_i = α_i / max(ν, ‖z − x_i‖),   z ← Σ_i β_i x_i / Σ_i β_i

for at most ``max_iter`` iterations. Defaults: ν = 1e-6, 100 iterations, tol = 1e-6 (ours; the DRAG
paper gives none).

**Stopping rule** (our addition): stop once the objective Σ_i α_i ‖z − x_i‖
improves by less than ``tol`` relatively *and* the iterate moves by less than ``tol`` times
the typical distance to the rows, ‖z_{k+1} − z_k‖ ≤ tol · wmedian_i ‖z_{k+1} − x_i‖ (the
α-weighted median). The objective alone stops early when Byzantine rows are far away: it
is then dominated by their distances, so real progress near the honest rows no longer shows
in it (16 honest rows + 12 rows at μ + 10^6 σ, d = 100: it stopped 1.1 ‖σ‖ from the
converged median; with the iterate rule, 2e-6 ‖σ‖).

Every iterate is a convex combination z = Σ_j β_j x_j, so ‖z − x_i‖² = βᵀGβ − 2(Gβ)_i + G_ii
with G the float64 Gram matrix of the rows about a centre c: one O(S²·d) pass up front, then
each iteration is O(S²), and one GEMV builds z at the end. When the distances become small
next to ‖x_i − c‖ (the iterate sits near rows far from c, e.g. next to the honest cluster
while the centre was pulled by outliers), digits cancel: G is then rebuilt about the
current z (``agg/recentred``, at most 4 times), which makes those distances exact again.

* ``geomed`` / ``rfa`` use the caller's weights (RFA: sample counts n_m, tag
  ``sample_weighted``: the server passes the counts it trusts), ``raga`` is uniform.
* RFA is stated on models, θ^{t+1} = GeoMed({θ_m^{t,U}}). The minimiser is translation
  equivariant, and so is this solver (mean start, weights from distances, relative stopping
  rules), hence GeoMed({θ^t + g_m}) = θ^t + GeoMed({g_m}) iterate by iterate: the server
  aggregates pseudo-gradients and adds θ^t, like every other rule.
* ``init="zeros"`` starts from z = 0 instead (ByzFL's ``GeometricMedian``); with ``tol=0`` and
  ``max_iter=T`` this reproduces ByzFL's fixed T iterations exactly. Not translation
  equivariant, so not the RFA default.
* Rows holding NaN/Inf are dropped (``agg/nonfinite``), the others' weights renormalised.
* With ``tol > 0``, finite rows beyond 1e6 × the weighted-median row norm are first shrunk
  onto that radius (``agg/shrunk``; see :func:`_shrink_far_rows`): the minimiser barely
  moves, and Weiszfeld no longer has to descend from an iterate at 1e29 in float64.
  ``tol = 0`` (ByzFL's fixed T iterations) is left exact.
"""

from __future__ import annotations

import math
from typing import Literal

import torch
from pydantic import Field
from torch import Tensor

from fedshield.aggregators._ops import (
    _CANCEL,
    centered_gram,
    combine_rows,
    row_norms,
    weighted_median,
)
from fedshield.aggregators.base import (
    AGGREGATORS,
    Aggregator,
    Diagnostics,
    kept_weights,
    normalised_weights,
)
from fedshield.core.params import Params

#: Rebuilding G about the iterate costs two passes over the rows; a few suffice.
_MAX_RECENTRE = 4


#: Ceiling of ``max_iter``: Weiszfeld converges linearly; 10⁴ iterations of an S × d
#: pass is already minutes per round at d = 10⁷ (a round must end).
MAX_ITER = 10_000


class GeoMedParams(Params):
    nu: float = Field(1e-6, gt=0.0, description="smoothing ν: distances are floored at ν")
    max_iter: int = Field(
        100, ge=0, le=MAX_ITER, description="at most this many Weiszfeld iterations"
    )
    tol: float = Field(
        1e-6,
        ge=0.0,
        description="relative tolerance of both stopping rules (objective and iterate); "
        "0 runs exactly max_iter iterations",
    )
    init: Literal["mean", "zeros"] = Field(
        "mean", description="start at the weighted mean (RFA) or at 0 (ByzFL)"
    )


#: Rows beyond this many times the weighted-median row norm are shrunk onto that radius.
_FAR = 1e6


def _shrink_far_rows(updates: Tensor, alpha: Tensor) -> tuple[Tensor, int]:
    """Rows (finite) farther from 0 than ``_FAR`` × the α-weighted median row norm, scaled
    back onto that radius. A far row pulls the geometric median only through its direction
    (the gradient of ‖z − x‖ is a unit vector), so this changes the minimiser by about
    1/_FAR of the honest scale, while an outlier at 1e30 next to rows of norm 1e-1 would
    leave Weiszfeld, started at the mean, 30 orders of magnitude to descend through float64
    cancellation (the round-loop fuzz: the iterate stopped 4e8 from the honest rows)."""
    norms = row_norms(updates)
    finite = torch.isfinite(norms)
    if int(finite.sum()) < 2:
        return updates, 0
    ref = float(weighted_median(norms[finite], alpha[finite]))
    positive = finite & (norms > 0)
    if ref == 0.0 and bool(positive.any()):  # zero rows (a padded round's votes): no scale
        ref = float(weighted_median(norms[positive], alpha[positive]))
    far = finite & (norms > _FAR * ref) if ref > 0 else torch.zeros_like(finite)
    n = int(far.sum())
    if not n:
        return updates, 0
    out = updates.clone()
    idx = far.nonzero().squeeze(1)
    scale = (_FAR * ref) / norms[idx]
    out[idx] = (updates[idx].double() * scale[:, None]).to(updates.dtype)
    return out, n


def geometric_median(
    updates: Tensor,
    alpha: Tensor,
    *,
    nu: float = 1e-6,
    max_iter: int = 100,
    tol: float = 1e-6,
    init: str = "mean",
    owner: str = "geomed",
) -> tuple[Tensor, dict[str, float]]:
    """Smoothed Weiszfeld with weights ``alpha`` (float64, summing to 1) over the finite
    rows: ``(z [d] in the input dtype, diagnostics)`` (iterations, objective, recentred,
    nonfinite)."""
    updates, shrunk = _shrink_far_rows(updates, alpha) if tol > 0 else (updates, 0)
    g, ok = centered_gram(updates)
    dropped = int((~ok).sum())
    a_full = kept_weights(owner, alpha, ok) if dropped else alpha
    keep = ok.nonzero().squeeze(1)
    if dropped:
        g = g[keep][:, keep]
    a = a_full[keep]
    recentred = 0

    def dists(beta: Tensor) -> tuple[Tensor, Tensor]:
        """(‖z − x_i‖ for z = Σ β_j x_j, its cancellation floor: ‖x_i − c‖² + ‖z − c‖²)."""
        gb = g @ beta
        q = beta @ gb
        return (q - 2.0 * gb + g.diagonal()).clamp_min(0.0).sqrt(), q + g.diagonal()

    def full(beta: Tensor) -> Tensor:
        return torch.zeros_like(alpha).index_copy_(0, keep, beta)

    def checked(beta: Tensor) -> Tensor:
        """Distances for β, rebuilding G about z first when cancellation spoils them."""
        nonlocal g, recentred
        dist, scale = dists(beta)
        while recentred < _MAX_RECENTRE and bool(
            (dist.clamp_min(nu).square() < _CANCEL * scale).any()
        ):
            recentred += 1
            centre = combine_rows(full(beta), updates, skip=~ok)
            g, _ = centered_gram(updates, keep, centre)
            dist, scale = dists(beta)
        return dist

    beta: Tensor | None
    if init == "mean":
        beta = a
        dist = checked(a)
    else:  # z = 0 lies outside the rows' affine hull: measure ‖x_i‖ directly, once
        beta = None
        dist = row_norms(updates)[keep]
    obj = float(a @ dist)
    it = 0
    while it < max_iter:
        it += 1
        inv = a / dist.clamp_min(nu)
        new_beta = inv / inv.sum()
        dist = checked(new_beta)
        new_obj = float(a @ dist)
        if beta is None:  # from z = 0 the first move is not measured in G
            step = math.inf
        else:
            delta = new_beta - beta
            step = float((delta @ g @ delta).clamp_min(0.0).sqrt())
        improved = abs(obj - new_obj)
        beta, obj = new_beta, new_obj
        if tol > 0 and improved <= tol * new_obj and step <= tol * float(weighted_median(dist, a)):
            break
    diag = {
        "agg/iterations": float(it),
        "agg/objective": obj,
        "agg/recentred": float(recentred),
        "agg/nonfinite": float(dropped),
        "agg/shrunk": float(shrunk),
    }
    if beta is None:  # init="zeros" with max_iter=0
        return updates.new_zeros(updates.shape[1]), diag
    return combine_rows(full(beta), updates, skip=~ok), diag


@AGGREGATORS.register("geomed", tags=["robust", "reference_free", "uses_weights"])
class GeoMed(Aggregator):
    """Weighted geometric median by smoothed Weiszfeld (RFA's solver, Pillutla et al.)."""

    params_schema = GeoMedParams
    #: False for RAGA: the median of the updates, every client counted once.
    use_weights: bool = True
    nu: float
    max_iter: int
    tol: float
    init: str

    def __init__(
        self, nu: float = 1e-6, max_iter: int = 100, tol: float = 1e-6, init: str = "mean"
    ) -> None:
        self._configure(nu=nu, max_iter=max_iter, tol=tol, init=init)

    def aggregate(
        self, updates: Tensor, weights: Tensor | None = None, *, reference: Tensor | None = None
    ) -> tuple[Tensor, Diagnostics]:
        alpha = normalised_weights(updates, weights)  # validates the weights' shape either way
        if not self.use_weights:
            alpha = torch.full_like(alpha, 1.0 / alpha.numel())
        return geometric_median(
            updates,
            alpha,
            nu=self.nu,
            max_iter=self.max_iter,
            tol=self.tol,
            init=self.init,
            owner=self._name,
        )


@AGGREGATORS.register("rfa", tags=["robust", "reference_free", "uses_weights", "sample_weighted"])
class RFA(GeoMed):
    """RFA (Pillutla 2022): sample-weighted geometric median; θ + GeoMed(g) = GeoMed(θ_m)."""


@AGGREGATORS.register("raga", tags=["robust", "reference_free"])
class RAGA(GeoMed):
    """RAGA: θ^{t+1} = θ^t + GeoMed({g_m}) with uniform weights (DRAG paper, Sec. VI-B)."""

    use_weights = False
