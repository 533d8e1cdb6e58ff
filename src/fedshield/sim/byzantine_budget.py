"""What a run states at build time about the Byzantine share its rule sees.

**Attackers per cohort.** Under ``attack.mode = "per_round"`` every cohort of S holds exactly
⌊fraction·S⌋ attackers, and that is the rule's f. Under ``"fixed"`` (the default) A =
round(fraction·M) workers are Byzantine for the whole run and each cohort of S drawn
uniformly without replacement from M holds X ~ Hypergeometric(M, A, S) of them:

    P(X = k) = C(A, k) · C(M − A, S − k) / C(M, S)

(at M = 50, S = 10, 30 %: P(X ≥ 5) = 0.125 and the 0.99 quantile is 6). The rule is given
f = min(the ``attack.f_quantile`` quantile of X, the rule's breakdown on S) — a rule's own
``f`` when configured — and the run states P(X > f): the share of rounds the rule cannot
defend on its own (what cross-round defenses are for). Without an attack the rule outvotes
its breakdown on S.

**Groups a minority may own.** Depth/width tiers aggregate per coverage group and FedCART
aggregates class prototypes over the class's holders. A group with h holders, of which up
to min(f, h) may be attackers of a cohort, is said at build time when those attackers can be
half of the holders a cohort samples (2·min(f, h) ≥ min(h, S)), with what the run does
there: a root-reference rule bounds it, the per-block bound caps each step's size (not its
direction), or nothing does.

**Rows that arrive** (:mod:`fedshield.sim.arrivals`). Under ``[faults]`` the
law of X is the one of the *invited* cohort (S' = S, or more with ``server.over_select``)
under the fault model — attackers always online are over-represented when the cohort is
drawn from the clients online — and the statement adds the attackers' expected share of
the rows that arrive, P(they are at least half of them), and P(fewer rows arrive than the
rule needs for f): the expected share of skipped rounds, with one warning line when it is
above a tenth. ``server.over_select = "auto"`` invites the smallest S' ≥ S whose
P(round skipped or its rule outvoted) is within 0.01 of the least over S' ≤ min(M, 4S).

**The recommended configuration** (docs/cross-round.md, "Recommended configuration"). For the run's
threat model — root data at the server or not, ``attack.mode``, a ``[faults]`` model or not — the
statement names the configuration fedshield recommends, its measured worst case on the published
grid and what the configured server differs from it (:mod:`fedshield.crossround.recommended`: one
table, chosen from the measured cells, which the docs render too); a short form of it, with the
round defenses the run applies (a robust rule named alone gets the recommended ones), is the
console's build-time line (logger ``fedshield.statement``).

Everything is a log line at build time and the ``byzantine`` field of summary.json.
"""

from __future__ import annotations

import logging
import math
from dataclasses import asdict, dataclass, field
from typing import Any

from fedshield.algorithms.server.cohort import (
    breakdown_f,
    configured_f,
    needs_honest_majority,
    rows_needed,
)
from fedshield.registry import tags_of
from fedshield.sim.arrivals import Arrival, ArrivalLaw, arrival_law

log = logging.getLogger("fedshield")

#: Default quantile of the attackers per cohort that a fixed-mode run gives its rule as f.
F_QUANTILE = 0.99

#: A config that skips more than this share of its rounds is warned about (once).
SKIP_WARN = 0.1

#: ``over_select = "auto"``: S' within this of the least P(skipped or outvoted).
AUTO_SLACK = 0.01


def hypergeom_pmf(population: int, attackers: int, cohort: int) -> list[float]:
    """P(X = k), k = 0..cohort, of the attackers in a cohort drawn without replacement."""
    total = math.comb(population, cohort)
    return [
        math.comb(attackers, k) * math.comb(population - attackers, cohort - k) / total
        for k in range(cohort + 1)
    ]


def quantile(pmf: list[float], q: float) -> int:
    """The least k with P(X ≤ k) ≥ q."""
    acc = 0.0
    for k, p in enumerate(pmf):
        acc += p
        if acc >= q - 1e-12:
            return k
    return len(pmf) - 1


def tail(pmf: list[float], k: int) -> float:
    """P(X > k)."""
    return float(sum(pmf[k + 1 :]))


