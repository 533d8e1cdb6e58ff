"""MART (Wang et al., ICLR 2020; β = 6 as its authors' code), as in the authors' reference code.

    BCE(p(x'), y) = −log p_y(x') − log(1 − max_{k≠y} p_k(x'))
    L = (1/B) Σ_i [ BCE_i + β · KL(p(x_i) ‖ p(x'_i)) · (1 − p_{y_i}(x_i)) ]

The small constants (1.0001, 1e-12, 1.0000001) are the reference code's.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor


def mart_loss(logits_nat: Tensor, logits_adv: Tensor, y: Tensor, beta: float = 6.0) -> Tensor:
    """Boosted CE on x' plus the misclassification-weighted KL term."""
    adv_probs = F.softmax(logits_adv, dim=1)
    # The most likely wrong class of x': second-best when the best is the true label.
    top2 = torch.argsort(adv_probs, dim=1)[:, -2:]
    wrong = torch.where(top2[:, -1] == y, top2[:, -2], top2[:, -1])
    bce = F.cross_entropy(logits_adv, y) + F.nll_loss(torch.log(1.0001 - adv_probs + 1e-12), wrong)
    nat_probs = F.softmax(logits_nat, dim=1)
    true_probs = nat_probs.gather(1, y[:, None]).squeeze(1)
    kl = F.kl_div(torch.log(adv_probs + 1e-12), nat_probs, reduction="none").sum(dim=1)
    return bce + beta * (kl * (1.0000001 - true_probs)).mean()


__all__ = ["mart_loss"]
