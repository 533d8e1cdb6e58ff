"""TAET's Hierarchical Adversarial Robustness Loss (Wang Yu-Hang et al., "TAET: Two-Stage
Adversarial Equalization Training on Long-Tailed Distributions", CVPR 2025; the authors'
``code/HARL.py``), the second stage of TAET.

On a batch of adversarial examples x' with labels y, let L_c be the mean per-sample
cross-entropy CE(f(x'_i), y_i) over the batch's class-c samples (0 for a class absent from
the batch) and L̄ = (1/C) Σ_c L_c. Then

    L_BCL  = α · L̄                                     (balanced cross-class loss)
    L_HDL  = β · (1/C) Σ_c (L_c − L̄)²                  (hierarchical deviation loss)
    L_RCEL = γ · Σ_c (L_c / Σ_c' L_c')²                 (rare-class emphasis loss)
    L_HARL = L_BCL + L_HDL + L_RCEL,    α = β = γ = 0.1 (the reference code's defaults)

The means run over all C classes, absent ones included, and the 1e-10 guards are the
reference code's. TAET's first stage ("initial stabilisation") is plain CE on natural
inputs; the reference switches to HARL after 40 of its 100 epochs.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

_EPS = 1e-10  # the reference code's guard on empty classes and a zero loss sum


def class_mean_losses(per_sample: Tensor, y: Tensor, num_classes: int) -> Tensor:
    """L_c = mean of ``per_sample`` over the samples of class c ([C]; 0 for absent classes)."""
    sums = torch.zeros(num_classes, dtype=per_sample.dtype, device=per_sample.device)
    sums = sums.index_add(0, y, per_sample)
    counts = torch.bincount(y, minlength=num_classes).to(per_sample.dtype)
    return sums / (counts + _EPS)


def harl_terms(
    logits_adv: Tensor, y: Tensor, alpha: float = 0.1, beta: float = 0.1, gamma: float = 0.1
) -> dict[str, Tensor]:
    """The three HARL terms (``bcl``, ``hdl``, ``rcel``) on the adversarial logits."""
    losses = class_mean_losses(
        F.cross_entropy(logits_adv, y, reduction="none"), y, logits_adv.shape[1]
    )
    mean = losses.mean()
    share = losses / (losses.sum() + _EPS)
    return {
        "bcl": alpha * mean,
        "hdl": beta * (losses - mean).pow(2).mean(),
        "rcel": gamma * share.pow(2).sum(),
    }


def harl_loss(
    logits_adv: Tensor, y: Tensor, alpha: float = 0.1, beta: float = 0.1, gamma: float = 0.1
) -> Tensor:
    """L_HARL = L_BCL + L_HDL + L_RCEL (module docstring)."""
    terms = harl_terms(logits_adv, y, alpha, beta, gamma)
    return terms["bcl"] + terms["hdl"] + terms["rcel"]


__all__ = ["class_mean_losses", "harl_loss", "harl_terms"]
