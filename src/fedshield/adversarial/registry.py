"""``EVAL_ATTACKS``: the evaluation attacks of SPEC §7 by name.

Each entry is a frozen dataclass whose fields are the attack's hyper-parameters, so
``EVAL_ATTACKS.build("pgd", eps=8/255, steps=20)`` reads like the config and the instance
is an :data:`~fedshield.adversarial.evaluation.EvalAttack` (``attack(model, x, y)``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial

import torch
from torch import Tensor, nn

from fedshield.adversarial.evaluation import EvalAttack
from fedshield.adversarial.fgsm import fgsm
from fedshield.adversarial.linf import Clamp, check_budget
from fedshield.adversarial.losses import Objective, cw_margin_loss
from fedshield.adversarial.pgd import pgd
from fedshield.registry import Registry

EVAL_ATTACKS: Registry[Callable[..., EvalAttack]] = Registry("evaluation attack")


@EVAL_ATTACKS.register("fgsm")
@dataclass(frozen=True, kw_only=True)
class FGSMAttack:
    """FGSM(ε): one signed-gradient step."""

    eps: float = 8 / 255
    clamp: Clamp = (0.0, 1.0)

    def __post_init__(self) -> None:
        check_budget(self.eps)

    def __call__(self, model: nn.Module, x: Tensor, y: Tensor) -> Tensor:
        return fgsm(model, x, y, self.eps, clamp=self.clamp)


@EVAL_ATTACKS.register("pgd")
@dataclass(frozen=True, kw_only=True)
class PGDAttack:
    """PGD-k with CE, random start; defaults are SPEC §7's PGD-20 (step ε/4)."""

    eps: float = 8 / 255
    alpha: float | None = None  # None: ε/4
    steps: int = 20
    random_start: bool = True
    clamp: Clamp = (0.0, 1.0)
    seed: int = 0
    _generator: torch.Generator = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        check_budget(self.eps, self.alpha, self.steps)
        # One generator per attack object, advanced batch after batch: a whole evaluation
        # pass is reproducible. It is state, not a hyper-parameter, hence outside __init__.
        object.__setattr__(self, "_generator", torch.Generator().manual_seed(self.seed))

    def _loss(self) -> str | Objective:
        return "ce"

    def __call__(self, model: nn.Module, x: Tensor, y: Tensor) -> Tensor:
        alpha = self.eps / 4 if self.alpha is None else self.alpha
        return pgd(
            model, x, y, self.eps, alpha, self.steps, random_start=self.random_start,
            loss=self._loss(), clamp=self.clamp, generator=self._generator,
        )  # fmt: skip


@EVAL_ATTACKS.register("cw")
@dataclass(frozen=True, kw_only=True)
class CWAttack(PGDAttack):
    """CW∞: PGD on the CW margin loss, κ = 50, 30 steps (SPEC §7; step ε/4 our choice)."""

    steps: int = 30
    kappa: float = 50.0

    def _loss(self) -> str | Objective:
        return partial(cw_margin_loss, kappa=self.kappa)


__all__ = ["EVAL_ATTACKS", "CWAttack", "FGSMAttack", "PGDAttack"]
