"""The configuration fedshield recommends per threat model (docs/cross-round.md, "Recommended
configuration"), and its measured worst case: one table that the build-time statement, the docs and
the bench read.

A threat model is (root data at the server or not; attack mode; fault model). The
candidates (:data:`CONFIGURATIONS`) are whole server configurations — algorithm, rule,
round defenses — and the bench (``bench/bench_quiet.py``) measures each on the grid of
the quiet-attacker reproducer (digits, mlp 64, Dirichlet 0.5, S/M 10/100 and 10/50, 30 % fixed
attackers, 30 rounds, seeds not tuned on) against noise, sign_flip, alie, ipm and the quiet attacks
(stealth, its jittered variant and the variant that reads collusion and consistency,
opportunist, cache_poison). Its cells are stored beside
this module (``quiet_measured.json``, with the commit and command that made them). The
recommendation for a threat model is the candidate usable under it (a root-data one only
where the server holds root data) with the best measured worst case — the largest
min over cells of (attacked − clean accuracy), the gap averaged over the seeds; so the
choice is made by the measurement, not typed beside it. The grid is fixed mode without
faults; the statement says so for the other modes and fault models, which get the same
choice. Beside the menu's worst case the statement gives the recommendation's worst case
against an attacker searched for it (``bench/bench_search.py``: Optuna over the ``quiet``
family on tuning seeds, measured on held-out seeds of the same grid; stored as
``searched_measured.json`` with the attack parameters found), where one was searched.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import cache
from importlib import resources
from typing import Any

#: The measured cells (written by ``bench/bench_quiet.py --write``).
MEASURED = "quiet_measured.json"
#: The cells of the attacker searched against a configuration, on held-out seeds of the same
#: grid (written by ``bench/bench_search.py --write-from``), with the attack parameters found.
SEARCHED = "searched_measured.json"


@dataclass(frozen=True)
class Configuration:
    """A server configuration: ``server.algorithm``, ``server.aggregator`` (None: the
    algorithm's own), ``server.round_defenses`` and ``server.pre_aggregators`` (empty: none,
    and not among its keys); ``root``: it needs root data."""

    name: str
    root: bool
    algorithm: str
    aggregator: str | None
    round_defenses: tuple[str, ...]
    pre_aggregators: tuple[str, ...] = ()

    def server(self) -> dict[str, Any]:
        """The ``[server]`` keys that select it."""
        out: dict[str, Any] = {
            "algorithm": self.algorithm,
            "round_defenses": list(self.round_defenses),
        }
        if self.aggregator is not None:
            out["aggregator"] = self.aggregator
        if self.pre_aggregators:
            out["pre_aggregators"] = list(self.pre_aggregators)
        return out

    def rule(self) -> str:
        """The aggregator it runs (the algorithm's own where ``aggregator`` is None)."""
        if self.aggregator is not None:
            return self.aggregator
        from fedshield.algorithms.server import SERVER_ALGORITHMS

        entry = SERVER_ALGORITHMS.entry(self.algorithm, "server.algorithm")
        own: str = entry.obj.default_aggregator
        return own

    def describe(self) -> str:
        rule = self.aggregator or f"{self.algorithm}'s own rule"
        if self.pre_aggregators:
            rule = " → ".join((*self.pre_aggregators, rule))
        defenses = ", ".join(self.round_defenses) or "none"
        return f"server.algorithm={self.algorithm}, rule {rule}, round defenses [{defenses}]"


#: The candidates the bench measures (``main`` is the quiet-attacker reproducer's configuration,
#: not a candidate).
CONFIGURATIONS: dict[str, Configuration] = {
    c.name: c
    for c in (
        Configuration("main", False, "fedavg", "median", ("step_bound", "reputation")),
        Configuration(
            "median-guarded",
            False,
            "fedavg",
            "median",
            ("collusion", "consistency", "step_bound", "reputation"),
        ),
        Configuration(
            "cc-momentum",
            False,
            "fedavg",
            "centered_clipping",
            ("collusion", "consistency", "momentum", "step_bound"),
        ),
        Configuration(
            "cc-momentum-rep",
            False,
            "fedavg",
            "centered_clipping",
            ("collusion", "consistency", "momentum", "step_bound", "reputation"),
        ),
        Configuration(
            "nnm-median",
            False,
            "fedavg",
            "median",
            ("collusion", "consistency", "step_bound", "reputation"),
            ("nnm",),
        ),
        Configuration("brdrag", True, "brdrag", None, ()),
        Configuration("brdrag-guarded", True, "brdrag", None, ("collusion", "consistency")),
    )
}

#: Not a candidate: the quiet-attacker reproducer's configuration (median + step_bound +
#: reputation), measured for comparison.
BASELINE = "main"

#: The recommendation before any measurement exists (or when none fits).
FALLBACK = {False: "median-guarded", True: "brdrag-guarded"}


@dataclass(frozen=True)
class ThreatModel:
    root: bool  #: the server holds a root data set (data.root_size > 0)
    mode: str  #: attack.mode: "fixed" or "per_round"
    faults: bool  #: a [faults] model is configured (honest clients go missing)

    def describe(self) -> str:
        root = "root data at the server" if self.root else "no root data"
        faults = "faults" if self.faults else "no faults"
        return f"{root}, {self.mode} attackers, {faults}"


#: The grid a cell without a ``data`` key was measured on (the quiet-attacker grid).
DIGITS = "digits/mlp"


@dataclass(frozen=True)
class WorstCase:
    """A configuration's worst measured cell: the attack, S/M and grid (``data``) where
    attacked − clean accuracy (mean over ``seeds``) is least."""

    attack: str
    clients: int
    cohort: int
    acc: float
    clean: float
    seeds: int
    cells: int  #: attacked cells measured for the configuration
    data: str = DIGITS

    @property
    def gap(self) -> float:
        return self.acc - self.clean

    def describe(self) -> str:
        on = "" if self.data == DIGITS else f" on {self.data}"
        return (
            f"{self.attack} at S/M {self.cohort}/{self.clients}{on}: {self.acc:.3f} vs clean "
            f"{self.clean:.3f} ({100 * self.gap:+.1f} points; mean of {self.seeds} seed(s), "
            f"worst of {self.cells} cells)"
        )


def _stored(name: str) -> dict[str, Any]:
    path = resources.files(__package__).joinpath(name)
    if not path.is_file():
        return {"cells": []}
    data: dict[str, Any] = json.loads(path.read_text())
    return data


@cache
def measured() -> dict[str, Any]:
    """The stored measurement (``{"cells": [], ...}`` when none is stored)."""
    return _stored(MEASURED)


@cache
def searched() -> dict[str, Any]:
    """The stored searched-attacker measurement: ``cells`` in :func:`measured`'s form (the
    attack named ``searched``) and, per cell of the grid, the attack parameters found
    (``{"cells": [], ...}`` when none is stored)."""
    return _stored(SEARCHED)


def searched_worst(
    name: str, data: dict[str, Any] | None = None, on: str | None = None
) -> WorstCase | None:
    """Configuration ``name``'s worst case against the attacker searched for it (the
    held-out seeds' mean gap at the S/M and grid where it is largest; ``on``: that grid
    only); None when not searched."""
    return worst_case(name, searched() if data is None else data, on)


def searched_grids(name: str, data: dict[str, Any] | None = None) -> list[str]:
    """The grids (``data`` labels) configuration ``name`` was searched on, the quiet grid
    first."""
    cells = (searched() if data is None else data)["cells"]
    found = {c.get("data", DIGITS) for c in cells if c["config"] == name}
    return sorted(found, key=lambda d: (d != DIGITS, d))


def worst_case(
    name: str, data: dict[str, Any] | None = None, on: str | None = None
) -> WorstCase | None:
    """The worst cell of configuration ``name`` in ``data`` (default: the stored
    measurement), over every grid its cells name (``data``; :data:`DIGITS` when absent)
    or over grid ``on`` only; None when it has no attacked cell with a clean twin."""
    cells = [
        c
        for c in (measured() if data is None else data)["cells"]
        if c["config"] == name and (on is None or c.get("data", DIGITS) == on)
    ]
    clean: dict[tuple[str, int, int, int], float] = {}
    for c in cells:
        if c["attack"] == "none":
            clean[(c.get("data", DIGITS), c["clients"], c["cohort"], c["seed"])] = c["acc"]
    pairs: dict[tuple[str, int, int, str], list[tuple[float, float]]] = {}
    for c in cells:
        grid = c.get("data", DIGITS)
        twin = clean.get((grid, c["clients"], c["cohort"], c["seed"]))
        if c["attack"] == "none" or twin is None:
            continue
        key = (c["attack"], c["clients"], c["cohort"], grid)
        pairs.setdefault(key, []).append((c["acc"], twin))
    if not pairs:
        return None
    means = {
        k: (sum(a for a, _ in v) / len(v), sum(b for _, b in v) / len(v), len(v))
        for k, v in pairs.items()
    }
    key = min(means, key=lambda k: (means[k][0] - means[k][1], k))
    a, b, n = means[key]
    return WorstCase(key[0], key[1], key[2], a, b, n, len(means), key[3])


def _usable(threat: ThreatModel) -> list[Configuration]:
    return [
        c for c in CONFIGURATIONS.values() if c.name != BASELINE and (threat.root or not c.root)
    ]


def _best(usable: list[Configuration], data: dict[str, Any] | None) -> Configuration | None:
    """The best measured worst case among ``usable`` measured on the most cells."""
    worst = {c.name: w for c in usable if (w := worst_case(c.name, data)) is not None}
    most = max((w.cells for w in worst.values()), default=0)
    # A candidate measured on fewer cells than another is not comparable with it.
    scored = [(w.gap, name) for name, w in worst.items() if w.cells == most]
    return CONFIGURATIONS[max(scored)[1]] if scored else None


def recommend(threat: ThreatModel, data: dict[str, Any] | None = None) -> Configuration:
    """The candidate usable under ``threat`` with the best measured worst case (module
    docstring) among those measured on the most cells; :data:`FALLBACK` when none is
    measured."""
    return _best(_usable(threat), data) or CONFIGURATIONS[FALLBACK[threat.root]]


def for_rule(
    threat: ThreatModel,
    rule: str,
    pre_aggregators: tuple[str, ...] | list[str] | None = (),
    data: dict[str, Any] | None = None,
) -> Configuration:
    """The configuration whose round defenses a robust rule named without
    ``server.round_defenses`` gets (docs/cross-round.md, "Default"): among the candidates
    usable under ``threat`` that run the same rule behind the same pre-aggregators (None:
    behind any, the rule named alone), the one with the best measured worst case; a rule no
    candidate runs gets those of the recommendation without root data (its round defenses
    act on rows and applied steps, not on a reference, so they suit any rule)."""
    same = [
        c
        for c in _usable(threat)
        if c.rule() == rule
        and (pre_aggregators is None or tuple(c.pre_aggregators) == tuple(pre_aggregators))
    ]
    if same:
        best = _best(same, data)
        # Unmeasured: the rule's candidate with the most round defenses.
        return best or max(same, key=lambda c: (len(c.round_defenses), c.name))
    return recommend(ThreatModel(False, threat.mode, threat.faults), data)


def threat_models() -> list[ThreatModel]:
    return [
        ThreatModel(root, mode, faults)
        for root in (False, True)
        for mode in ("fixed", "per_round")
        for faults in (False, True)
    ]


def differences(rec: Configuration, server: dict[str, Any]) -> list[str]:
    """What the configured ``server`` keys (algorithm, aggregator, pre_aggregators,
    round_defenses) differ in from ``rec``'s, one phrase each; empty when they select it."""
    out = []
    want = {**rec.server(), "pre_aggregators": list(rec.pre_aggregators)}
    for key in ("algorithm", "aggregator", "pre_aggregators", "round_defenses"):
        if key not in want:
            continue
        have = server.get(key)
        if key in ("round_defenses", "pre_aggregators"):
            have = list(have or [])
        if have != want[key]:
            out.append(f"server.{key}={have!r} (recommended {want[key]!r})")
    return out


def statement(threat: ThreatModel, server: dict[str, Any]) -> str:
    """The build-time line: the recommendation for ``threat``, its measured worst case and
    what the configured ``server`` differs in."""
    rec = recommend(threat)
    worst = worst_case(rec.name)
    where = (
        ""
        if (threat.mode, threat.faults) == ("fixed", False)
        else (" (measured in fixed mode without faults)")
    )
    said = worst.describe() + where if worst is not None else "not measured"
    hunt = searched_worst(rec.name)
    if hunt is not None:
        said += f"; against an attacker searched for it: {hunt.describe()}"
    diff = differences(rec, server)
    differs = "; ".join(diff) if diff else "the configured run is this configuration"
    return (
        f"recommended for {threat.describe()}: {rec.name!r} ({rec.describe()}); measured worst "
        f"case {said}; {differs}"
    )


#: A default never keeps a model per client: defenses whose memory is O(M·d) (momentum, cache,
#: fill) would hold M rows of d in the server state and in every checkpoint (opt in to them).
DEFAULT_MEMORY_EXCLUDED = "M*d"


def default_defenses(conf: Configuration) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """The round defenses of ``conf`` a robust rule named alone gets, and those left out for
    their memory (:data:`DEFAULT_MEMORY_EXCLUDED`, read from the registry's ``memory`` tag)."""
    from fedshield.crossround.base import ROUND_DEFENSES

    def heavy(name: str) -> bool:
        entry = ROUND_DEFENSES.entry(name, "server.round_defenses")
        return DEFAULT_MEMORY_EXCLUDED in entry.tag_values("memory")

    kept = tuple(n for n in conf.round_defenses if not heavy(n))
    return kept, tuple(n for n in conf.round_defenses if heavy(n))


def short_statement(threat: ThreatModel, server: dict[str, Any]) -> str:
    """:func:`statement` in a few words, for the console: the recommendation, its worst
    measured gap and what the configured ``server`` differs in."""
    rec = recommend(threat)
    worst = worst_case(rec.name)
    gap = "not measured" if worst is None else f"worst measured case {100 * worst.gap:+.1f} points"
    hunt = searched_worst(rec.name)
    if hunt is not None:
        gap += f", {100 * hunt.gap:+.1f} against an attacker searched for it"
    diff = differences(rec, server)
    differs = "the run differs in " + ", ".join(diff) if diff else "the run is this configuration"
    return f"recommended for {threat.describe()}: {rec.name!r} ({gap}); {differs}"


def markdown_table(
    data: dict[str, Any] | None = None, hunted: dict[str, Any] | None = None
) -> str:
    """The docs' table: per threat model, the recommendation, its worst case on the menu
    grid and against the attacker searched for it (``hunted``: default the stored one)."""
    lines = [
        "| root data | attack mode | faults | recommended | configuration | worst case "
        "| searched attacker |",
        "|---|---|---|---|---|---|---|",
    ]
    for t in threat_models():
        rec = recommend(t, data)
        worst = worst_case(rec.name, data)
        said = "not measured" if worst is None else worst.describe()
        hunt = searched_worst(rec.name, hunted, DIGITS)
        found = "not searched" if hunt is None else hunt.describe()
        others = [
            w.describe()
            for g in searched_grids(rec.name, hunted)
            if g != DIGITS and (w := searched_worst(rec.name, hunted, g)) is not None
        ]
        found = "; ".join([found, *others])
        if (t.mode, t.faults) != ("fixed", False):
            said = said if worst is None else "as fixed, no faults: " + said
            found = found if hunt is None else "as fixed, no faults: " + found
        lines.append(
            f"| {'yes' if t.root else 'no'} | {t.mode} | {'yes' if t.faults else 'no'} | "
            f"`{rec.name}` | {rec.describe()} | {said} | {found} |"
        )
    return "\n".join(lines)


__all__ = [
    "BASELINE",
    "DIGITS",
    "CONFIGURATIONS",
    "Configuration",
    "ThreatModel",
    "WorstCase",
    "default_defenses",
    "differences",
    "for_rule",
    "markdown_table",
    "measured",
    "recommend",
    "searched",
    "searched_grids",
    "searched_worst",
    "short_statement",
    "statement",
    "threat_models",
    "worst_case",
]
