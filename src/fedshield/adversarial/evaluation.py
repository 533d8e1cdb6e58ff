"""Robust accuracy: accuracy on adversarial examples, evaluated in batches (FedCART paper;
early-exit ViT paper)."""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor, nn

from fedshield.errors import ConfigError

EvalAttack = Callable[[nn.Module, Tensor, Tensor], Tensor]
"""``attack(model, x, y) -> x_adv``; the objects built by ``EVAL_ATTACKS`` have this shape."""


def _model_device(model: nn.Module, fallback: torch.device) -> torch.device:
    param = next(model.parameters(), None)
    return param.device if param is not None else fallback


def robust_correct(
    model: nn.Module,
    x: Tensor,
    y: Tensor,
    attack: EvalAttack | None,
    *,
    batch_size: int = 256,
) -> Tensor:
    """Per-sample correctness ``[N]`` (bool, on CPU) of ``model`` on ``attack(model, x, y)``.

    ``attack=None`` gives natural accuracy. Batches move to the model's device and back, so
    a whole test set can live on the CPU. Per-sample output lets callers group accuracy by
    class frequency (the FedCART paper's Majority/Medium/Minority groups) without re-running the
    attack.
    """
    if batch_size < 1:
        raise ConfigError(f"batch_size must be >= 1, got {batch_size!r}")
    if x.shape[0] != y.shape[0]:
        raise ValueError(f"x has {x.shape[0]} samples but y has {y.shape[0]}")
    device = _model_device(model, x.device)
    out = []
    for start in range(0, x.shape[0], batch_size):
        xb = x[start : start + batch_size].to(device)
        yb = y[start : start + batch_size].to(device)
        if attack is not None:
            xb = attack(model, xb, yb)
        with torch.no_grad():  # the final prediction needs no graph
            out.append((model(xb).argmax(dim=1) == yb).cpu())
    return torch.cat(out) if out else torch.zeros(0, dtype=torch.bool)


def robust_accuracy(
    model: nn.Module,
    x: Tensor,
    y: Tensor,
    attack: EvalAttack | None,
    *,
    batch_size: int = 256,
) -> float:
    """Fraction of samples still classified correctly under ``attack`` (NaN when empty)."""
    correct = robust_correct(model, x, y, attack, batch_size=batch_size)
    return correct.float().mean().item() if correct.numel() else float("nan")


__all__ = ["EvalAttack", "robust_accuracy", "robust_correct"]
