"""Supervised contrastive loss (Khosla et al., 2020) — FedCART's L_Align (FedCART paper).

For 2B features {ẑ_i} ∪ {ẑ'_i} (natural and adversarial views, ℓ2-normalised: our choice),
anchor i, positives P(i) (same label, any other index: the other view or another sample)
and all other indices Q(i):

    L_Align = (1/2B) Σ_i (−1/|P(i)|) Σ_{p∈P(i)} log( exp(ẑ_i·ẑ_p/τ) / Σ_{j∈Q(i)} exp(ẑ_i·ẑ_j/τ) )
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor


def _per_anchor(features: Tensor, labels: Tensor, tau: float) -> tuple[Tensor, Tensor]:
    """Every anchor's SupCon term (0 where it has no positive) and its positive count."""
    if tau <= 0:
        raise ValueError(f"temperature tau must be > 0, got {tau}")
    z = F.normalize(features, dim=1)
    n = z.shape[0]
    self_mask = torch.eye(n, dtype=torch.bool, device=z.device)
    # −inf on the diagonal removes j = i from the denominator Σ_{j∈Q(i)}.
    sim = (z @ z.T / tau).masked_fill(self_mask, float("-inf"))
    log_prob = sim - torch.logsumexp(sim, dim=1, keepdim=True)
    pos = (labels[:, None] == labels[None, :]) & ~self_mask
    n_pos = pos.sum(dim=1)
    # masked_fill (not multiplication) so the −inf diagonal never meets a zero weight.
    return -log_prob.masked_fill(~pos, 0.0).sum(dim=1) / n_pos.clamp_min(1), n_pos


def supervised_contrastive(features: Tensor, labels: Tensor, tau: float = 0.1) -> Tensor:
    """SupCon over ``features`` [N, D] with ``labels`` [N]; mean over anchors with a positive.

    Anchors without any positive contribute nothing (they cannot occur in :func:`align_loss`,
    where every sample's other view is a positive).
    """
    per_anchor, n_pos = _per_anchor(features, labels, tau)
    has_pos = n_pos > 0
    if not bool(has_pos.any()):
        return features.sum() * 0.0  # keeps the graph; nothing to align
    return per_anchor[has_pos].mean()


def align_loss(z_nat: Tensor, z_adv: Tensor, labels: Tensor, tau: float = 0.1) -> Tensor:
    """L_Align of the FedCART paper: SupCon over the 2B natural and adversarial features.

    Every anchor has a positive (its other view), so the mean over anchors with a positive
    is the mean over all anchors: no data-dependent branch, and it runs inside ``vmap`` (the
    vectorised trainer)."""
    per_anchor, _ = _per_anchor(torch.cat([z_nat, z_adv]), torch.cat([labels, labels]), tau)
    return per_anchor.mean()


__all__ = ["align_loss", "supervised_contrastive"]
