"""CalFAT's logit calibration (Chen et al., NeurIPS 2022; FedCART paper).

Client k's logits are shifted by its class prior before the softmax,
z̃ = z + τ·log π_k (τ = 0.1), and its local loss is CE(s·z̃, y) with scale s = 10 on the
adversarial examples, which are generated TRADES-style on the calibrated logits (the
authors' ``maxMarginLoss`` / ``kl_adv``).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor


def class_log_prior(counts: Tensor, floor: float = 1.0) -> Tensor:
    """log π_k from a client's class counts; absent classes count as ``floor`` samples (the
    reference code sets them to 1), so log π stays finite."""
    c = counts.float().clamp_min(floor)
    return torch.log(c / c.sum())


def calibrated_logits(logits: Tensor, log_prior: Tensor, tau: float = 0.1) -> Tensor:
    """z + τ · log π_k."""
    return logits + tau * log_prior.to(logits)


def calibrated_ce(
    logits: Tensor, y: Tensor, log_prior: Tensor, scale: float = 10.0, tau: float = 0.1
) -> Tensor:
    """CE(s · (z + τ · log π_k), y)."""
    return F.cross_entropy(scale * calibrated_logits(logits, log_prior, tau), y)


__all__ = ["calibrated_ce", "calibrated_logits", "class_log_prior"]