@dataclass
class ByzantineBudget:
    """The run's statement (module docstring)."""

    mode: str  #: "fixed", "per_round" or "none" (no attack)
    cohort: int  #: S
    population: int  #: M
    attackers: int | None  #: A (fixed) or the per-cohort count (per_round)
    f: int | None  #: the f the rule outvotes (None: the rule needs no count)
    breakdown: int | None  #: the largest f the rule alone tolerates on S
    f_quantile: float | None = None
    quantile_f: int | None = None  #: the f_quantile quantile of X (fixed)
    p_exceeds: float = 0.0  #: P(X > f): rounds the rule cannot defend alone
    p_at_least: dict[int, float] = field(default_factory=dict)  #: P(X ≥ k), k = 1..S
    groups: list[dict[str, Any]] = field(default_factory=list)
    invited: int = 0  #: S' ≥ S clients asked per round (0: S)
    #: under [faults]: a, r, invite; the attackers' share of arriving rows, P(≥ half),
    #: P(fewer rows arrive than the rule needs) = the expected share of skipped rounds
    arrival: dict[str, Any] | None = None
    #: the recommended configuration for the run's threat model (:func:`recommendation`)
    recommended: dict[str, Any] = field(default_factory=dict)

    @property
    def asked(self) -> int:
        return self.invited or self.cohort

    def line(self, rule: str) -> str:
        who = f"{rule}: f={self.f} of S={self.cohort}"
        if self.asked != self.cohort:
            who += f" (S'={self.asked} invited)"
        if self.f is None:
            who = f"{rule}: needs no Byzantine count (bounded by a reference or radius)"
        if self.mode == "none":
            return f"byzantine budget: no attack configured; {who} (its breakdown on S)"
        if self.mode == "per_round":
            return f"byzantine budget: per_round, exactly {self.attackers} per cohort; {who}"
        law = f"Hypergeometric({self.population}, {self.attackers}, {self.asked})"
        if self.arrival is not None:  # drawn from the clients online: the liveness line's law
            law = f"their law under [faults] (S'={self.asked} invited, see liveness)"
        return (
            f"byzantine budget: fixed, {self.attackers} of M={self.population} Byzantine, "
            f"attackers per cohort ~ {law} with quantile {self.f_quantile} = "
            f"{self.quantile_f}; {who} "
            f"(breakdown {self.breakdown}); P(a cohort holds more than f) = "
            f"{self.p_exceeds:.4g}: those rounds the rule cannot defend on its own"
        )

    def liveness_line(self, rule: str, fills: bool = False, pads: bool = False) -> str | None:
        """The [faults] statement (None without faults): who arrives and how many rounds
        are expected to be short of rows (padded with zero rows under ``pads``, else
        skipped); mentions the keys that keep rounds going."""
        a = self.arrival
        if a is None:
            return None
        need = "any row" if a["rows_needed"] == 1 else f"{a['rows_needed']} rows"
        out = (
            f"liveness: under [faults] honest clients are online with p={a['online']:.3g} and "
            f"answer with p={a['answer']:.3g} (invited from the {a['invite']} clients, "
            f"S'={self.asked})"
        )
        if self.mode != "none":
            out += (
                f"; the attackers' expected share of the rows that arrive is "
                f"{a['share']:.3g}, at least half of them with P={a['p_half']:.3g}"
            )
        fate = "padded with zero rows" if pads else "skipped"
        out += (
            f"; {rule} needs {need}: P(a round is {fate}) = {a['p_skip']:.3g}"
            + (" while the fill cache is empty" if fills else "")
        )
        if a["unknown"]:
            out += f" (no rate for {', '.join(a['unknown'])}: taken as 1)"
        if pads and a["p_skip"] > SKIP_WARN:
            out += (
                "; a padded round steps less (its missing rows vote to keep θ); "
                "server.short_rounds = \"skip\" keeps θ instead (docs/faults.md, liveness)"
            )
        elif a["p_skip"] > SKIP_WARN and not fills:
            out += (
                "; about that share of rounds will keep θ: set server.over_select = \"auto\" "
                "or server.round_defenses = [\"fill\"] (docs/faults.md, liveness)"
            )
        return out

    def as_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["p_at_least"] = {str(k): v for k, v in self.p_at_least.items()}
        for key in ("invited", "arrival"):  # only where over-selection or [faults] set them
            if not out[key]:
                del out[key]
        return out


