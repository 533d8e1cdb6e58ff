"""AutoAttack (Croce & Hein, 2020) through torchattacks — adapter only (FedCART paper's "AA").

The FedCART paper evaluates AutoAttack *standard* (APGD-CE, APGD-T, FAB-T, Square) "through a
maintained package"; re-implementing it would forfeit the point of a standard benchmark.
torchattacks is imported lazily so the rest of fedshield works without it.

``version = "apgd"`` runs AutoAttack's two gradient attacks only, APGD-CE then APGD-T on
the points APGD-CE did not break (torchattacks' ``MultiAttack``, as its AutoAttack does),
each with ``steps`` iterations (Croce & Hein's 100 by default; torchattacks' own
AutoAttack uses its classes' default of 10). Croce & Hein (2020, Tab. 2) find these two
account for almost all of AutoAttack's reductions on non-obfuscated models; FAB-T and
Square cost most of the CPU time.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from types import ModuleType
from typing import Any, Literal

import torch
from pydantic import Field, ValidationInfo, field_validator
from pydantic_core import PydanticCustomError
from torch import Tensor, nn

from fedshield.adversarial.registry import EPS_8_255, EVAL_ATTACKS
from fedshield.core.params import Params
from fedshield.errors import ConfigError, FedshieldError

#: APGD-T's targeted DLR loss (Croce & Hein 2020, eq. 7) divides by z_π1 − (z_π3 + z_π4)/2.
MIN_CLASSES = 4


class MissingDependencyError(FedshieldError, ImportError):
    """An optional package needed by the configuration is not installed."""


def _torchattacks() -> ModuleType:
    try:
        import torchattacks
    except ImportError as exc:
        raise MissingDependencyError(
            "evaluation attack 'autoattack' needs the 'torchattacks' package "
            "(pip install torchattacks)"
        ) from exc
    return torchattacks


@contextmanager
def _frozen_parameters(model: nn.Module) -> Iterator[None]:
    """Parameters stop requiring grad for the duration, then get their flags back.

    torchattacks' APGD/FAB call ``loss.backward()``, which would accumulate into the
    parameters' ``.grad``; with ``requires_grad`` off nothing is written (and the weight
    gradients are not computed at all).
    """
    flags = [(p, p.requires_grad) for p in model.parameters()]
    try:
        for p, _ in flags:
            p.requires_grad_(False)
        yield
    finally:
        for p, flag in flags:
            p.requires_grad_(flag)


class AutoAttackAdapter(Params):
    """AutoAttack through torchattacks: APGD-CE, APGD-T, FAB-T and Square (FedCART paper).

    Croce & Hein 2020, standard version, L∞ by default; inputs must lie in [0, 1]. The
    package is checked when the attack is built, not hours later at evaluation."""

    norm: Literal["Linf", "L2"] = Field("Linf", description="threat model")
    eps: float = Field(EPS_8_255, ge=0.0, description="radius ε (≤ 1 for L∞)")
    version: Literal["standard", "plus", "rand", "apgd"] = Field(
        "standard",
        description="AutoAttack suite version; 'apgd' = APGD-CE + APGD-T only",
    )
    steps: int = Field(100, ge=1, description="iterations of APGD-CE and APGD-T in version 'apgd'")
    n_classes: int | None = Field(
        None,
        ge=MIN_CLASSES,
        description="classes (APGD-T/FAB-T targets, >= 4); unset: read off the logits",
    )
    seed: int = Field(0, ge=0, description="seed of every call (each batch reproducible)")

    @field_validator("eps")
    @classmethod
    def _linf_budget(cls, eps: float, info: ValidationInfo) -> float:
        if info.data.get("norm") == "Linf" and eps > 1:
            raise PydanticCustomError("eps_range", "must be <= 1 for norm = 'Linf'")
        return eps

    def model_post_init(self, context: Any) -> None:
        _torchattacks()

    def __call__(self, model: nn.Module, x: Tensor, y: Tensor) -> Tensor:
        n_classes = self.n_classes
        if n_classes is None:  # APGD-T/FAB-T need it; read it off the logits
            with torch.no_grad():
                n_classes = int(model(x[:1]).shape[1])
        if n_classes < MIN_CLASSES:  # torchattacks would raise an IndexError mid-evaluation
            raise ConfigError(
                f"evaluation attack 'autoattack' needs >= {MIN_CLASSES} classes (its targeted "
                f"DLR loss reads the 3rd and 4th largest logits); the model has {n_classes}"
            )
        # torchattacks switches the model to eval for the attack and restores train mode
        # afterwards, so the caller's mode survives. A fixed seed per call keeps each batch
        # reproducible.
        ta = _torchattacks()
        if self.version == "apgd":
            common = {"norm": self.norm, "eps": self.eps, "steps": self.steps, "seed": self.seed}
            attack = ta.MultiAttack([
                ta.APGD(model, loss="ce", n_restarts=1, **common),
                ta.APGDT(model, n_classes=n_classes, n_restarts=1, **common),
            ])  # fmt: skip
        else:
            attack = ta.AutoAttack(
                model, norm=self.norm, eps=self.eps, version=self.version,
                n_classes=n_classes, seed=self.seed,
            )  # fmt: skip
        with _frozen_parameters(model):
            return attack(x.detach(), y.detach()).detach()


EVAL_ATTACKS.register("autoattack", schema=AutoAttackAdapter)(AutoAttackAdapter)

__all__ = ["AutoAttackAdapter", "MissingDependencyError"]
