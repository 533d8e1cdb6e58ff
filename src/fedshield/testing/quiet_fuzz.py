"""Fuzz the round loop with quiet attackers (docs/security.md §6b; ``tests/test_round_fuzz.py``).

:mod:`fedshield.testing.fuzz` corrupts uploads after training; here the registered quiet
attacks (``stealth``, ``opportunist``, ``cache_poison``, the ``quiet`` family) craft the
Byzantine rows through the engine's own attack path (:meth:`Simulator.end_round`: the
attack with the context it gets in a run — the rule, the round defenses and their
published history), for a few rounds in a row so that the cross-round defenses' memory
(the cache, the step history, the scores) is exercised, with the honest rows scaled to the
edges of float32 (1e30, 1e-30, zero) and with honest clients dropping out. Recorded:
whether θ, the buffers and the server state stay finite and whether anything raised.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from fedshield import attacks
from fedshield import config as config_mod
from fedshield.aggregators._ops import to_dtype
from fedshield.errors import ConfigError
from fedshield.sim.builder import build
from fedshield.sim.engine import Simulator
from fedshield.testing.fuzz import base_config

#: (attack, parameters): colluding rows at the radius' edge (jittered, about the rule's
#: output, spread past collusion and consistency), an opportunist that attacks whenever
#: one attacker is in (and one that waits for the rule's breakdown), directed rows of
#: every kind.
ATTACKS: tuple[tuple[str, dict[str, Any]], ...] = (
    ("stealth", {"h": 1.0}),
    ("stealth", {"h": 0.5, "jitter": 1.0, "centre": "rule"}),
    ("stealth", {"h": 1.0, "tau": 1e6, "centre": "mean"}),
    ("stealth", {"evade": True}),
    ("opportunist", {"threshold": 1}),
    ("opportunist", {}),
    ("cache_poison", {"scale": 1e6}),
    ("cache_poison", {"direction": "fixed"}),
    ("cache_poison", {"direction": "own", "scale": 1e6}),
    # the searched family: own-deviation spread about NNM's centre, turned sign direction;
    # the simplex past the radius, only in rounds the attackers can win
    ("quiet", {"centre": "nnm", "direction": "sign", "cosine": 0.5, "spread": "own", "j": 3.0}),
    ("quiet", {"h": 5.0, "spread": "simplex", "timing": "outvote"}),
)

#: Round-defense chains the attacks meet (none, the quiet-attacker reproducer's pair, all three,
#: and the quiet-attack guards that ``stealth``'s ``evade`` reads).
DEFENSES: tuple[tuple[str, ...], ...] = (
    (),
    ("step_bound", "reputation"),
    ("cache", "step_bound", "reputation"),
    ("collusion", "consistency", "step_bound", "reputation"),
)

#: Factors applied to the honest rows before the attack reads them (clamped to float32).
SCALES = (1.0, 1e30, 1e-30, 0.0)


@dataclass
class QuietCase:
    aggregator: str
    defenses: tuple[str, ...]
    dropout: float
    attack: str
    params: dict[str, Any]
    scale: float
    finite: bool = True
    error: str = ""
    rounds: int = 0
    metrics: list[dict[str, Any]] = field(default_factory=list)


@dataclass
class QuietSim:
    """One built simulator (rule, defenses, faults), reused across cases."""

    aggregator: str
    defenses: tuple[str, ...]
    dropout: float
    sim: Simulator
    start: Any


def make_sim(aggregator: str, defenses: Sequence[str], dropout: float = 0.0) -> QuietSim | None:
    """A simulator with 3 fixed attackers of 10 clients, all sampled, the rule named without
    arguments (its f derived) behind ``defenses``; None when the builder refuses it."""
    raw = base_config("fedavg", aggregator, defaults=True)
    raw["attack"] = {"name": "stealth", "fraction": 0.3, "mode": "fixed"}
    raw["server"]["round_defenses"] = list(defenses)
    if dropout:
        raw["faults"] = {"models": ["dropout"], "params": {"dropout": {"p": dropout}}}
    try:
        sim = Simulator(build(config_mod.validate(raw, "quiet fuzz config")))
    except ConfigError:
        return None
    return QuietSim(aggregator, tuple(defenses), dropout, sim, copy.deepcopy(sim.state))


def _finite(sim: Simulator) -> bool:
    st = sim.state
    tensors = [st.params, st.buffers, *st.server_state.values()]
    return all(bool(torch.isfinite(t).all()) for t in tensors if t.is_floating_point())


def run_case(
    qs: QuietSim, attack: str, params: dict[str, Any], scale: float, rounds: int = 3
) -> QuietCase:
    """``rounds`` rounds from the start state with ``attack`` crafting the Byzantine rows
    and the honest rows scaled by ``scale`` before it reads them."""
    sim = qs.sim
    sim.state, sim.records = copy.deepcopy(qs.start), []
    sim.comp.attack = attacks.build(attack, **params)
    case = QuietCase(qs.aggregator, qs.defenses, qs.dropout, attack, params, scale)
    try:
        for rnd in range(1, rounds + 1):
            plan = sim.begin_round(rnd)
            ups = sim.train_cohort(plan)
            for u in ups:
                if u.client_id not in plan.ctx.byzantine:
                    u.delta = to_dtype(u.delta.double() * scale, u.delta.dtype)
            case.metrics.append(sim.end_round(plan, ups))
            case.rounds = rnd
            if not _finite(sim):
                case.finite = False
                break
    except Exception as err:
        case.finite = False
        case.error = f"{type(err).__name__}: {err}"
    return case


__all__ = ["ATTACKS", "DEFENSES", "SCALES", "QuietCase", "QuietSim", "make_sim", "run_case"]
