"""``EVAL_ATTACKS``: the evaluation attacks of SPEC §7 by name.

Each entry is a frozen dataclass whose fields are the attack's hyper-parameters, so
``EVAL_ATTACKS.build("pgd", eps=8/255, steps=20)`` reads like the config and the instance
is an :data:`~fedshield.adversarial.evaluation.EvalAttack` (``attack(model, x, y)``). Seeded
attacks own one CPU generator, so a whole evaluation pass is reproducible.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import torch
from torch import Tensor, nn

from fedshield.adversarial.evaluation import EvalAttack
from fedshield.adversarial.fgsm import fgsm
from fedshield.adversarial.linf import Clamp, check_budget
from fedshield.adversarial.pgd import cw_linf, pgd
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


@dataclass(frozen=True, kw_only=True)
class _SeededAttack:
    seed: int = 0
    _generator: torch.Generator = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        # frozen dataclass: the generator is mutable state, not a hyper-parameter.
        object.__setattr__(self, "_generator", torch.Generator().manual_seed(self.seed))


@EVAL_ATTACKS.register("pgd")
@dataclass(frozen=True, kw_only=True)
class PGDAttack(_SeededAttack):
    """PGD-k with CE, random start; defaults are SPEC §7's PGD-20 (step ε/4)."""

    eps: float = 8 / 255
    alpha: float | None = None
    steps: int = 20
    random_start: bool = True
    clamp: Clamp = (0.0, 1.0)

    def __post_init__(self) -> None:
        super().__post_init__()
        check_budget(self.eps, self.alpha, self.steps)

    def __call__(self, model: nn.Module, x: Tensor, y: Tensor) -> Tensor:
        alpha = self.eps / 4 if self.alpha is None else self.alpha
        return pgd(
            model, x, y, self.eps, alpha, self.steps,
            random_start=self.random_start, clamp=self.clamp, generator=self._generator,
        )  # fmt: skip


@EVAL_ATTACKS.register("cw")
@dataclass(frozen=True, kw_only=True)
class CWAttack(_SeededAttack):
    """CW∞: PGD on the CW margin loss, κ = 50, 30 steps (SPEC §7)."""

    eps: float = 8 / 255
    alpha: float | None = None
    steps: int = 30
    kappa: float = 50.0
    random_start: bool = True
    clamp: Clamp = (0.0, 1.0)

    def __post_init__(self) -> None:
        super().__post_init__()
        check_budget(self.eps, self.alpha, self.steps)

    def __call__(self, model: nn.Module, x: Tensor, y: Tensor) -> Tensor:
        return cw_linf(
            model, x, y, self.eps, self.alpha, self.steps, kappa=self.kappa,
            random_start=self.random_start, clamp=self.clamp, generator=self._generator,
        )  # fmt: skip


__all__ = ["EVAL_ATTACKS", "CWAttack", "FGSMAttack", "PGDAttack"]
