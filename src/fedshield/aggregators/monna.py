"""MoNNA (Farhadkhani, Guerraoui, Gupta, Hoang, Pinot & Stephan, ICML 2023), as ByzFL 0.0.11's
``MoNNA(f, idx)``.

MoNNA_f = (1/(S − f)) Σ_{i ∈ N} x_i, N the S − f rows nearest to a vector the aggregating
node trusts. In the paper (peer-to-peer) that vector is the node's own gradient; ByzFL takes
row ``idx`` of its input. A server has no trusted client row, so here the trusted vector is
the server's own root-data update (``reference``, as FLTrust's and BR-DRAG's r^t): the rule is
tagged ``needs_reference``. With ``reference = x[idx]`` it is ByzFL's ``MoNNA(f, idx)``
(that row is its own nearest neighbour, at distance 0).

Needs 2f < S (ByzFL's condition). Distances ‖x_i − r‖ are computed directly in float64
(``_ops.row_dists``); ties go to the lower row index. Weights play no part. Rows holding
NaN/Inf are dropped (``agg/nonfinite``); S is then the number of finite rows.
"""

from __future__ import annotations

import torch
from torch import Tensor

from fedshield.aggregators._majority import HonestMajorityRule
from fedshield.aggregators._ops import combine_rows, row_dists
from fedshield.aggregators.base import (
    AGGREGATORS,
    Diagnostics,
    check_reference,
    f_params,
    normalised_weights,
)

MoNNAParams = f_params(
    "MoNNAParams",
    "number of Byzantine rows tolerated: the mean of the S − f rows nearest to the "
    "reference (needs 2f < S)",
    __name__,
)


@AGGREGATORS.register("monna", tags=["robust", "needs_reference", "min_clients"])
class MoNNA(HonestMajorityRule):
    """MoNNA (Farhadkhani 2023): the mean of the S − f rows nearest to the trusted reference."""

    params_schema = MoNNAParams
    needs_reference = True

    def aggregate(
        self, updates: Tensor, weights: Tensor | None = None, *, reference: Tensor | None = None
    ) -> tuple[Tensor, Diagnostics]:
        normalised_weights(updates, weights)  # weights play no part
        r = check_reference("monna", reference, updates)
        dist = row_dists(updates, r)
        ok = torch.isfinite(dist)
        s = int(ok.sum())
        dropped = updates.shape[0] - s
        f = self.checked_f(s, dropped)
        # stable sort: equal distances keep the lower index first
        order = torch.where(ok, dist, torch.inf).sort(stable=True).indices[: s - f]
        chosen = torch.zeros_like(ok).index_fill_(0, order, True)
        coef = chosen.to(dist.dtype) / (s - f)
        out = combine_rows(coef, updates, skip=~ok if dropped else None)
        return out, {
            "agg/num_selected": float(s - f),
            "agg/max_selected_dist": float(dist[order].max()),
            "agg/nonfinite": float(dropped),
        }
