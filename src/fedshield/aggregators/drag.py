"""DRAG: divergence-based adaptive aggregation against client drift (DRAG paper, Sec. III).

Given the server's reference direction r^t (the momentum of past calibrated updates, kept by
the server algorithm, not here), every update is pulled towards r by its degree of
divergence (DoD):

* eq. 10: λ_m = c · (1 − cos(g_m, r)) ∈ [0, 2c]
* eq. 11: v_m = (1 − λ_m) g_m + λ_m (‖g_m‖ / ‖r‖) r
* Δ = Σ_m w_m v_m — the paper's (1/S) Σ_m v_m when ``weights`` is None (our choice: honour
  the caller's weights when given, as FedAvg does; pass None to reproduce the paper).

Zero-norm guard (ours; eq. 11 is undefined there): if ‖r‖ = 0 or ‖g_m‖ = 0 then v_m = g_m (λ_m is
taken as 0). The aggregate never materialises v: Δ = Σ_m w_m (1 − λ_m) g_m + (Σ_m w_m λ_m
‖g_m‖/‖r‖) r, one blocked float64 pass for the norms and ⟨g_m, r⟩ and one GEMV for the sum.

Not a robust rule: rows holding NaN/Inf are dropped (``agg/nonfinite``, the weights of the
others renormalised), but a huge finite row keeps its size (v_m has norm ‖g_m‖).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeAlias

import torch
from pydantic import Field
from torch import Tensor

from fedshield.aggregators._ops import (
    RefGeometry,
    W,
    column_blocks,
    combine_rows,
    masked_stat,
    ref_geometry,
    rho_diagnostics,
    safe_div,
    to_dtype,
)
from fedshield.aggregators.base import (
    AGGREGATORS,
    Aggregator,
    Diagnostics,
    check_reference,
    kept_weights,
    normalised_weights,
)
from fedshield.core.params import Params, parse_params

#: Our default for DRAG's c (the DRAG paper gives none; we tuned it on bundled data): c = 0.2 was
#: the best or tied-best final accuracy in the c sweep of docs/results/drag.md, and c ≥ 0.3
#: diverged there (λ near 1 keeps following a stale reference). BR-DRAG keeps 0.5
#: (docs/results/brdrag.md).
DEFAULT_C = 0.2


class DragParams(Params):
    c: float = Field(
        DEFAULT_C,
        ge=0.0,
        le=1.0,
        description="DoD scale c of eq. 10: λ_m = c (1 − cos) ∈ [0, 2c]; at most 1 "
        "(λ ≤ 2, the range the DRAG paper studies)",
    )


def _drag_coefficients(x: Tensor, r: Tensor, c: float) -> tuple[Tensor, Tensor, RefGeometry]:
    """(λ [S], coefficient of r [S], geometry) of eq. 10–11 for every row, in float64."""
    geo = ref_geometry(x, r)
    lam = torch.where(geo.defined, c * (1.0 - geo.cos), 0.0)
    coef_r = safe_div(lam * geo.norms, geo.ref_norm.expand_as(lam), geo.defined)
    return lam, coef_r, geo


def drag_calibrate(
    updates: Tensor, reference: Tensor, c: float = DEFAULT_C
) -> tuple[Tensor, Tensor, Tensor]:
    """Calibrate each update towards ``reference`` (DRAG paper, eqs. 10–11).

    ``updates`` is ``[S, d]`` (or one ``[d]`` update, as a Flower client holds); returns
    ``(v, λ, cos)`` with the leading dimension of the input, v in the input dtype (clamped
    to its range). A row holding NaN/Inf keeps it (λ = 0). Inputs are not modified.
    """
    c = parse_params(DragParams, {"c": c}, "drag_calibrate").c

    def coefficients(x: Tensor, r: Tensor) -> Coefficients:
        lam, coef_r, geo = _drag_coefficients(x, r, c)
        return lam, geo.cos, 1.0 - lam, coef_r, None

    return calibrate_with("drag_calibrate", updates, reference, coefficients)


#: (λ, cos, a, b, replaced or None) per row, in float64: v_m = a_m g_m + b_m r
Coefficients: TypeAlias = tuple[Tensor, Tensor, Tensor, Tensor, Tensor | None]


def calibrate_with(
    owner: str,
    updates: Tensor,
    reference: Tensor,
    coefficients: Callable[[Tensor, Tensor], Coefficients],
) -> tuple[Tensor, Tensor, Tensor]:
    """``(v, λ, cos)`` of a DRAG-family calibration v_m = a_m g_m + b_m r (DRAG eq. 11,
    BR-DRAG eq. 15) of ``[S, d]`` updates or one ``[d]`` update (as a Flower client holds),
    with the leading dimension of the input and v in its dtype (clamped to its range).
    ``coefficients(x, r)`` gives them per row; the rows it marks ``replaced`` become r."""
    single = updates.dim() == 1
    x = updates.unsqueeze(0) if single else updates
    r = check_reference(owner, reference, x)
    lam, cos, coef_g, coef_r, replaced = coefficients(x, r)
    v = torch.empty_like(x)
    for blk in column_blocks(x):
        rb = r[blk].to(W)
        vb = coef_g[:, None] * x[:, blk].to(W) + coef_r[:, None] * rb
        if replaced is not None:
            # torch.where (not a 0 coefficient): NaN/Inf in a replaced row cannot leak into v.
            vb = torch.where(replaced[:, None], rb, vb)
        v[:, blk] = to_dtype(vb, x.dtype)
    lam, cos = lam.to(x.dtype), cos.to(x.dtype)
    return (v[0], lam[0], cos[0]) if single else (v, lam, cos)


@AGGREGATORS.register("drag", tags=["needs_reference", "uses_weights"])
class Drag(Aggregator):
    """DRAG (DRAG paper, eqs. 10–11): pull every update towards the reference by its DoD."""

    params_schema = DragParams
    needs_reference = True
    c: float

    def __init__(self, c: float = DEFAULT_C) -> None:
        self._configure(c=c)

    def aggregate(
        self, updates: Tensor, weights: Tensor | None = None, *, reference: Tensor | None = None
    ) -> tuple[Tensor, Diagnostics]:
        w = normalised_weights(updates, weights)
        r = check_reference("drag", reference, updates)
        lam, coef_r, geo = _drag_coefficients(updates, r, self.c)
        bad = geo.nonfinite
        if bool(bad.any()):
            w = kept_weights("drag", w, ~bad)
        coef_g = w * (1.0 - lam)
        out = combine_rows(coef_g, updates, skip=bad, extra=((w * coef_r).sum(), r))
        diag = {
            "agg/mean_lambda": masked_stat(lam, ~bad, "mean"),
            "agg/mean_cos": masked_stat(geo.cos, geo.defined, "mean"),
            **rho_diagnostics(geo),
            "agg/nonfinite": float(bad.sum()),
        }
        return out, diag
