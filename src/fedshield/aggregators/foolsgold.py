"""FoolsGold (Fung, Yoon & Beschastnikh, "The Limitations of Federated Learning in Sybil
Settings", RAID 2020, Algorithm 1), on the round's updates.

Sybils pushing one poisoned objective send updates more alike than honest clients with
their own data do, so FoolsGold lowers the weight of every client in proportion to its
largest cosine similarity to another:

1. cs = cos(h_i, h_j) − I (the authors' ``cosine_similarity(...) − np.eye(n)``: a diagonal
   of 0, so v_i = max_j cs_ij ≥ 0 and a row anti-aligned with every other has v_i = 0);
2. pardoning: cs_ij ← cs_ij · v_i / v_j where v_i < v_j (an honest client that merely
   resembles a sybil is not punished as one);
3. α_i = clip(1 − max_j cs_ij, 0, 1), α ← α / max α, α_i = 0.99 where it is 1;
4. the logit with κ = 1: α_i ← clip(ln(α_i / (1 − α_i)) + 0.5, 0, 1) (the authors' code);
5. Δ = Σ α_i x_i / Σ α_i. Where every α_i is 0 (every row has a twin of cosine 1: all
   rows agree, and the authors' code divides 0 by 0) the plain mean (``agg/fallback``).

**The history.** The paper's h_i is client i's update summed over every round it took part
in. The aggregator contract gives a rule the round's rows, not the clients' ids nor server
state keyed by them, so here h_i is the round's update x_i: sybils that send alike updates
in the same round get weight ~0 (the worked example), but a sybil that alternates between
rounds is not tracked. (The authors' code then applies the unnormalised Σ α_i x_i; the
weighted mean keeps the step at the honest scale whatever the number of clients.)

A sybil defense, not a Byzantine-robust rule (not tagged ``robust``): one huge row unlike
the others keeps weight 1. Cosines come from the float64 Gram matrix about 0
(:mod:`fedshield.aggregators._cluster`); weights play no part; rows holding NaN/Inf are
dropped first (``agg/nonfinite``).
"""

from __future__ import annotations

import torch
from torch import Tensor

from fedshield.aggregators._cluster import FiniteRows
from fedshield.aggregators._ops import W, combine_rows
from fedshield.aggregators.base import AGGREGATORS, Aggregator, Diagnostics, normalised_weights


def foolsgold_weights(cos_dist: Tensor) -> Tensor:
    """``[k]`` FoolsGold weights α from ``[k, k]`` cosine distances (1 − cos)."""
    k = cos_dist.shape[0]
    if k < 2:
        return torch.ones(k, dtype=W, device=cos_dist.device)
    # cos − I as the authors' code: a diagonal of 0, not −inf, so v ≥ 0 and pardoning
    # (cs · v_i / v_j) cannot flip the sign of an anti-aligned row's negative cosines
    cs = (1.0 - cos_dist).fill_diagonal_(0.0)
    v = cs.max(dim=1).values
    pardon = v[:, None] < v[None, :]
    ratio = v[:, None] / torch.where(pardon, v[None, :], 1.0)
    cs = torch.where(pardon, cs * ratio, cs)
    alpha = (1.0 - cs.max(dim=1).values).clamp(0.0, 1.0)
    top = alpha.max()
    if not bool(top > 0):
        return torch.zeros_like(alpha)
    alpha = alpha / top
    alpha = torch.where(alpha == 1.0, 0.99, alpha)
    with torch.no_grad():
        logit = torch.log(alpha / (1.0 - alpha)) + 0.5  # −inf where α = 0
    return torch.nan_to_num(logit, neginf=0.0).clamp(0.0, 1.0)


@AGGREGATORS.register("foolsgold", tags=["reference_free"])
class FoolsGold(Aggregator):
    """FoolsGold (Fung 2020): weight every update down by its largest cosine similarity to
    another (pardoned, logit-scaled), on the round's updates."""

    def aggregate(
        self, updates: Tensor, weights: Tensor | None = None, *, reference: Tensor | None = None
    ) -> tuple[Tensor, Diagnostics]:
        normalised_weights(updates, weights)  # weights play no part
        fr = FiniteRows("foolsgold", updates)
        alpha = foolsgold_weights(fr.cosine_distances())
        total = alpha.sum()
        coef = torch.zeros(updates.shape[0], dtype=W, device=updates.device)
        fallback = not bool(total > 0)
        coef[fr.keep] = 1.0 / alpha.numel() if fallback else alpha / total
        out = combine_rows(coef, updates, skip=~fr.ok if fr.dropped else None)
        return out, {
            "agg/mean_weight": float(alpha.mean()),
            "agg/num_zero_weight": float((alpha == 0).sum()),
            "agg/fallback": float(fallback),
            "agg/nonfinite": float(fr.dropped),
        }
