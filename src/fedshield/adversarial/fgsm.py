"""FGSM (Goodfellow et al., 2015): one signed-gradient step of size ε (FedCART paper; early-exit
ViT paper)."""

from __future__ import annotations

from torch import Tensor, nn

from fedshield.adversarial.linf import Clamp, check_budget, input_grad
from fedshield.adversarial.losses import Objective, resolve_objective


def fgsm(
    model: nn.Module,
    x: Tensor,
    y: Tensor,
    eps: float,
    *,
    clamp: Clamp = (0.0, 1.0),
    loss_fn: Objective | None = None,
) -> Tensor:
    """Return ``clip(x + ε·sign(∇ₓ loss(model(x), y)))``, detached.

    ``loss_fn(logits, y)`` is maximised (default: cross-entropy); per-sample values are
    summed. The model's train/eval mode and its parameters' ``.grad`` are left as found.
    """
    check_budget(eps)
    x = x.detach()
    objective = resolve_objective(loss_fn if loss_fn is not None else "ce")
    grad = input_grad(model, x, lambda logits: objective(logits, y))
    # Same expression as torchattacks.FGSM, so both give identical outputs.
    adv = x + eps * grad.sign()
    if clamp is not None:
        adv.clamp_(clamp[0], clamp[1])
    return adv


__all__ = ["fgsm"]
