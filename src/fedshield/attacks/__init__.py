"""Byzantine attacks: the list of the DRAG paper, Sec. I-A, plus the standard set.

Update attacks rewrite the Byzantine rows of the cohort's ``[S, d]`` update matrix
(:class:`UpdateAttack`); data attacks poison a Byzantine client's dataset once
(:class:`DataAttack`). Defense-aware attacks (``needs_rule``: ``alie_opt``, ``ipm_opt``,
``fang_krum``, ``fang_trim``, ``agr_tailored``, ``adaptive_root``, ``adaptive_root_est``)
craft their rows through the configured rule, which reaches them in an
:class:`AttackContext`. Build one by name with keyword hyper-parameters::

    from fedshield import attacks
    attack = attacks.build("min_max", vector="sign")
    poisoned = attack(updates, byzantine_mask, generator=gen)

``attacks.parse(name, params)`` validates the parameters alone (no attack is built).
"""

from __future__ import annotations

from typing import Any

from fedshield._plugins import import_submodules
from fedshield.attacks.base import ATTACKS, AttackContext, DataAttack, UpdateAttack
from fedshield.attacks.minmax import find_gamma, halving_search
from fedshield.attacks.omniscient import alie_z
from fedshield.core.params import Params

import_submodules(__name__)


def parse(name: str, params: dict[str, Any] | None = None, where: str = "attack.params") -> Params:
    """The validated parameters of attack ``name`` (no attack is built): what the builder
    checks before any data is loaded. Unknown names are a
    :class:`~fedshield.registry.RegistryError` naming ``attack.name`` with a did-you-mean;
    unknown keys and bad values a :class:`~fedshield.errors.ConfigError` naming
    ``where.key``. ``None`` values are dropped, so unset keys take the defaults."""
    given = {k: v for k, v in (params or {}).items() if v is not None}
    return ATTACKS.entry(name, "attack.name").parse(given, where)


def build(name: str, /, **params: Any) -> UpdateAttack | DataAttack:
    """The attack registered as ``name``, constructed from ``params`` validated by its
    schema (see :func:`parse`)."""
    kwargs = parse(name, params).kwargs()
    return ATTACKS.get(name)(**kwargs)


def names() -> list[str]:
    """Registered attack names, sorted."""
    return ATTACKS.names()


__all__ = [
    "ATTACKS",
    "AttackContext",
    "DataAttack",
    "UpdateAttack",
    "alie_z",
    "build",
    "find_gamma",
    "halving_search",
    "names",
    "parse",
]
