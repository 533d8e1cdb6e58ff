"""``EVAL_ATTACKS``: the evaluation attacks of the FedCART paper by name.

Each entry is a frozen :class:`~fedshield.core.params.Params` model that is both the
attack's parameter schema and the attack: its fields are the hyper-parameters, so
``EVAL_ATTACKS.build("pgd", eps=8/255, steps=20)`` reads like the config, the values are
validated (ranges, unknown keys with a did-you-mean) however the attack is constructed, and
the instance is an :data:`~fedshield.adversarial.evaluation.EvalAttack`
(``attack(model, x, y)``). ``EVAL_ATTACKS.parse(name, params, where)`` validates alone.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import Annotated, Any

import torch
from pydantic import AfterValidator, Field, PrivateAttr
from pydantic_core import PydanticCustomError
from torch import Tensor, nn

from fedshield.adversarial.evaluation import EvalAttack
from fedshield.adversarial.fgsm import fgsm
from fedshield.adversarial.losses import Objective, cw_margin_loss
from fedshield.adversarial.pgd import pgd
from fedshield.core.params import Params
from fedshield.registry import Registry

EVAL_ATTACKS: Registry[Callable[..., EvalAttack]] = Registry("evaluation attack")

#: L∞ budget of the robust evaluation on [0, 1] images (our choice, as the ``robust`` evaluator).
EPS_8_255 = 8 / 255


def _eps_field() -> Any:
    return Field(EPS_8_255, ge=0.0, le=1.0, description="L∞ radius ε of the ball around x")


def _ordered(clamp: tuple[float, float] | None) -> tuple[float, float] | None:
    if clamp is not None and not clamp[0] < clamp[1]:
        raise PydanticCustomError("clamp_order", "low must be < high")
    return clamp


#: The valid input range ``(low, high)``, or unset for unbounded (e.g. normalised) inputs.
ClampRange = Annotated[tuple[float, float] | None, AfterValidator(_ordered)]


def _clamp_field() -> Any:
    return Field((0.0, 1.0), strict=False, description="valid input range [low, high]")


class FGSMAttack(Params):
    """FGSM: one signed-gradient step of size ε (Goodfellow et al. 2015; FedCART paper)."""

    eps: float = _eps_field()
    clamp: ClampRange = _clamp_field()

    def __call__(self, model: nn.Module, x: Tensor, y: Tensor) -> Tensor:
        return fgsm(model, x, y, self.eps, clamp=self.clamp)


class PGDAttack(Params):
    """PGD-k on cross-entropy from a random start; the defaults are the FedCART paper's PGD-20
    evaluation.

    Madry et al. 2018. The step ``alpha`` defaults to ε/4. One generator per attack
    object, seeded by ``seed`` and advanced batch after batch, makes a whole evaluation
    pass reproducible."""

    eps: float = _eps_field()
    alpha: float | None = Field(None, ge=0.0, le=1.0, description="step size; unset: ε/4")
    steps: int = Field(20, ge=0, le=10_000, description="number of projected steps k")
    random_start: bool = Field(True, description="start from x + U(−ε, ε)")
    seed: int = Field(0, ge=0, description="seed of the random start")
    clamp: ClampRange = _clamp_field()
    # State, not a hyper-parameter: outside the schema.
    _generator: torch.Generator = PrivateAttr()

    def model_post_init(self, context: Any) -> None:
        self._generator = torch.Generator().manual_seed(self.seed)

    def _loss(self) -> str | Objective:
        return "ce"

    def __call__(self, model: nn.Module, x: Tensor, y: Tensor) -> Tensor:
        alpha = self.eps / 4 if self.alpha is None else self.alpha
        return pgd(
            model, x, y, self.eps, alpha, self.steps, random_start=self.random_start,
            loss=self._loss(), clamp=self.clamp, generator=self._generator,
        )  # fmt: skip


class CWAttack(PGDAttack):
    """CW∞: PGD on the CW margin loss with κ = 50 for 30 steps (FedCART paper).

    The step ε/4 is our choice (the sources do not fix it)."""

    steps: int = Field(30, ge=0, le=10_000, description="number of projected steps")
    kappa: float = Field(50.0, ge=0.0, description="confidence κ of the CW margin loss")

    def _loss(self) -> str | Objective:
        return partial(cw_margin_loss, kappa=self.kappa)


for _name, _cls in (("fgsm", FGSMAttack), ("pgd", PGDAttack), ("cw", CWAttack)):
    EVAL_ATTACKS.register(_name, schema=_cls)(_cls)


__all__ = ["EPS_8_255", "EVAL_ATTACKS", "CWAttack", "FGSMAttack", "PGDAttack"]
