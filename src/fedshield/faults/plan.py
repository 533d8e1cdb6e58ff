"""The configured fault models of a run, composed: who can be sampled, who answers.

:func:`build_plan` turns ``[faults]`` into a :class:`FaultPlan` (names and parameters
checked against the registry, trace files read), :meth:`FaultPlan.cohort` samples the
round's cohort from the available clients and :meth:`FaultPlan.outcome` decides the
response faults of the sampled ones. Attackers always answer unless
``faults.attackers_fail`` (the worst case: a Byzantine client is never the one that
drops). With ``faults.invite = "population"`` the cohort is drawn from all M clients and an
offline invitee is a missing row (``faults/offline``), so the attackers' share of the invited
cohort is the population's even though attackers are always online."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

import numpy as np

from fedshield.core.seeds import sample_available
from fedshield.errors import ConfigError
from fedshield.faults.base import FAULT_MODELS, STAGES, FaultEnv, FaultModel, RoundFaults

log = logging.getLogger("fedshield")


def build_models(names: Sequence[str], params: dict[str, dict[str, Any]]) -> list[FaultModel]:
    """The fault models ``names`` with their ``params``; ConfigError naming the key for an
    unknown name (did-you-mean), a repeated name, a bad parameter or parameters given for
    a model that is not in the list."""
    for i, name in enumerate(names):
        FAULT_MODELS.entry(name, f"faults.models[{i}]")
        if name in names[:i]:
            raise ConfigError(f"faults.models[{i}]: {name!r} is listed twice")
    stray = sorted(set(params) - set(names))
    if stray:
        raise ConfigError(f"faults.params.{stray[0]}: no such fault model in faults.models")
    models = []
    for name in names:
        entry = FAULT_MODELS.entry(name)
        raw = params.get(name, {})
        args = entry.parse(raw, f"faults.params.{name}").kwargs()
        model = entry.obj(**args)
        stage = entry.tag_values("stage")
        if len(stage) != 1 or not stage <= set(STAGES):
            raise ConfigError(f"faults.models: {name!r} declares no stage tag ({STAGES})")
        models.append(model)
    return models


class FaultPlan:
    """The run's fault models over ``env``; ``exempt``: clients that are always online and
    always answer (the fixed attackers, unless ``attackers_fail``)."""

    def __init__(
        self,
        models: list[FaultModel],
        env: FaultEnv,
        exempt: Sequence[int] = (),
        attackers_fail: bool = False,
        invite: str = "online",
    ) -> None:
        self.models = models
        self.env = env
        self.exempt = frozenset(exempt)
        self.attackers_fail = attackers_fail
        self.invite = invite
        for m in models:
            m.prepare(env)
        self._warned_short = False

    def available(self, rnd: int) -> tuple[int, ...]:
        """The clients online in round ``rnd`` (every availability model agrees)."""
        online = np.ones(self.env.num_clients, dtype=bool)
        for m in self.models:
            if m.stage == "availability":
                online &= m.available(rnd, self.env)
        if not self.attackers_fail:
            online[list(self.exempt)] = True
        return tuple(int(k) for k in np.flatnonzero(online))

    def cohort(self, rnd: int, per_round: int) -> tuple[tuple[int, ...], int]:
        """(the sampled cohort, the number of clients online): S of the available clients
        from the cohort stream, or all of them when fewer than S are online (logged); with
        ``invite = "population"`` S of all M (offline ones answer nothing, :meth:`outcome`)."""
        if self.invite == "population":
            everyone = tuple(range(self.env.num_clients))
            return sample_available(self.env.seed, rnd, everyone, per_round), len(
                self.available(rnd)
            )
        pool = self.available(rnd)
        if len(pool) < per_round:
            level = logging.INFO if self._warned_short else logging.WARNING
            self._warned_short = True
            log.log(
                level,
                "round %d: %d clients available, fewer than clients_per_round=%d; sampling "
                "all of them",
                rnd,
                len(pool),
                per_round,
            )
        return sample_available(self.env.seed, rnd, pool, per_round), len(pool)

    def outcome(
        self, rnd: int, cohort: tuple[int, ...], byzantine: Sequence[int], available: int
    ) -> RoundFaults:
        """The response faults of the sampled ``cohort`` (its ``byzantine`` members answer
        unless ``attackers_fail``)."""
        exempt = frozenset() if self.attackers_fail else frozenset(byzantine) | self.exempt
        out = RoundFaults(available, cohort, exempt & set(cohort))
        if self.invite == "population":  # invited while offline: a missing row
            online = set(self.available(rnd))
            out.offline = {k for k in cohort if k not in online and k not in out.exempt}
        for m in self.models:
            if m.stage == "response":
                m.respond(rnd, self.env, out)
        return out


def build_plan(faults: Any, env: FaultEnv, fixed_attackers: Sequence[int] = ()) -> FaultPlan | None:
    """The plan of a ``[faults]`` section (None when it lists no model)."""
    if not faults.models:
        if faults.params:
            key = sorted(faults.params)[0]
            raise ConfigError(f"faults.params.{key}: no such fault model in faults.models")
        return None
    models = build_models(faults.models, faults.params)
    invite = getattr(faults, "invite", None) or "online"
    return FaultPlan(models, env, fixed_attackers, faults.attackers_fail, invite)


__all__ = ["FaultPlan", "build_models", "build_plan"]
