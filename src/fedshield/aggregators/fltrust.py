"""FLTrust (Cao et al., NDSS 2021), the original rule (the DRAG paper, Sec. VI-B, paraphrases it).

With the server's root-data reference r (the same r^t as BR-DRAG):

* trust score TS_m = max(0, cos(g_m, r))
* ĝ_m = (‖r‖ / ‖g_m‖) g_m           (every update rescaled to the reference's norm)
* Δ = Σ_m TS_m ĝ_m / Σ_m TS_m        (Δ = 0 when every TS_m is 0)

``weights`` is ignored: the trust scores are the weights. A zero or NaN/Inf row gets TS = 0
and is left out of the sum (``agg/nonfinite`` counts the latter), so one worker cannot
poison θ with NaN. Norms and cosines are float64: a finite row of any size is rescaled to
‖r‖ like any other.
"""

from __future__ import annotations

import torch
from torch import Tensor

from fedshield.aggregators._ops import combine_rows, ref_geometry, safe_div
from fedshield.aggregators.base import (
    AGGREGATORS,
    Aggregator,
    Diagnostics,
    check_reference,
    normalised_weights,
)


@AGGREGATORS.register("fltrust", tags=["robust", "needs_reference"])
class FLTrust(Aggregator):
    """FLTrust (DRAG paper, Sec. VI-B): ReLU-cosine trust scores, updates rescaled to ‖r‖."""

    needs_reference = True
    rescales_to_reference = True
    handles_nonfinite = True

    def aggregate(
        self, updates: Tensor, weights: Tensor | None = None, *, reference: Tensor | None = None
    ) -> tuple[Tensor, Diagnostics]:
        normalised_weights(updates, weights)  # shape checks only
        r = check_reference("fltrust", reference, updates)
        geo = ref_geometry(updates, r)
        trust = geo.cos.clamp_min(0.0)  # cos is 0 wherever it is undefined, so TS = 0 there
        scaled = trust * safe_div(geo.ref_norm.expand_as(trust), geo.norms, geo.defined)
        total = trust.sum()
        # Σ TS = 0 ⇒ every coefficient is 0 and Δ = 0, without a data-dependent branch.
        coef = scaled / torch.where(total > 0, total, torch.ones_like(total))
        out = combine_rows(coef, updates, skip=geo.nonfinite)
        diag = {
            "agg/mean_trust": float(trust.mean()),
            "agg/num_trusted": float((trust > 0).sum()),
            "agg/nonfinite": float(geo.nonfinite.sum()),
        }
        return out, diag
