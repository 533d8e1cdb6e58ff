"""Byzantine attacks of SPEC §6 (seed 000 §I-A list plus the standard set).

Update attacks rewrite the Byzantine rows of the cohort's ``[S, d]`` update matrix
(:class:`UpdateAttack`); data attacks poison a Byzantine client's dataset once
(:class:`DataAttack`). Build one by name with keyword hyper-parameters::

    from fedshield import attacks
    attack = attacks.build("min_max", vector="sign")
    poisoned = attack(updates, byzantine_mask, generator=gen)
"""

from __future__ import annotations

from typing import Any

from fedshield.attacks import data, minmax, omniscient, simple  # noqa: F401  (registers)
from fedshield.attacks.base import ATTACKS, DataAttack, UpdateAttack
from fedshield.attacks.minmax import find_gamma, halving_search
from fedshield.attacks.omniscient import alie_z


def build(name: str, /, **kwargs: Any) -> UpdateAttack | DataAttack:
    """The attack registered as ``name``, constructed from ``kwargs`` (``None`` values are
    dropped, so unset config keys fall back to the defaults). Unknown names raise a
    :class:`fedshield.registry.RegistryError` listing the known ones; bad values raise
    :class:`fedshield.errors.ConfigError`."""
    try:
        return ATTACKS.build(name, **kwargs)
    except TypeError as exc:  # unknown keyword: name the attack and its real parameters
        from inspect import signature

        from fedshield.errors import ConfigError

        params = ", ".join(signature(ATTACKS.get(name)).parameters) or "none"
        raise ConfigError(f"attack {name!r}: {exc}; parameters: {params}") from None


def names() -> list[str]:
    """Registered attack names, sorted."""
    return ATTACKS.names()


__all__ = [
    "ATTACKS",
    "DataAttack",
    "UpdateAttack",
    "alie_z",
    "build",
    "find_gamma",
    "halving_search",
    "names",
]
