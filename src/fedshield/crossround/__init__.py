"""Defenses across rounds: memory the server keeps from round to round.

A per-round defense bounds one step on one cohort's rows; these act on the run
(:mod:`fedshield.crossround.base` for the contract, :mod:`fedshield.crossround.chain` for
how they wrap the round step). Configured as ``server.round_defenses = ["cache",
"step_bound"]`` with ``server.round_defense_args = {step_bound = {kappa = 3.0}}``
(``fedshield list round-defenses``).

===========  ============================================================  ========
name         what it does                                                  memory
===========  ============================================================  ========
cache        the rule sees every client's latest screened upload           O(M·d)
fill         a short round gets the invited silent clients' cached rows    O(M·d)
step_bound   each block's step ≤ κ × median of the last k applied steps    O(k·d)
reputation   clients repeatedly far from the aggregate are suspended       O(M)
collusion    near-identical rows of different clients are left out         O(M)
consistency  clients whose offsets oppose the applied step are suspended   O(M)
momentum     the rule sees each client's momentum β·m + (1 − β)·g          O(M·d)
===========  ============================================================  ========
"""

from __future__ import annotations

from typing import Any

from fedshield._plugins import import_submodules
from fedshield.crossround.base import ROUND_DEFENSES, RoundDefense
from fedshield.crossround.chain import RoundDefenses, build_round_defenses, check_compatible

import_submodules(__name__)


def build(name: str, /, **params: Any) -> RoundDefense:
    """The round defense registered as ``name`` (parameters validated by its schema)."""
    return ROUND_DEFENSES.build(name, **params)


def names() -> list[str]:
    """Registered round-defense names, sorted."""
    return ROUND_DEFENSES.names()


__all__ = [
    "ROUND_DEFENSES",
    "RoundDefense",
    "RoundDefenses",
    "build",
    "build_round_defenses",
    "check_compatible",
    "names",
]
