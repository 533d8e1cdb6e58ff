"""AutoAttack (Croce & Hein, 2020) through torchattacks — adapter only (SPEC §7).

SPEC §7 asks for AutoAttack *standard* (APGD-CE, APGD-T, FAB-T, Square) "through a
maintained package"; re-implementing it would forfeit the point of a standard benchmark.
torchattacks is imported lazily so the rest of fedshield works without it.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from types import ModuleType

import torch
from torch import Tensor, nn

from fedshield.adversarial.linf import check_budget
from fedshield.adversarial.registry import EVAL_ATTACKS
from fedshield.errors import ConfigError, FedshieldError


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


@EVAL_ATTACKS.register("autoattack")
@dataclass(frozen=True, kw_only=True)
class AutoAttackAdapter:
    """AutoAttack standard, L∞, via ``torchattacks.AutoAttack`` (inputs must lie in [0, 1])."""

    eps: float = 8 / 255
    version: str = "standard"
    norm: str = "Linf"
    n_classes: int | None = None
    seed: int = 0

    def __post_init__(self) -> None:
        check_budget(self.eps)
        if self.version not in ("standard", "plus", "rand"):
            raise ConfigError(
                f"autoattack version must be 'standard', 'plus' or 'rand', got {self.version!r}"
            )
        if self.norm not in ("Linf", "L2"):
            raise ConfigError(f"autoattack norm must be 'Linf' or 'L2', got {self.norm!r}")
        _torchattacks()  # fail when the config is built, not hours later at evaluation

    def __call__(self, model: nn.Module, x: Tensor, y: Tensor) -> Tensor:
        n_classes = self.n_classes
        if n_classes is None:  # APGD-T/FAB-T need it; read it off the logits
            with torch.no_grad():
                n_classes = int(model(x[:1]).shape[1])
        # torchattacks switches the model to eval for the attack and restores train mode
        # afterwards, so the caller's mode survives. A fixed seed per call keeps each batch
        # reproducible.
        attack = _torchattacks().AutoAttack(
            model, norm=self.norm, eps=self.eps, version=self.version,
            n_classes=n_classes, seed=self.seed,
        )  # fmt: skip
        with _frozen_parameters(model):
            return attack(x.detach(), y.detach()).detach()


__all__ = ["AutoAttackAdapter", "MissingDependencyError"]
