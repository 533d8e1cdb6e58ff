"""L∞ PGD (Madry et al., 2018) and CW∞ = PGD on the CW margin objective (FedCART paper; early-exit
ViT paper).

One definition for evaluation, the sequential trainer and the vectorised one (where it runs
per client inside ``vmap``, its start drawn from the client's replayed stream)."""

from __future__ import annotations

import torch
from torch import Tensor, nn

from fedshield.adversarial.linf import (
    Clamp,
    Draws,
    GeneratorDraws,
    check_budget,
    input_grad,
    project,
)
from fedshield.adversarial.losses import Objective, resolve_objective


def pgd(
    model: nn.Module,
    x: Tensor,
    y: Tensor,
    eps: float,
    alpha: float,
    steps: int,
    *,
    random_start: bool = True,
    loss: str | Objective = "ce",
    kappa: float = 50.0,
    clamp: Clamp = (0.0, 1.0),
    generator: torch.Generator | None = None,
    draws: Draws | None = None,
) -> Tensor:
    """``steps`` iterations of ``x' ← Π_{B∞(x,ε)∩clamp}(x' + α·sign(∇ₓ' loss))``, detached.

    ``loss`` is ``"ce"`` (PGD-k), ``"cw"`` (CW margin with confidence ``kappa``) or a
    callable ``(logits, y) -> loss`` to maximise. ``random_start`` draws ``U(-ε, ε)`` from
    ``generator`` (reproducible when given), or from ``draws`` (the batched trainer's
    per-client streams). Training code decides the model's mode, so it is not changed here;
    parameters' ``.grad`` are never written. With ``random_start=False`` and ``loss="ce"``
    the iterates equal ``torchattacks.PGD``'s.
    """
    check_budget(eps, alpha, steps)
    x = x.detach()
    objective = resolve_objective(loss, kappa=kappa)

    def attack_loss(logits: Tensor) -> Tensor:
        return objective(logits, y)

    if random_start:
        rng = draws if draws is not None else GeneratorDraws(generator)
        adv = project(x + rng.uniform(x, -eps, eps), x, eps, clamp)
    else:
        adv = x
    for _ in range(steps):
        grad = input_grad(model, adv, attack_loss)
        adv = project(adv + alpha * grad.sign(), x, eps, clamp)
    return adv.detach()


def cw_linf(
    model: nn.Module,
    x: Tensor,
    y: Tensor,
    eps: float,
    alpha: float | None = None,
    steps: int = 30,
    *,
    kappa: float = 50.0,
    random_start: bool = True,
    clamp: Clamp = (0.0, 1.0),
    generator: torch.Generator | None = None,
) -> Tensor:
    """CW∞ of the FedCART paper's evaluation: PGD on the CW margin loss, κ = 50, 30 steps.

    The step size is not fixed by the sources; ``alpha=None`` uses ε/4, the PGD-20 step of
    the robust evaluation (our choice: the common PGD step for an ε-ball).
    """
    step = eps / 4 if alpha is None else alpha
    return pgd(
        model, x, y, eps, step, steps,
        random_start=random_start, loss="cw", kappa=kappa, clamp=clamp, generator=generator,
    )  # fmt: skip


__all__ = ["cw_linf", "pgd"]
