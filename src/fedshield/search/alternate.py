"""Alternating best responses between the searched attacker and the searched defense
(docs/cross-round.md, "Searched attacker"), then the choice measured on held-out seeds.

Each step: the attacker re-searches against the chosen defense
(:func:`fedshield.search.attack_search.search_attack`, starting from every attack of the
pool) and its best attack joins the pool;
the defense search (:func:`fedshield.search.defense_search.search_defense`) picks the
composition with the best worst case against the pool. It stops when neither side gains
more than ``tolerance`` (a point of accuracy by default) over the last step, or when the
budget ends. Held out: the chosen defense, clean and against every attack of the pool, on
seeds the search never ran; its worst case is the pool attack with the largest mean gap to
clean.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from fedshield.search.attack_search import MENU, search_attack, unique
from fedshield.search.defense_search import search_defense, worst_case
from fedshield.search.trials import Defense, Trials


@dataclass(frozen=True)
class Budget:
    """Wall-clock seconds for the whole search, and the trial caps of each step."""

    seconds: float
    attack_trials: int = 12
    defense_trials: int = 12
    steps: int = 4
    tolerance: float = 0.01


def held_out(
    trials: Trials, defense: Defense, pool: Sequence[dict[str, Any]], seeds: Sequence[int]
) -> dict[str, Any]:
    """``defense`` on ``seeds``: clean and per pool attack, the per-seed accuracies; the
    worst case is the attack with the lowest mean attacked − clean gap."""
    clean = [trials.accuracy(defense, None, s) for s in seeds]
    rows = []
    for i, attack in enumerate(pool):
        accs = [trials.accuracy(defense, attack, s) for s in seeds]
        gap = sum(a - c for a, c in zip(accs, clean, strict=True)) / len(seeds)
        rows.append({"attack": i, "params": attack, "acc": accs, "gap": gap})
    worst = min(rows, key=lambda r: (r["gap"], r["attack"]))
    return {
        "defense": defense.to_json(),
        "seeds": list(seeds),
        "clean": clean,
        "attacks": rows,
        "worst": worst,
    }


def recommend(
    trials: Trials,
    start: Sequence[Defense],
    tuning: Sequence[int],
    held: Sequence[int],
    budget: Budget,
    *,
    known: Sequence[dict[str, Any]] = (),
    on_step: Callable[[str], None] | None = None,
) -> dict[str, Any]:
    """The alternating search (module docstring) from the compositions ``start`` (the
    first is the incumbent) and the attack pool of the menu plus ``known`` (attacks found
    before, e.g. by an earlier search), then the held-out measurement of the choice. The
    held-out runs are reserved from the budget by the mean run time so far."""
    say = on_step or (lambda _: None)
    began = time.perf_counter()

    def left() -> float:
        reserve = trials.per_run() * (1 + len(pool)) * len(held)
        return budget.seconds - (time.perf_counter() - began) - reserve

    pool = unique([*MENU.values(), *known])
    defense = start[0]
    score, _ = worst_case(trials, defense, pool, tuning)
    log: list[dict[str, Any]] = []
    refused: dict[str, dict[str, Any]] = {}
    for step in range(budget.steps):
        if left() <= 0:
            break
        attack = search_attack(
            trials,
            defense,
            tuning,
            n_trials=budget.attack_trials,
            timeout=max(left() / 2, 0.0),
            seed=step,
            menu=False,
            known=pool,  # the menu, then every attack found so far
            on_trial=say,
        )
        attacker_gain = score - attack.acc
        if attack.params not in pool:
            pool.append(attack.params)
        score, _ = worst_case(trials, defense, pool, tuning)
        entry: dict[str, Any] = {
            "step": step,
            "attack": attack.to_json(),
            "attacker_gain": attacker_gain,
        }
        if left() <= 0:
            log.append(entry)
            break
        found = search_defense(
            trials,
            pool,
            tuning,
            n_trials=budget.defense_trials,
            timeout=max(left(), 0.0),
            start=[defense, *start],
            seed=step,
            on_trial=say,
        )
        refused.update({r["name"]: r for r in found.refused})
        defender_gain = found.score - score
        if defender_gain > 0:
            defense, score = found.defense, found.score
        entry.update(defense=found.to_json(), defender_gain=defender_gain, chosen=defense.name)
        log.append(entry)
        say(f"step {step}: {defense.name} worst {score:.3f}")
        if attacker_gain <= budget.tolerance and defender_gain <= budget.tolerance:
            break
    say(f"held out: {defense.name} on seeds {list(held)}")
    measured = held_out(trials, defense, pool, held)
    return {
        "choice": defense.to_json(),
        "tuning_score": score,
        "held_out": measured,
        "pool": pool,
        "steps": log,
        "refused": list(refused.values()),
        "runs": trials.runs,
        "seconds": round(time.perf_counter() - began, 1),
    }


__all__ = ["Budget", "held_out", "recommend"]
