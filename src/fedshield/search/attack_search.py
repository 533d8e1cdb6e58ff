"""The attacker as a search (docs/cross-round.md, "Searched attacker"): Optuna's TPE over
the parameters of the ``quiet`` family (:mod:`fedshield.attacks.quiet_family`) against one
defense composition, minimising the final test accuracy averaged over tuning seeds.

Successive halving (Optuna's ``SuccessiveHalvingPruner``; Jamieson & Talwalkar, AISTATS
2016) reads each seed's accuracy as a rung: a trial whose running mean is not among the
lowest is stopped before its next seed. The menu's quiet attacks that the family covers
(:data:`MENU`) are the first trials, so the search starts from the menu and keeps the
strongest of it when nothing it samples does better.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import optuna

from fedshield.search.trials import Defense, Trials, optimize

#: Every parameter a trial sets, at the values that give ``stealth``'s rows.
STEALTH: dict[str, Any] = {
    "centre": "median",
    "direction": "mean",
    "cosine": 1.0,
    "h": 0.9,
    "spread": "copies",
    "j": 1.0,
    "timing": "always",
    "sleep": 0,
}

#: The first trials: stealth, stealth with evade (the simplex past collusion and
#: consistency), the hug row with each attacker's own honest deviation (distinct rows whose
#: offsets look honest; also at reputation's radius, τ = 3 × the median honest distance)
#: and an opportunist-like outvoting hug.
MENU: dict[str, dict[str, Any]] = {
    "stealth": STEALTH,
    "stealth*": {**STEALTH, "spread": "simplex"},
    "hug+own": {**STEALTH, "spread": "own"},
    "hug+own τ=3": {**STEALTH, "spread": "own", "tau": 3.0},
    "outvote": {**STEALTH, "timing": "outvote", "h": 1.0},
}


def suggest(trial: optuna.Trial, rounds: int) -> dict[str, Any]:
    """The family's parameters for one trial: centre, direction and its cosine, placement
    h (up to 3 × the radius), the radius (the tightest published one, or τ ∈ [0.5, 5] ×
    the median honest distance), spread and its scale, timing and sleeper phase (up to
    half the rounds)."""
    out = {
        "centre": trial.suggest_categorical("centre", ["median", "mean", "rule", "nnm"]),
        "direction": trial.suggest_categorical("direction", ["mean", "sign"]),
        "cosine": trial.suggest_float("cosine", 0.2, 1.0),
        "h": trial.suggest_float("h", 0.2, 3.0),
        "spread": trial.suggest_categorical("spread", ["copies", "simplex", "own"]),
        "j": trial.suggest_float("j", 0.0, 3.0),
        "timing": trial.suggest_categorical("timing", ["always", "outvote"]),
        "sleep": trial.suggest_int("sleep", 0, max(rounds // 2, 0)),
    }
    if trial.suggest_categorical("radius", ["published", "spread"]) == "spread":
        out["tau"] = trial.suggest_float("tau", 0.5, 5.0)
    return out


def enqueued(params: dict[str, Any]) -> dict[str, Any]:
    """The trial parameters that :func:`suggest` turns into the family's ``params``."""
    out = {k: v for k, v in params.items() if k != "tau"}
    out["radius"] = "published" if params.get("tau") is None else "spread"
    if params.get("tau") is not None:
        out["tau"] = params["tau"]
    return out


def unique(attacks: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """``attacks`` (copied) without repeats, in their first order."""
    out: list[dict[str, Any]] = []
    for a in attacks:
        if dict(a) not in out:
            out.append(dict(a))
    return out


@dataclass
class AttackResult:
    """The strongest attack found: its parameters, its mean accuracy on the tuning seeds,
    and every trial (parameters, mean accuracy or None when pruned, state)."""

    defense: Defense
    params: dict[str, Any]
    acc: float
    trials: list[dict[str, Any]] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "defense": self.defense.to_json()}


def search_attack(
    trials: Trials,
    defense: Defense,
    seeds: Sequence[int],
    *,
    n_trials: int,
    timeout: float | None = None,
    seed: int = 0,
    halving: bool = True,
    menu: bool = True,
    known: Sequence[dict[str, Any]] = (),
    on_trial: Callable[[str], None] | None = None,
) -> AttackResult:
    """Optuna TPE (seeded by ``seed``) over :func:`suggest` against ``defense``: at most
    ``n_trials`` trials, none started after ``timeout`` seconds; the objective is the mean
    final test accuracy over ``seeds`` (minimised). ``halving``: successive halving over the
    seeds (module docstring); ``menu``: :data:`MENU` first; ``known``: then these attacks
    (found against other defenses: an attack that beat one composition is the first thing
    an attacker tries on the next; on the digits grid the attack searched against BR-DRAG
    cost NNM → median 22 points, the one searched against it 5)."""
    sampler = optuna.samplers.TPESampler(seed=seed, n_startup_trials=min(5, n_trials))
    pruner: optuna.pruners.BasePruner = (
        optuna.pruners.SuccessiveHalvingPruner(min_resource=1, reduction_factor=2)
        if halving and len(seeds) > 1
        else optuna.pruners.NopPruner()
    )
    study = optuna.create_study(direction="minimize", sampler=sampler, pruner=pruner)
    for params in unique([*(MENU.values() if menu else ()), *known]):
        study.enqueue_trial(enqueued(params))

    def objective(trial: optuna.Trial) -> float:
        params = suggest(trial, trials.rounds)
        trial.set_user_attr("attack", params)
        accs: list[float] = []
        for step, s in enumerate(seeds):
            accs.append(trials.accuracy(defense, params, s))
            # steps count seeds from 1: Optuna's halving reaches its first rung at step 1
            trial.report(sum(accs) / len(accs), step + 1)
            if step + 1 < len(seeds) and trial.should_prune():
                raise optuna.TrialPruned()
        return sum(accs) / len(accs)

    def callback(study: optuna.Study, trial: optuna.trial.FrozenTrial) -> None:
        if on_trial is not None:
            best = study.best_value if _any_complete(study) else math.nan
            on_trial(f"attack vs {defense.name}: trial {trial.number} best {best:.3f}")

    optimize(study, objective, n_trials, timeout, callback)
    done = [t for t in study.trials if t.state == optuna.trial.TrialState.COMPLETE]
    log = [
        {
            "number": t.number,
            "params": t.user_attrs.get("attack", t.params),
            "acc": t.value,
            "state": t.state.name.lower(),
        }
        for t in study.trials
    ]
    if not done:
        raise RuntimeError(f"attack search vs {defense.name}: no trial completed")
    best = min(done, key=lambda t: (t.value, t.number))
    assert best.value is not None
    return AttackResult(defense, dict(best.user_attrs["attack"]), float(best.value), log)


def _any_complete(study: optuna.Study) -> bool:
    return any(t.state == optuna.trial.TrialState.COMPLETE for t in study.trials)


__all__ = ["MENU", "STEALTH", "AttackResult", "enqueued", "search_attack", "suggest", "unique"]