def recommendation(
    *, root: bool, mode: str, faults: bool, server: dict[str, Any]
) -> dict[str, Any]:
    """The recommended configuration for the threat model (root data, attack mode,
    faults), its measured worst case and what ``server`` (the configured ``algorithm``,
    ``aggregator``, ``pre_aggregators``, the applied ``round_defenses``) differs in;
    ``line`` is the build-time sentence, ``short`` the console's."""
    from fedshield.crossround import recommended as rec

    threat = rec.ThreatModel(root, mode, faults)
    conf = rec.recommend(threat)
    worst = rec.worst_case(conf.name)
    return {
        "threat_model": threat.describe(),
        "name": conf.name,
        "server": conf.server(),
        "worst_case": None if worst is None else worst.describe(),
        "worst_gap": None if worst is None else worst.gap,
        "differs": rec.differences(conf, server),
        "line": rec.statement(threat, server),
        "short": rec.short_statement(threat, server),
    }


def per_round_count(fraction: float, cohort: int) -> int:
    """The engine's exact per-round count (``Simulator._byzantine``)."""
    return int(math.floor(fraction * cohort))


def run_budget(
    rule: Any,
    *,
    mode: str,
    fraction: float,
    population: int,
    cohort: int,
    f_quantile: float = F_QUANTILE,
    attacked: bool = True,
    arrival: Arrival | None = None,
    invited: int | None = None,
) -> ByzantineBudget:
    """The statement for ``rule`` on cohorts of ``cohort`` of ``population`` clients, of
    which ``invited`` (default ``cohort``) are asked, under the faults of ``arrival``."""
    budget, law = _budget_and_law(
        rule, mode, fraction, population, cohort, f_quantile, attacked, arrival, invited
    )
    if law is not None and arrival is not None:
        need = rows_needed(rule, budget.f) or budget.asked + 1
        budget.arrival = {
            "online": arrival.online,
            "answer": arrival.answer,
            "invite": arrival.invite,
            "unknown": list(arrival.unknown),
            "rows_needed": need,
            "share": law.share(),
            "p_half": law.p_half(),
            "p_skip": law.p_rows_below(need),
        }
    return budget


def _budget_and_law(
    rule: Any,
    mode: str,
    fraction: float,
    population: int,
    cohort: int,
    f_quantile: float,
    attacked: bool,
    arrival: Arrival | None,
    invited: int | None,
) -> tuple[ByzantineBudget, ArrivalLaw | None]:
    asked = min(population, max(cohort, invited or cohort))
    extra = asked if asked != cohort else 0  # ByzantineBudget.invited
    majority = needs_honest_majority(rule)
    own = configured_f(rule)
    if not attacked or fraction <= 0:
        # No attack: the rule outvotes its breakdown on the S rows it is meant to get
        # (not on S': over-selection must not ask it for every invited row).
        breakdown = breakdown_f(rule, cohort) if majority else None
        f = (own if own is not None else breakdown) if majority else None
        law = None
        if arrival is not None:
            law = arrival_law(population=population, invited=asked, arrival=arrival)
        return ByzantineBudget("none", cohort, population, None, f, breakdown, invited=extra), law
    breakdown = breakdown_f(rule, asked) if majority else None
    if mode == "per_round":
        count = per_round_count(fraction, asked)
        f = (own if own is not None else _capped(count, breakdown)) if majority else None
        law = None
        if arrival is not None:
            law = arrival_law(
                population=population, invited=asked, arrival=arrival, per_round_fraction=fraction
            )
        exceeds = 1.0 if f is not None and count > f else 0.0
        if law is not None and f is not None:
            exceeds = law.p_byzantine_above(f)
        return ByzantineBudget(
            "per_round", cohort, population, count, f, breakdown, p_exceeds=exceeds, invited=extra
        ), law
    a = int(round(fraction * population))
    law = None
    if arrival is None:
        pmf = hypergeom_pmf(population, a, asked)
    else:
        law = arrival_law(population=population, invited=asked, arrival=arrival, attackers=a)
        pmf = [float(p) for p in law.invited_attackers]
    q = quantile(pmf, f_quantile)
    f = (own if own is not None else _capped(q, breakdown)) if majority else None
    exceeds = 0.0
    if f is not None:
        exceeds = tail(pmf, f) if law is None else law.p_byzantine_above(f)
    budget = ByzantineBudget(
        "fixed",
        cohort,
        population,
        a,
        f,
        breakdown,
        f_quantile,
        q,
        exceeds,
        {k: tail(pmf, k - 1) for k in range(1, len(pmf))},
        invited=extra,
    )
    return budget, law


