"""f belongs to the sampled cohort, never to what arrived (docs/security.md §2c).

A Byzantine-robust rule without a trusted reference (Median, GeoMed, RFA, Krum, Multi-Krum,
Trimmed Mean, Bulyan, and the clipping rules whose radius is taken from the rows) is only as
good as the share of attackers among the rows it is given. That share is set by the S
clients the server *asked* this round: an attacker always answers, an honest client may
time out, crash or be censored (a forged reply under its id drops both copies). So the f the
rule must outvote is the cohort's f:

* the rule's configured ``f`` (a simulation derives it from the attack budget, see
  :mod:`fedshield.sim.byzantine_budget`), else the run's stated f (``server.byzantine_f``,
  capped by the rule's breakdown on S), else the rule's own breakdown on S rows (the
  largest f it tolerates on the cohort: Krum's ⌊(S − 3)/2⌋, the median's ⌊(S − 1)/2⌋, ...);
* missing, late and duplicated rows never lower it; rows the upload checks reject are
  known-bad and lower it by their number of distinct clients, where client ids are trusted
  (the simulator; not on Flower, where a forged id could lower f at will).

:func:`rows_needed` is the least number of kept rows on which the rule (behind its
pre-aggregators: f attackers spoil up to f buckets of Bucketing, Karimireddy et al. 2022)
still outvotes f rows. With fewer, the round step leaves θ unchanged
(``sys/skipped/too_few``): any output would be one the f rows may own. Rules bounded by a
root-data reference (BR-DRAG, FLTrust) or a fixed radius τ are bounded whatever the share,
and need no count.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from fedshield.errors import ConfigError
from fedshield.registry import tags_of

#: Beyond this many rows no rule's condition is searched for (a guard, not a limit in use).
MAX_ROWS = 1 << 14


def needs_honest_majority(rule: Any) -> bool:
    """A robust rule whose output the majority of its rows can own: no root-data
    reference (BR-DRAG, FLTrust rescale every row to ‖r‖) and no fixed radius τ (a
    relative τ is the lower median of the rows' norms, so the rows' majority sets it)."""
    tags = tags_of(rule)
    if "robust" not in tags or getattr(rule, "needs_reference", False):
        return False
    return getattr(rule, "tau", None) is None


def _count_rule(rule: Any) -> Any:
    """The rule with a Byzantine count f (Krum, Multi-Krum, Trimmed Mean, Bulyan), itself
    or behind pre-aggregators; None for a rule without one."""
    inner = rule.__dict__.get("rule", rule)
    return inner if hasattr(inner, "largest_f") and hasattr(inner, "check_f") else None


def rows_into_rule(rule: Any, num_rows: int) -> int:
    """Rows that reach the rule itself from ``num_rows`` (Bucketing: ⌈n/s⌉)."""
    chain = getattr(type(rule), "_chain", None)
    return chain(rule, num_rows)[-1] if chain is not None else num_rows


def breakdown_f(rule: Any, num_rows: int) -> int:
    """The largest f the rule alone tolerates on ``num_rows`` rows (0 when none)."""
    count = _count_rule(rule)
    if count is not None:
        largest = count.largest_f(num_rows)
        return 0 if largest is None else int(largest)
    return max(0, (num_rows - 1) // 2)


def configured_f(rule: Any) -> int | None:
    """The rule's own ``f`` hyper-parameter when set."""
    count = _count_rule(rule)
    f = getattr(count, "f", None) if count is not None else None
    return f if isinstance(f, int) and not isinstance(f, bool) else None


def cohort_f(rule: Any, cohort_size: int, stated: int | None = None) -> int | None:
    """The f of a cohort of ``cohort_size`` asked clients (module docstring); None for a
    rule that needs no honest majority."""
    if not needs_honest_majority(rule):
        return None
    f = configured_f(rule)
    if f is not None:
        return max(0, f)
    breakdown = breakdown_f(rule, cohort_size)
    # A stated f beyond the rule's breakdown could never run: the rule outvotes what it can
    # (the run's statement says how often a cohort holds more).
    return breakdown if stated is None else min(max(0, int(stated)), breakdown)


def _feasible(rule: Any, f: int, num_rows: int) -> bool:
    count = _count_rule(rule)
    if count is not None:
        try:
            rule.replace(f=f).validate(num_rows)
        except ConfigError:
            return False
        return True
    # Median, GeoMed, RFA, a relative-τ clip: f rows must stay a minority of what reaches it.
    return rows_into_rule(rule, num_rows) > 2 * f


def rows_needed(rule: Any, f: int | None) -> int | None:
    """The least number of kept rows on which the rule outvotes ``f`` Byzantine rows
    (through its pre-aggregators); 1 when ``f`` is None; None when no number of rows can."""
    if f is None:
        return 1
    for n in range(1, MAX_ROWS):
        if _feasible(rule, f, n):
            return n
    return None


@dataclass(frozen=True)
class RoundBudget:
    """The round's f and the kept rows the rule needs for it."""

    f: int | None
    needed: int | None  #: None: no number of rows suffices
    lowered: int = 0  #: by rows the upload checks rejected

    def too_few(self, kept: int) -> bool:
        return self.f is not None and (self.needed is None or kept < self.needed)

    def metrics(self) -> dict[str, float]:
        if self.f is None:
            return {}
        out = {"sys/f": float(self.f)}
        if self.lowered:
            out["sys/f_lowered"] = float(self.lowered)
        return out


def round_budget(
    rule: Any, cohort_size: int, stated: int | None = None, known_bad: int = 0
) -> RoundBudget:
    """The f of this round's cohort, lowered by ``known_bad`` rejected clients, and the
    kept rows the rule needs for it."""
    f = cohort_f(rule, cohort_size, stated)
    if f is None:
        return RoundBudget(None, 1)
    lowered = min(f, max(0, known_bad))
    f -= lowered
    return RoundBudget(f, rows_needed(rule, f), lowered)


def cap_for_f(counts: list[int], f: int) -> int | None:
    """The largest count limit L (one of the counts) under which no f rows hold half of
    the total weight: Σ of the f largest min(n, L) < Σ of the others. Without it a
    weighted geometric median (RFA) or weighted mean of clipped rows is owned by f rows
    whatever the rule's breakdown (Pillutla et al. 2022, weighted breakdown < 1/2). None:
    no limit is needed (or none helps: then f ≥ S/2 and the round is skipped before)."""
    if f <= 0 or len(counts) <= 2 * f:
        return None
    order = sorted(counts, reverse=True)
    for limit in order:
        capped = [min(n, limit) for n in order]
        if sum(capped[:f]) < sum(capped[f:]):
            return None if limit == order[0] else limit
    return order[-1]


__all__ = [
    "RoundBudget",
    "breakdown_f",
    "cap_for_f",
    "cohort_f",
    "configured_f",
    "needs_honest_majority",
    "round_budget",
    "rows_into_rule",
    "rows_needed",
]
