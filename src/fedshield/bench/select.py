"""ByzFL's evaluation protocol on a bench's results.

Per defense and setting (share × heterogeneity × fault × attack mode), each tuning
candidate h is scored by its **worst case over the attack set on the validation split**:
min over attacks of the mean over seeds of the validation accuracy (a diverged run scores
−1, below any accuracy). The candidate with the highest score is chosen (ties: the first
listed), and the **test** accuracy of that candidate is reported per attack; the cell's
worst case is the attack with the lowest mean test accuracy, named. An attack under which
any seed diverged is *diverged* — never a number — and is the worst case before any
accuracy. (Allouah et al., "Fixing by Mixing", AISTATS 2023 §5; González et al., "ByzFL",
2025: hyper-parameters chosen on held-out data by the worst case over attacks.)

An attack with a placement ``search`` (docs/security.md §6b: a quiet attacker searches where to put
its rows against the defense it faces) enters the selection by its best placement on the
validation split, and its cell is its best placement on test — the lowest mean test
accuracy, a diverged placement first — with the placement named.
"""

from __future__ import annotations

import math
import statistics
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

from fedshield.bench.plan import Plan, Setting, points
from fedshield.bench.spec import AttackSpec

#: Score of a diverged run in the selection: below every accuracy.
DIVERGED_SCORE = -1.0
#: Two-sided 95 % Student-t quantiles by degrees of freedom (the sweep tables' intervals).
T975 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306,
        9: 2.262}  # fmt: skip


@dataclass
class AttackCell:
    """One defense × attack × setting at the chosen candidate, over the seeds."""

    attack: str
    test: list[float]
    diverged: int
    asr: list[float] = field(default_factory=list)
    #: The attacker's best placement of its ``search`` grid ("h=0.9"; "" without one) and
    #: its index (None without one).
    placement: str = ""
    placement_index: int | None = None

    @property
    def is_diverged(self) -> bool:
        return self.diverged > 0

    @property
    def rank(self) -> tuple[bool, float]:
        """Lower is worse for the defense: a diverged cell first, then the lowest mean."""
        return (not self.is_diverged, self.mean)

    @property
    def mean(self) -> float:
        return statistics.fmean(self.test) if self.test else math.nan

    @property
    def half(self) -> float:
        n = len(self.test)
        if n < 2:
            return math.nan
        return T975.get(n - 1, 1.96) * statistics.stdev(self.test) / math.sqrt(n)

    def text(self, digits: int = 3) -> str:
        if self.is_diverged:
            return "diverged"
        h = self.half
        return f"{self.mean:.{digits}f}" if h != h else f"{self.mean:.{digits}f} ± {h:.{digits}f}"


@dataclass
class Choice:
    """A defense's result in one setting: the chosen candidate and its attack cells."""

    defense: str
    setting: Setting
    tune: int
    val_worst: float
    cells: dict[str, AttackCell]

    @property
    def worst(self) -> AttackCell:
        """The worst attack: a diverged one first, else the lowest mean test accuracy."""
        return min(self.cells.values(), key=lambda c: c.rank)

    @property
    def worst_score(self) -> float:
        """The worst case as a number for ranking (diverged: −1)."""
        w = self.worst
        return DIVERGED_SCORE if w.is_diverged else w.mean


def _score(recs: list[dict[str, Any]]) -> float:
    """Mean validation accuracy over the seeds; a diverged seed makes it −1."""
    if any(r.get("status") == "diverged" or r.get("val_acc") is None for r in recs):
        return DIVERGED_SCORE
    return statistics.fmean(r["val_acc"] for r in recs)


def _cell(a: AttackSpec, recs: list[dict[str, Any]], placement: int | None) -> AttackCell:
    ok = [r for r in recs if r.get("status") != "diverged" and r.get("test_acc") is not None]
    return AttackCell(
        a.key,
        [r["test_acc"] for r in ok],
        len(recs) - len(ok),
        [r["backdoor_asr"] for r in ok if r.get("backdoor_asr") is not None],
        a.placement_label(placement),
        placement,
    )


def select(plan: Plan, results: dict[str, dict[str, Any]]) -> list[Choice]:
    """The protocol over every (defense, setting) that ran (see the module docstring)."""
    by: dict[tuple[str, Setting, int, str, int | None], list[dict[str, Any]]] = defaultdict(list)
    for run in plan.runs:
        rec = results.get(run.id)
        if rec is not None:
            by[run.defense, run.setting, run.tune, run.attack, run.placement].append(rec)
    grids = {a.key: [p for p, _ in points(a)] for a in plan.spec.attacks}
    choices = []
    for d in [x.key for x in plan.spec.defenses]:
        for s in plan.settings:
            if (d, s) in plan.infeasible:
                continue
            scores = []
            for t in range(len(plan.tune)):
                # the attacker's best placement on validation, per attack
                per_attack = [
                    [_score(by[k]) for p in grids[a.key] if (k := (d, s, t, a.key, p)) in by]
                    for a in plan.spec.attacks
                ]
                if all(per_attack):
                    scores.append((min(min(x) for x in per_attack), t))
            if not scores:
                continue
            best = max(scores, key=lambda x: (x[0], -x[1]))
            cells = {}
            for a in plan.spec.attacks:
                tried = [
                    _cell(a, by[k], p)
                    for p in grids[a.key]
                    if (k := (d, s, best[1], a.key, p)) in by
                ]
                cells[a.key] = min(tried, key=lambda c: c.rank)  # the attacker's best
            choices.append(Choice(d, s, best[1], best[0], cells))
    return choices


__all__ = ["AttackCell", "Choice", "select"]
