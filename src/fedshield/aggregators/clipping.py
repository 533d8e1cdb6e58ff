"""Centered Clipping (Karimireddy, He & Jaggi, ICML 2021), SPEC §5.

Starting from a centre v_0, repeat L times:

    v_{l+1} = v_l + Σ_i w_i · clip(g_i − v_l, τ),   clip(z, τ) = z · min(1, τ/‖z‖)

with w uniform (the paper's 1/S) unless the caller passes weights. Defaults τ = 10,
L = ``iters`` = 1: the paper reports that one clipping iteration suffices in practice
(ByzFL's default τ is 100). The centre is the ``reference`` when one is given — the
paper's choice is the previous round's aggregate/momentum, which the server algorithm
holds — and zero otherwise (ByzFL's and the paper's code's first-round default).

Distances are computed directly as ‖g_i − v‖ (block by block, see ``_ops.row_dists``), not
through the Gram trick: τ is compared with distances that may be small next to ‖g_i‖.
"""

from __future__ import annotations

import torch
from torch import Tensor

from fedshield.aggregators._ops import check_float, check_int, row_dists
from fedshield.aggregators.base import AGGREGATORS, Aggregator, Diagnostics, check_updates


@AGGREGATORS.register("centered_clipping")
class CenteredClipping(Aggregator):
    """Centered Clipping (Karimireddy 2021): clip every update around a moving centre."""

    def __init__(self, tau: float = 10.0, iters: int = 1) -> None:
        self.tau = check_float("centered_clipping", "tau", tau, strict=True)
        self.iters = check_int("centered_clipping", "iters", iters, minimum=1)

    def aggregate(
        self, updates: Tensor, weights: Tensor | None = None, *, reference: Tensor | None = None
    ) -> tuple[Tensor, Diagnostics]:
        w = check_updates(updates, weights)
        d = updates.shape[1]
        if reference is None:
            v = updates.new_zeros(d)
        elif reference.shape != (d,):
            raise ValueError(f"reference must be [{d}], got shape {tuple(reference.shape)}")
        else:
            v = reference.to(device=updates.device, dtype=updates.dtype)
        scale = w
        for _ in range(self.iters):
            # τ/0 = inf → min(1, inf) = 1: a row sitting on the centre is left as is.
            scale = (self.tau / row_dists(updates, v)).clamp_max(1.0)
            coef = w * scale
            # v + Σ w_i s_i (g_i − v) = (1 − Σ w_i s_i) v + Σ w_i s_i g_i: one GEMV.
            v = (1.0 - coef.sum()) * v + coef @ updates
        return v, {"agg/clipped": float((scale < 1).to(torch.float32).mean())}
