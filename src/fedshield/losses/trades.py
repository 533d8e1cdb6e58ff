"""TRADES' outer objective (Zhang et al., 2019; β = 6 as its authors' code).

L = CE(f(x), y) + β · (1/B) Σ_i KL(p(x_i) ‖ p(x'_i)), with gradients through both views as
in the reference code (``criterion_kl(log_softmax(model(x_adv)), softmax(model(x)))``).
"""

from __future__ import annotations

import torch.nn.functional as F
from torch import Tensor


def trades_kl(logits_nat: Tensor, logits_adv: Tensor) -> Tensor:
    """(1/B) Σ_i KL(p(x_i) ‖ p(x'_i)) (``batchmean``)."""
    return F.kl_div(
        F.log_softmax(logits_adv, dim=1), F.softmax(logits_nat, dim=1), reduction="batchmean"
    )


def trades_loss(logits_nat: Tensor, logits_adv: Tensor, y: Tensor, beta: float = 6.0) -> Tensor:
    """CE(f(x), y) + β · KL(p(x) ‖ p(x'))."""
    return F.cross_entropy(logits_nat, y) + beta * trades_kl(logits_nat, logits_adv)


__all__ = ["trades_kl", "trades_loss"]
