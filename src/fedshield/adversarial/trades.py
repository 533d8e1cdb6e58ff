"""TRADES' inner maximisation (Zhang et al., 2019), used by FedTRADES and CalFAT (FedCART paper).

x' maximises KL(p(x) ‖ p(x')) over the ε-ball, starting from x + 0.001·N(0, 1) as in the
reference implementation. Written once for the sequential and the vectorised trainer (see
:func:`fedshield.adversarial.pgd`).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from fedshield.adversarial import linf
from fedshield.adversarial.linf import Clamp, Draws


def trades_pgd(
    model: nn.Module,
    x: Tensor,
    eps: float,
    alpha: float,
    steps: int,
    *,
    clamp: Clamp = (0.0, 1.0),
    generator: torch.Generator | None = None,
    logit_transform: Callable[[Tensor], Tensor] | None = None,
    start_std: float = 0.001,
    draws: Draws | None = None,
) -> Tensor:
    """Sign-gradient ascent on ``Σ_i KL(p(x_i) ‖ p(x'_i))``, returned detached.

    ``logit_transform`` is applied to the logits before the softmax of *both* views; CalFAT
    passes its calibration ``z ↦ z + 0.1·log π_k`` so the examples attack the calibrated
    model. p(x) is computed once, detached: it is the fixed target of the KL (the reference
    code recomputes it each step, which is identical when the model is deterministic and
    costs one forward pass per step). The start is projected into the ball/range (the
    reference code skips that, which only matters when ε < the start noise). The start
    noise comes from ``generator``, or from ``draws`` (the batched trainer's streams).
    """
    linf.check_budget(eps, alpha, steps)
    x = x.detach()
    adjust = logit_transform if logit_transform is not None else (lambda z: z)
    with torch.no_grad():
        p_clean = F.softmax(adjust(model(x)), dim=1)
    rng = draws if draws is not None else linf.GeneratorDraws(generator)
    adv = linf.project(x + start_std * rng.normal(x), x, eps, clamp)

    def kl(logits: Tensor) -> Tensor:
        return F.kl_div(F.log_softmax(adjust(logits), dim=1), p_clean, reduction="sum")

    for _ in range(steps):
        grad = linf.input_grad(model, adv, kl)
        adv = linf.project(adv + alpha * grad.sign(), x, eps, clamp)
    return adv.detach()


__all__ = ["trades_pgd"]
