"""Centered Clipping (Karimireddy, He & Jaggi, ICML 2021) and norm clipping.

``centered_clipping``: from the centre v_0, repeat L times

    v_{l+1} = v_l + Σ_i w_i · clip(g_i − v_l, τ),   clip(z, τ) = z · min(1, τ/‖z‖)

with w uniform (the paper's 1/S) unless the caller passes weights. Default L = ``iters`` =
1: the paper reports that one clipping iteration suffices in practice. Default τ: relative
to the honest scale (docs/security.md: a rule called robust is robust without arguments), the lower
median of the first iteration's distances ‖g_i − v_0‖ over the finite rows: with an honest
majority that is an honest client's distance, so f < S/2 attackers move the aggregate by at
most (f/S)·τ per iteration whatever their size. An absolute τ (the paper's form; ByzFL's
default is 100) is set with ``tau``.

**The centre is the ``reference`` argument**, and the server keeps it in its state: the
paper clips around the previous round's aggregate (its momentum form), so the server passes
v_0 = Δ^{t−1}, and v_0 = 0 on the first round (``reference=None``, ByzFL's and the paper
code's start). ByzFL's ``CenteredClipping`` instance does the same by carrying its last
output into its next call. Because of that state the rule is tagged ``needs_center`` (not
``reference_free``): it cannot aggregate an arbitrary field without one.

``norm_clip``: clip every update around 0 to norm τ, then take the (weighted) mean,
Δ = Σ_i w_i min(1, τ/‖g_i‖) g_i — centred clipping with the centre fixed at 0 and L = 1,
the form runs used before the centre was kept in server state. Default τ: the lower median
of the round's row norms (relative, as for Centered Clipping).

Distances ‖g_i − v‖ are computed directly in float64, block by block (``_ops.row_dists``),
never by the Gram trick: τ is compared with distances that may be small next to ‖g_i‖, and
a finite row of any size (up to float32's max) is clipped like any other. Rows holding
NaN/Inf are dropped (``agg/nonfinite``); a non-finite centre raises ``ValueError``.
"""

from __future__ import annotations

import torch
from pydantic import Field
from torch import Tensor

from fedshield.aggregators._ops import combine_rows, row_dists, row_norms
from fedshield.aggregators.base import (
    AGGREGATORS,
    Aggregator,
    Diagnostics,
    check_reference,
    kept_weights,
    normalised_weights,
)
from fedshield.core.params import Params


class CenteredClippingParams(Params):
    tau: float | None = Field(
        None,
        gt=0.0,
        description="clipping radius τ around the centre; unset: the lower median of the "
        "round's distances to the centre (relative to the honest scale)",
    )
    iters: int = Field(
        1, ge=1, le=1000, description="clipping iterations L (1 suffices, the paper)"
    )


class NormClipParams(Params):
    tau: float | None = Field(
        None,
        gt=0.0,
        description="norm bound τ: each update is clipped to it; unset: the lower median of "
        "the round's row norms (relative to the honest scale)",
    )


def _clip_scale(dist: Tensor, tau: float, bad: Tensor) -> Tensor:
    """min(1, τ/dist) in float64; a row within τ (on the centre too) is kept as is."""
    safe = torch.where(dist > tau, dist, torch.ones_like(dist))  # no 0/0 when τ = 0
    return torch.where(bad, 0.0, torch.where(dist > tau, tau / safe, 1.0))


@AGGREGATORS.register("centered_clipping", tags=["robust", "needs_center", "uses_weights"])
class CenteredClipping(Aggregator):
    """Centered Clipping (Karimireddy 2021): clip every update around the previous aggregate.

    ``reference`` is the centre v_0: the server passes the previous round's aggregate (kept
    in its state), ``None`` on the first round means v_0 = 0.
    """

    params_schema = CenteredClippingParams
    tau: float | None
    iters: int

    def __init__(self, tau: float | None = None, iters: int = 1) -> None:
        self._configure(tau=tau, iters=iters)

    def aggregate(
        self, updates: Tensor, weights: Tensor | None = None, *, reference: Tensor | None = None
    ) -> tuple[Tensor, Diagnostics]:
        w = normalised_weights(updates, weights)
        v: Tensor | None = None  # the centre 0 when no reference is given
        if reference is not None:
            v = check_reference("centered_clipping", reference, updates)
        dist = row_norms(updates) if v is None else row_dists(updates, v)
        bad = ~torch.isfinite(dist)
        if bool(bad.any()):
            w = kept_weights("centered_clipping", w, ~bad)
        tau = self.tau if self.tau is not None else _lower_median(dist[~bad])
        scale = w
        for it in range(self.iters):
            if it > 0:
                assert v is not None  # the previous iteration's centre
                dist = row_dists(updates, v)
            scale = _clip_scale(dist, tau, bad)
            coef = w * scale
            # v + Σ c_i (g_i − v) = (1 − Σ c_i) v + Σ c_i g_i: one GEMV (float64 if needed).
            extra = None if v is None else (1.0 - coef.sum(), v)
            out = combine_rows(coef, updates, skip=bad, extra=extra)
            v = out
        clipped = ((scale < 1) & ~bad).sum() / (~bad).sum()
        diag = {"agg/clipped": float(clipped), "agg/nonfinite": float(bad.sum())}
        return out, diag | {"agg/tau": float(tau)}


def _lower_median(values: Tensor) -> float:
    return float(values.sort().values[(values.numel() - 1) // 2])


@AGGREGATORS.register("norm_clip", tags=["robust", "uses_weights"])
class NormClip(Aggregator):
    """Norm clipping: clip every update to norm τ around 0, then the (weighted) mean."""

    params_schema = NormClipParams
    tau: float | None

    def __init__(self, tau: float | None = None) -> None:
        self._configure(tau=tau)

    def aggregate(
        self, updates: Tensor, weights: Tensor | None = None, *, reference: Tensor | None = None
    ) -> tuple[Tensor, Diagnostics]:
        w = normalised_weights(updates, weights)
        norms = row_norms(updates)
        bad = ~torch.isfinite(norms)
        if bool(bad.any()):
            w = kept_weights("norm_clip", w, ~bad)
        tau = self.tau if self.tau is not None else _lower_median(norms[~bad])
        scale = _clip_scale(norms, tau, bad)
        out = combine_rows(w * scale, updates, skip=bad)
        clipped = ((scale < 1) & ~bad).sum() / (~bad).sum()
        diag = {"agg/clipped": float(clipped), "agg/nonfinite": float(bad.sum())}
        return out, diag | {"agg/tau": float(tau)}
