"""The defense as a search (docs/cross-round.md, "Searched attacker"): Optuna's TPE over
compositions of a pre-aggregator (none, ``nnm``, ``bucketing``, ``clip``), a rule and a
subset of the round defenses (liveness: ``server.over_select`` where the base has
faults), each scored by its worst case — the lowest mean tuning-seed accuracy over a pool
of attacks (the attackers found so far, :mod:`fedshield.search.attack_search`) — and
maximised. A composition the builder refuses (``build_components`` raising a
:class:`~fedshield.errors.ConfigError`) is pruned before any run and recorded with the
builder's reason.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import optuna

from fedshield.search.trials import Defense, Trials, optimize, refusal

PRE_AGGREGATORS: tuple[tuple[str, ...], ...] = ((), ("nnm",), ("bucketing",), ("clip",))
RULES: tuple[str, ...] = (
    "median",
    "trimmed_mean",
    "centered_clipping",
    "geomed",
    "meamed",
    "multikrum",
)
ROUND_DEFENSES: tuple[str, ...] = (
    "collusion",
    "consistency",
    "momentum",
    "step_bound",
    "reputation",
)


def suggest(trial: optuna.Trial, faults: bool) -> Defense:
    """One composition: pre-aggregator, rule, each round defense in or out (in the order of
    :data:`ROUND_DEFENSES`), and with faults the liveness choice."""
    pre = trial.suggest_categorical("pre", ["+".join(p) or "none" for p in PRE_AGGREGATORS])
    rule = trial.suggest_categorical("rule", list(RULES))
    chosen = tuple(d for d in ROUND_DEFENSES if trial.suggest_categorical(d, [False, True]))
    live: str | None = None
    if faults:
        live = trial.suggest_categorical("over_select", ["auto", "off"])
    return Defense(
        () if pre == "none" else tuple(pre.split("+")),
        rule,
        chosen,
        None if live in (None, "auto") else 1.0,
    )


def params_of(defense: Defense, faults: bool) -> dict[str, Any]:
    """The trial parameters that :func:`suggest` turns into ``defense`` (to enqueue it)."""
    out: dict[str, Any] = {"pre": "+".join(defense.pre) or "none", "rule": defense.rule}
    out.update({d: d in defense.defenses for d in ROUND_DEFENSES})
    if faults:
        out["over_select"] = "off" if defense.over_select == 1.0 else "auto"
    return out


def worst_case(
    trials: Trials, defense: Defense, pool: Sequence[dict[str, Any]], seeds: Sequence[int]
) -> tuple[float, int]:
    """(the lowest mean accuracy over ``seeds`` of ``defense`` against each attack of
    ``pool``, the index of that attack)."""
    scores = [sum(trials.accuracy(defense, a, s) for s in seeds) / len(seeds) for a in pool]
    i = min(range(len(scores)), key=lambda k: (scores[k], k))
    return scores[i], i


@dataclass
class DefenseResult:
    """The composition with the best worst case, that worst case, the pool attack that set
    it, every scored composition and every refused one (with the builder's reason)."""

    defense: Defense
    score: float
    attack: int
    scored: list[dict[str, Any]] = field(default_factory=list)
    refused: list[dict[str, Any]] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "defense": self.defense.to_json()}


def search_defense(
    trials: Trials,
    pool: Sequence[dict[str, Any]],
    seeds: Sequence[int],
    *,
    n_trials: int,
    timeout: float | None = None,
    start: Sequence[Defense] = (),
    seed: int = 0,
    on_trial: Callable[[str], None] | None = None,
) -> DefenseResult:
    """Optuna TPE (seeded by ``seed``) over :func:`suggest`, maximising
    :func:`worst_case` against ``pool`` on ``seeds``: at most ``n_trials`` compositions
    (refused ones included), none started after ``timeout`` seconds; ``start`` first."""
    faults = trials.base.get("faults") is not None
    study = optuna.create_study(direction="maximize", sampler=optuna.samplers.TPESampler(seed=seed))
    for d in start:
        study.enqueue_trial(params_of(d, faults))
    scored: dict[str, dict[str, Any]] = {}
    refused: dict[str, dict[str, Any]] = {}
    refusals: dict[Defense, str | None] = {}

    def objective(trial: optuna.Trial) -> float:
        defense = suggest(trial, faults)
        if defense not in refusals:
            refusals[defense] = refusal(trials.base, defense)
        why = refusals[defense]
        if why is not None:
            refused[defense.name] = {**defense.to_json(), "reason": why}
            raise optuna.TrialPruned(why)
        score, worst = worst_case(trials, defense, pool, seeds)
        scored[defense.name] = {**defense.to_json(), "score": score, "attack": worst}
        return score

    def callback(study: optuna.Study, trial: optuna.trial.FrozenTrial) -> None:
        if on_trial is not None:
            on_trial(f"defense: trial {trial.number} ({len(refused)} refused)")

    optimize(study, objective, n_trials, timeout, callback)
    if not scored:
        raise RuntimeError("defense search: every composition tried was refused")
    best = max(scored.values(), key=lambda c: (c["score"], -len(c["round_defenses"])))
    defense = Defense.of(best)
    return DefenseResult(
        defense, best["score"], best["attack"], list(scored.values()), list(refused.values())
    )


__all__ = [
    "PRE_AGGREGATORS",
    "ROUND_DEFENSES",
    "RULES",
    "DefenseResult",
    "params_of",
    "search_defense",
    "suggest",
    "worst_case",
]
