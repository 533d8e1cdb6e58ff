"""L∞-ball geometry and the input-gradient primitive shared by every attack (SPEC §7).

All attacks here are white-box, sign-gradient, L∞ attacks. They share three steps, kept in
one place so that FGSM, PGD, CW∞ and TRADES' inner maximisation cannot drift apart:

* :func:`input_grad` — the gradient of a scalar loss w.r.t. the *input only*;
* :func:`uniform_start` — the random start inside the ball, drawn from an explicit generator;
* :func:`project` — back into the ε-ball around the clean input and the valid pixel range.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor, nn

from fedshield.errors import ConfigError

Clamp = tuple[float, float] | None
"""Valid input range ``(low, high)``; ``None`` when inputs are unbounded (e.g. normalised)."""


def check_budget(eps: float, alpha: float | None = None, steps: int | None = None) -> None:
    """Reject budgets that would silently produce a meaningless attack."""
    if not eps >= 0:  # also rejects NaN
        raise ConfigError(f"attack eps must be >= 0, got {eps!r}")
    if alpha is not None and not alpha >= 0:
        raise ConfigError(f"attack alpha (step size) must be >= 0, got {alpha!r}")
    if steps is not None and steps < 0:
        raise ConfigError(f"attack steps must be >= 0, got {steps!r}")


def input_grad(model: nn.Module, x: Tensor, objective: Callable[[Tensor], Tensor]) -> Tensor:
    """Gradient of ``objective(model(x))`` w.r.t. ``x`` alone.

    ``torch.autograd.grad`` with ``inputs=x`` never writes ``.grad`` on the parameters (and
    skips their weight-gradient kernels), so an attack run inside a training step leaves the
    optimiser's accumulated gradients untouched. ``enable_grad`` lets callers invoke attacks
    from evaluation code that runs under ``torch.no_grad``.
    """
    with torch.enable_grad():
        x = x.detach().requires_grad_(True)
        loss = objective(model(x))
        (grad,) = torch.autograd.grad(loss, x)
    return grad


def uniform_start(x: Tensor, eps: float, generator: torch.Generator | None) -> Tensor:
    """``x + U(-eps, eps)`` (Madry et al.; torchattacks' PGD start), not yet projected.

    The noise is drawn on the generator's device and then moved, so a CPU generator drives
    attacks on any accelerator and the same seed gives the same start everywhere.
    """
    device = generator.device if generator is not None else x.device
    noise = torch.empty(x.shape, dtype=x.dtype, device=device).uniform_(
        -eps, eps, generator=generator
    )
    return x + noise.to(x.device)


def project(x_adv: Tensor, x: Tensor, eps: float, clamp: Clamp) -> Tensor:
    """Project onto {‖x' − x‖∞ ≤ eps} ∩ [low, high]; returns a new detached tensor.

    The operation order (clip the perturbation, add it back, clip the range) is the one
    torchattacks uses, so our PGD reproduces its iterates bit for bit.
    """
    delta = (x_adv.detach() - x).clamp_(-eps, eps)
    out = x + delta
    if clamp is not None:
        out.clamp_(clamp[0], clamp[1])
    return out


__all__ = ["Clamp", "check_budget", "input_grad", "project", "uniform_start"]