def auto_invited(
    rule: Any,
    *,
    mode: str,
    fraction: float,
    population: int,
    cohort: int,
    f_quantile: float = F_QUANTILE,
    attacked: bool = True,
    arrival: Arrival,
) -> int:
    """``server.over_select = "auto"``: the smallest S' in [S, min(M, 4S)] whose
    P(a round is skipped or its rule outvoted) — P(n < rows needed for f(S')) ∪ P(B > f(S'))
    — is within :data:`AUTO_SLACK` of the least over that range (module docstring)."""
    top = min(population, 4 * cohort)
    if arrival.lossless or top <= cohort:
        return cohort
    stride = max(1, math.ceil((top - cohort + 1) / 64))
    fails: list[tuple[int, float]] = []
    args = {
        "mode": mode, "fraction": fraction, "population": population, "cohort": cohort,
        "f_quantile": f_quantile, "attacked": attacked, "arrival": arrival,
    }  # fmt: skip
    for s in range(cohort, top + 1, stride):
        p = _p_fails(rule, args, s)
        fails.append((s, p))
        if p <= 1e-3:  # nothing larger can be meaningfully better
            break
    best = min(p for _, p in fails)
    return next(s for s, p in fails if p <= best + AUTO_SLACK)


def default_invited(rule: Any, **args: Any) -> int:
    """``server.over_select`` unset under [faults]: S where the rounds are live already —
    P(skipped or outvoted) at most :data:`SKIP_WARN` — else :func:`auto_invited`'s S'.
    Without an attack the rule's f stays its breakdown on S, so inviting more only adds
    rows; with one, f is taken from the S' invited and grows with it (at 30 % fixed
    attackers and 30 % dropout S' = 38 still skips a quarter of the rounds), so there S'
    is taken only where it makes the rounds live, and otherwise the run keeps S and its
    statement names ``fill``."""
    s = args["cohort"]
    if _p_fails(rule, args, s) <= SKIP_WARN:
        return s
    chosen = auto_invited(rule, **args)
    if not args.get("attacked", True):
        return chosen
    return chosen if _p_fails(rule, args, chosen) <= SKIP_WARN else s


def _p_fails(rule: Any, args: dict[str, Any], invited: int) -> float:
    """P(a round is skipped or its rule outvoted) with ``invited`` clients asked."""
    budget, law = _budget_and_law(
        rule, args["mode"], args["fraction"], args["population"], args["cohort"],
        args.get("f_quantile", F_QUANTILE), args.get("attacked", True), args["arrival"],
        invited,
    )  # fmt: skip
    assert law is not None  # arrival is given
    need = rows_needed(rule, budget.f)
    if need is None:
        return 1.0
    if budget.f is None:  # a rule that needs no count fails only on no row
        return law.p_rows_below(need)
    return law.p_fails(budget.f, need)


def _capped(f: int, breakdown: int | None) -> int:
    return f if breakdown is None else min(f, breakdown)


def group_statements(
    groups: list[tuple[str, list[int]]],
    budget: ByzantineBudget,
    rule: Any,
    what_runs: str,
) -> list[dict[str, Any]]:
    """For each ``(name, holders)`` a group whose holders a cohort's attackers can be half
    of under the run's f: a dict (name, holders, attackers, does) — ``does`` is what the
    run will do there (``what_runs`` for a rule bounded by its rows)."""
    f = budget.f
    if f is None:
        f = budget.breakdown if budget.breakdown is not None else 0
    s = budget.cohort
    out = []
    for name, holders in groups:
        h = len(holders)
        sampled = min(h, s)
        bad = min(f, h)
        if bad == 0 or 2 * bad < sampled:
            continue
        if getattr(rule, "needs_reference", False):
            does = "bounded by the root-data reference (reference-based rule)"
        elif not needs_honest_majority(rule) and "robust" in tags_of(rule):
            does = "bounded by the rule's fixed radius"
        else:
            does = what_runs
        out.append({"group": name, "holders": h, "attackers": bad, "does": does})
    return out


def warn_groups(kind: str, statements: list[dict[str, Any]]) -> None:
    for g in statements:
        log.warning(
            "%s %s: %d holder(s), up to %d may be attackers under the run's f (half or more): %s",
            kind,
            g["group"],
            g["holders"],
            g["attackers"],
            g["does"],
        )


__all__ = [
    "AUTO_SLACK",
    "F_QUANTILE",
    "SKIP_WARN",
    "ByzantineBudget",
    "auto_invited",
    "group_statements",
    "hypergeom_pmf",
    "per_round_count",
    "quantile",
    "recommendation",
    "run_budget",
    "tail",
    "warn_groups",
]
