"""SignGuard (Xu, Huang, Zhang, Xiao & Zhang, "Byzantine-robust Federated Learning through
Collaborative Malicious Gradient Filtering", ICDCS 2022, Algorithm 1).

1. **Norm filter**: M = the median of the rows' norms; S₁ = {i : L·M ≤ ‖x_i‖ ≤ R·M} with
   the paper's L = 0.1, R = 3.0.
2. **Sign clustering**: every row's sign statistics (the fractions of its positive, zero and
   negative coordinates) are clustered with MeanShift (the paper's choice; sklearn, its
   bandwidth estimated from the features); S₂ = the largest cluster.
3. **Aggregate**: the rows of S₁ ∩ S₂, each clipped to norm M, averaged.

The paper computes the sign statistics on a random 10% of the coordinates to save time;
here all coordinates are used (one O(S·d) pass; deterministic). When the features are all
equal (MeanShift's bandwidth is 0) there is one cluster; when S₁ ∩ S₂ is empty, S₁ is used
(``agg/fallback``: S₁ always holds the row of median norm). Weights play no part; rows
holding NaN/Inf are dropped first (``agg/nonfinite``).
"""

from __future__ import annotations

import numpy as np
import torch
from pydantic import Field, model_validator
from torch import Tensor

from fedshield.aggregators._cluster import FiniteRows
from fedshield.aggregators.base import AGGREGATORS, Aggregator, Diagnostics, normalised_weights
from fedshield.core.params import Params


class SignGuardParams(Params):
    lower: float = Field(0.1, ge=0.0, description="norm filter: keep ‖x_i‖ ≥ lower · median")
    upper: float = Field(3.0, gt=0.0, description="norm filter: keep ‖x_i‖ ≤ upper · median")

    @model_validator(mode="after")
    def _ordered(self) -> SignGuardParams:
        if self.lower > self.upper:
            raise ValueError(f"lower={self.lower} exceeds upper={self.upper}")
        return self


def sign_features(x: Tensor, keep: Tensor) -> np.ndarray:
    """``[k, 3]`` fractions of positive, zero and negative coordinates of the kept rows."""
    rows = x.index_select(0, keep)
    d = x.shape[1]
    pos = (rows > 0).sum(dim=1).to(torch.float64) / d
    neg = (rows < 0).sum(dim=1).to(torch.float64) / d
    return torch.stack([pos, 1.0 - pos - neg, neg], dim=1).cpu().numpy()


def largest_cluster(features: np.ndarray) -> np.ndarray:
    """Indices of the largest MeanShift cluster (ties: the one holding the lowest index)."""
    from sklearn.cluster import MeanShift, estimate_bandwidth

    k = features.shape[0]
    if k < 2:
        return np.arange(k)
    bandwidth = estimate_bandwidth(features, quantile=0.3) if k > 1 else 0.0
    if not bandwidth > 1e-12:
        return np.arange(k)
    labels = MeanShift(bandwidth=bandwidth).fit(features).labels_
    counts = np.bincount(labels)
    best = max(range(counts.size), key=lambda c: (counts[c], -int(np.argmax(labels == c))))
    return np.flatnonzero(labels == best)


@AGGREGATORS.register("signguard", tags=["robust", "reference_free"])
class SignGuard(Aggregator):
    """SignGuard (Xu 2022): norm filter ∩ largest sign-statistics cluster, then the mean of
    those rows clipped to the median norm."""

    params_schema = SignGuardParams
    lower: float
    upper: float

    def __init__(self, lower: float = 0.1, upper: float = 3.0) -> None:
        self._configure(lower=lower, upper=upper)

    def aggregate(
        self, updates: Tensor, weights: Tensor | None = None, *, reference: Tensor | None = None
    ) -> tuple[Tensor, Diagnostics]:
        normalised_weights(updates, weights)  # weights play no part
        fr = FiniteRows("signguard", updates)
        m = float(np.median(fr.norms.cpu().numpy()))
        s1 = (fr.norms >= self.lower * m) & (fr.norms <= self.upper * m)
        s2 = torch.zeros_like(s1)
        s2[torch.as_tensor(largest_cluster(sign_features(updates, fr.keep)))] = True
        both = s1 & s2
        fallback = not bool(both.any())
        chosen = (s1 if fallback else both).nonzero().squeeze(1)
        out = fr.clipped_mean(chosen, m)
        return out, {
            "agg/num_selected": float(chosen.numel()),
            "agg/norm_filtered": float((~s1).sum()),
            "agg/sign_filtered": float((~s2).sum()),
            "agg/fallback": float(fallback),
            "agg/tau": m,
            "agg/nonfinite": float(fr.dropped),
        }
