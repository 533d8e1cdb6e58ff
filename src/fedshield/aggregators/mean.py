"""FedAvg's weighted mean (SPEC §1): Δ = Σ_m w_m g_m / Σ_m w_m.

The caller chooses the weighting: sample counts n_m for FedAvg, or ``None`` for the seed's
uniform (1/S) Σ form. One GEMV, so it is the O(S·d) floor every other rule is timed against.
"""

from __future__ import annotations

from torch import Tensor

from fedshield.aggregators.base import AGGREGATORS, Aggregator, Diagnostics, check_updates


@AGGREGATORS.register("mean")
class Mean(Aggregator):
    """Weighted mean of the updates (FedAvg, SPEC §1); uniform when ``weights`` is None."""

    def aggregate(
        self, updates: Tensor, weights: Tensor | None = None, *, reference: Tensor | None = None
    ) -> tuple[Tensor, Diagnostics]:
        w = check_updates(updates, weights)
        if weights is None:  # the plain reduction is a little faster than a uniform GEMV
            return updates.mean(dim=0), {}
        return w @ updates, {}
