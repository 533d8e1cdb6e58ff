"""BR-DRAG: DRAG with a trusted root-data reference, for Byzantine resilience (DRAG paper, Sec. IV).

r^t is the server's own update on the vetted root dataset (eqs. 12–13, computed by the
server algorithm). Every selected update, benign or not, is calibrated and averaged:

* λ_m = c (1 − cos(g_m, r)) ∈ [0, 2c]
* eq. 15: v_m = (1 − λ_m) (‖r‖/‖g_m‖) g_m + λ_m r   — every v_m is rescaled to ‖r‖'s scale
* Δ = (1/S) Σ_m v_m   (uniform on purpose: under attack, self-reported sample counts are
  untrusted, so ``weights`` is ignored)

Our choices (the DRAG paper is silent; one non-finite row must never poison θ): a row with a
NaN/Inf entry is replaced by r before calibration and counted in ``agg/nonfinite``; an all-zero row
carries no direction and is replaced by r as well (counted in ``agg/zero_rows``). A replaced row
has cos = 1, λ = 0 and v = r. With ‖r‖ = 0 eq. 15 gives v = 0 for every row, hence Δ = 0. Norms and
cosines are float64, so a finite row of any size (up to float32's max) is calibrated like any
other: ‖v_m‖ ≤ ‖r‖.
"""

from __future__ import annotations

import torch
from pydantic import Field
from torch import Tensor

from fedshield.aggregators._ops import (
    RefGeometry,
    combine_rows,
    masked_stat,
    ref_geometry,
    rho_diagnostics,
    safe_div,
)
from fedshield.aggregators.base import (
    AGGREGATORS,
    Aggregator,
    Diagnostics,
    check_reference,
    normalised_weights,
)
from fedshield.aggregators.drag import Coefficients, calibrate_with
from fedshield.core.params import Params, parse_params


class BrDragParams(Params):
    c: float = Field(
        0.5,
        ge=0.0,
        le=1.0,
        description="DoD scale c: λ_m = c (1 − cos(g_m, r)); c ≤ 1/2 keeps ‖v‖ ≤ ‖r‖; at "
        "most 1 (the DRAG paper's Theorem 2 takes c^t in [1/2, 1])",
    )


def _brdrag_coefficients(
    x: Tensor, r: Tensor, c: float
) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor, RefGeometry]:
    """Per row, in float64: (λ, cos, coefficient of g, coefficient of r, replaced, geometry)."""
    geo = ref_geometry(x, r)
    replaced = geo.nonfinite | (geo.norms == 0)
    cos = torch.where(replaced, 1.0, geo.cos)
    lam = c * (1.0 - cos)
    keep = ~replaced
    coef_g = (1.0 - lam) * safe_div(geo.ref_norm.expand_as(lam), geo.norms, keep)
    coef_r = torch.where(replaced, 1.0, lam)
    return lam, cos, coef_g, coef_r, replaced, geo


def brdrag_calibrate(
    updates: Tensor, reference: Tensor, c: float = 0.5
) -> tuple[Tensor, Tensor, Tensor]:
    """Calibrate each update onto the trusted reference's scale (DRAG paper, eq. 15).

    ``updates`` is ``[S, d]`` (or one ``[d]`` update); returns ``(v, λ, cos)`` in the input
    dtype. Non-finite and all-zero rows come back as v = r (cos = 1, λ = 0). Inputs are not
    modified.
    """
    c = parse_params(BrDragParams, {"c": c}, "brdrag_calibrate").c

    def coefficients(x: Tensor, r: Tensor) -> Coefficients:
        return _brdrag_coefficients(x, r, c)[:5]

    return calibrate_with("brdrag_calibrate", updates, reference, coefficients)


@AGGREGATORS.register("brdrag", tags=["robust", "needs_reference", "dod_scale"])
class BrDrag(Aggregator):
    """BR-DRAG (DRAG paper, eq. 15): rescale every update to ‖r‖ and pull it towards r."""

    params_schema = BrDragParams
    needs_reference = True
    rescales_to_reference = True
    #: The engine may pass NaN/Inf rows through: this rule replaces them by r itself.
    handles_nonfinite = True
    c: float

    def __init__(self, c: float = 0.5) -> None:
        self._configure(c=c)

    def aggregate(
        self, updates: Tensor, weights: Tensor | None = None, *, reference: Tensor | None = None
    ) -> tuple[Tensor, Diagnostics]:
        normalised_weights(updates, weights)  # shape checks only: the mean is uniform (eq. 15)
        r = check_reference("brdrag", reference, updates)
        s = updates.shape[0]
        lam, cos, coef_g, coef_r, replaced, geo = _brdrag_coefficients(updates, r, self.c)
        out = combine_rows(coef_g / s, updates, skip=geo.nonfinite, extra=(coef_r.sum() / s, r))
        kept = ~replaced
        diag = {
            "agg/mean_lambda": float(lam.mean()),
            "agg/mean_cos": masked_stat(cos, kept & geo.defined, "mean"),
            **rho_diagnostics(geo),
            "agg/nonfinite": float(geo.nonfinite.sum()),
            "agg/zero_rows": float((replaced & ~geo.nonfinite).sum()),
        }
        return out, diag
