"""A bench spec → its runs: one validated config per defense × attack (× each point of its
placement ``search``) × share × heterogeneity × fault × attack mode × tuning candidate × seed.

Each run's config is the base config with, in order: the bench's ``set``, the
heterogeneity and fault overrides, the defense (server algorithm or aggregator, its
pre-aggregators and the declared f = ⌊wS⌋ + offset for every component whose schema has
an ``f``), the attack (name, share, mode, params), the tuning candidate's keys, and what
the protocol needs (test evaluation every ``eval_every`` rounds, a validation split, the backdoor
evaluator for a backdoor attack, one thread). Every config is checked as ``fedshield run``
checks one (:func:`fedshield.sweep.check_run`) before anything trains. A defense that
cannot run at some shares (Krum needs 2f + 2 < S) is *infeasible* there and left out,
with the reason; one that runs at no share is a configuration error.
"""

from __future__ import annotations

import difflib
import itertools
import json
import logging
import math
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fedshield import config as cfgmod
from fedshield.bench.spec import DECLARED_F, AttackSpec, BenchSpec, DefenseSpec
from fedshield.errors import ConfigError


@dataclass(frozen=True)
class Setting:
    """Where the protocol picks a defense's hyper-parameters: one column of the tables."""

    share: float
    heterogeneity: str
    fault: str
    mode: str

    @property
    def label(self) -> str:
        return f"w={self.share:g} {self.heterogeneity} {self.fault} {self.mode}"


@dataclass(frozen=True)
class Run:
    defense: str
    attack: str
    setting: Setting
    tune: int
    seed: int
    raw: dict[str, Any] = field(compare=False, hash=False, repr=False)
    #: The attack's placement (index into its ``search`` grid); None: it has no search.
    placement: int | None = None
    #: That placement's parameters as text ("h=0.9"; "" without a search).
    placement_label: str = field(default="", compare=False)

    @property
    def id(self) -> str:
        s = self.setting
        p = "" if self.placement is None else f"__p{self.placement}"
        return (
            f"{self.defense}__{self.attack}__w{s.share:g}__{s.heterogeneity}__{s.fault}__"
            f"{s.mode}__t{self.tune}{p}__s{self.seed}"
        )


@dataclass
class Plan:
    spec: BenchSpec
    runs: list[Run]
    tune: list[dict[str, Any]]
    settings: list[Setting]
    #: (defense, setting) → why the defense cannot run there
    infeasible: dict[tuple[str, Setting], str]

    def tune_label(self, i: int) -> str:
        return ", ".join(f"{k}={v}" for k, v in self.tune[i].items()) or "defaults"


def base_config(spec: BenchSpec, where: Path) -> dict[str, Any]:
    """The raw config every run starts from (a preset or a file, with the bench's plugins)."""
    from fedshield.sweep import _base

    raw = _base({"base": spec.base} if spec.base else {"file": spec.file}, where)
    if spec.plugins:
        from fedshield.plugins import resolve_plugin_paths

        raw["plugins"] = [*raw.get("plugins", []), *resolve_plugin_paths(spec.plugins, where)]
    return raw


def tune_candidates(spec: BenchSpec) -> list[dict[str, Any]]:
    keys = list(spec.tune)
    return [dict(zip(keys, vals)) for vals in itertools.product(*spec.tune.values())]


def _did_you_mean(name: str, names: list[str]) -> str:
    close = difflib.get_close_matches(name, names, n=1)
    return f" (did you mean {close[0]!r}?)" if close else ""


def defense_overrides(d: DefenseSpec, f: int, where: str) -> list[str]:
    """The overrides of a defense ``[pre+...+]rule`` with declared ``f``: a server algorithm
    of that name (with its default rule) or an aggregator under FedAvg."""
    from fedshield.aggregators.base import AGGREGATORS
    from fedshield.algorithms.server import SERVER_ALGORITHMS
    from fedshield.preaggregators import PRE_AGGREGATORS

    pre, rule = d.parts
    if rule in SERVER_ALGORITHMS.names():
        agg = SERVER_ALGORITHMS.get(rule).default_aggregator
        sets = [f'server.algorithm="{rule}"', f'server.aggregator="{agg}"']
    elif rule in AGGREGATORS.names():
        agg = rule
        sets = ['server.algorithm="fedavg"', f'server.aggregator="{rule}"']
    else:
        names = sorted({*SERVER_ALGORITHMS.names(), *AGGREGATORS.names()})
        raise ConfigError(
            f"{where}: unknown defense rule {rule!r}{_did_you_mean(rule, names)}; a defense is "
            f"[pre+...+]rule with rule a server algorithm or an aggregator "
            f"(`fedshield list aggregators`; plugins = [...] for your own)"
        )
    sets.append("server.aggregator_args={}")
    if "f" in AGGREGATORS.entry(agg).schema.model_fields:
        sets.append(f"server.aggregator_args.f={f}")
    sets.append(f"server.pre_aggregators={json.dumps(pre)}")
    sets.append("server.pre_aggregator_args={}")
    for p in pre:
        if p not in PRE_AGGREGATORS.names():
            names = PRE_AGGREGATORS.names()
            raise ConfigError(
                f"{where}: unknown pre-aggregator {p!r}{_did_you_mean(p, names)} in {d.name!r}"
            )
        if "f" in PRE_AGGREGATORS.entry(p).schema.model_fields:
            sets.append(f"server.pre_aggregator_args.{p}.f={f}")
    return sets


def backdoor_params(a: AttackSpec) -> dict[str, Any] | None:
    """The trigger of a backdoor attack (its schema is a :class:`Trigger`), which the
    backdoor evaluator needs to score it; None for other attacks."""
    from fedshield.attacks.backdoor import Trigger
    from fedshield.attacks.base import ATTACKS

    entry = ATTACKS.entry(a.name)
    if not issubclass(entry.schema, Trigger):
        return None
    parsed = entry.parse(a.params, "attack.params")
    return {k: getattr(parsed, k) for k in Trigger.model_fields}


def run_config(
    base: dict[str, Any],
    spec: BenchSpec,
    d: DefenseSpec,
    a: AttackSpec,
    s: Setting,
    tune: dict[str, Any],
    seed: int,
    name: str,
    placement: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """The raw config of one run (see the module docstring for the order); ``placement``:
    the attack parameters of one point of its search grid, over its ``params``."""
    raw = cfgmod.apply_overrides(
        base, [*spec.set, *spec.heterogeneity[s.heterogeneity], *spec.faults[s.fault]]
    )
    if spec.rounds is not None:
        raw["rounds"] = spec.rounds
    cohort = int(cfgmod.validate(raw, f"bench {name}").server.clients_per_round)
    f = max(0, math.floor(s.share * cohort + 1e-9) + int(tune.get(DECLARED_F, 0)))
    sets = defense_overrides(d, f, f"bench.defenses[{d.key}]")
    sets += [f'attack.name="{a.name}"', f"attack.fraction={s.share}", f'attack.mode="{s.mode}"']
    sets += [*d.set, *a.set]
    sets += [f"{k}={json.dumps(v)}" for k, v in tune.items() if k != DECLARED_F]
    raw = cfgmod.apply_overrides(raw, sets)
    raw["attack"]["params"] = {**a.params, **(placement or {})}
    rounds = int(raw.get("rounds", 1))
    trigger = backdoor_params(a)
    raw.setdefault("eval", {})
    every = min(spec.eval_every, rounds)  # each run's curves (runs/<run>/metrics.csv)
    raw["eval"] |= {"every": every, "metrics": ["backdoor"] if trigger else []}
    raw["eval"].pop("metrics_every", None)
    if trigger and every < rounds:
        raw["eval"]["metrics_every"] = every
    raw["eval"]["params"] = {"backdoor": trigger} if trigger else {}
    raw.setdefault("data", {})["val_size"] = spec.val_size
    raw.setdefault("checkpoint", {})["every"] = rounds
    raw.setdefault("run", {}).update(threads=1, progress=False)
    raw["name"], raw["seed"] = name, seed
    return raw


def points(a: AttackSpec) -> list[tuple[int | None, dict[str, Any]]]:
    """(placement index, parameters) of each point of the attack's search grid; one
    (None, {}) without a search."""
    if not a.search:
        return [(None, {})]
    return list(enumerate(a.placements()))


def check_search(a: AttackSpec) -> None:
    """Every ``search`` key is a parameter of the attack and every candidate passes its
    schema (one ConfigError naming ``bench.attacks[KEY].search.PARAM``)."""
    from fedshield.attacks import parse
    from fedshield.attacks.base import ATTACKS

    fields = ATTACKS.entry(a.name).schema.model_fields
    for key, values in a.search.items():
        where = f"bench.attacks[{a.key}].search.{key}"
        if key not in fields:
            raise ConfigError(
                f"{where}: not a parameter of attack {a.name!r}{_did_you_mean(key, list(fields))}"
                f" (its parameters: {', '.join(fields) or 'none'})"
            )
        for v in values:
            try:
                parse(a.name, {**a.params, key: v}, "attack.params")
            except ConfigError as err:
                raise ConfigError(f"{where}: {v!r}: {err}") from None


class _Once(logging.Filter):
    """Passes each distinct message once: the plan checks every run's components, and a
    defense's build-time statement is the same for each of its attacks and placements (the
    quiet bench printed it 342 times)."""

    def __init__(self) -> None:
        super().__init__()
        self.seen: set[tuple[int, str]] = set()

    def filter(self, record: logging.LogRecord) -> bool:
        key = (record.levelno, record.getMessage())
        if key in self.seen:
            return False
        self.seen.add(key)
        return True


@contextmanager
def _each_message_once() -> Iterator[None]:
    # one filter per handler: a record passes every handler (console, log file) once
    attached = [(h, _Once()) for h in logging.getLogger().handlers]
    for h, once in attached:
        h.addFilter(once)
    try:
        yield
    finally:
        for h, once in attached:
            h.removeFilter(once)


def plan(spec: BenchSpec, where: Path, check: bool = True) -> Plan:
    """Every run of ``spec``, validated (``check``: the components too, as ``fedshield run``
    does before loading data); each warning of the checks is printed once."""
    with _each_message_once():
        return _plan(spec, where, check)


def _plan(spec: BenchSpec, where: Path, check: bool) -> Plan:
    from fedshield.sim.builder import load_plugins
    from fedshield.sweep import check_run

    base = base_config(spec, where)
    load_plugins(base.get("plugins", []))
    from fedshield.attacks.base import ATTACKS

    for a in spec.attacks:
        if a.name not in ATTACKS.names():
            raise ConfigError(
                f"bench.attacks[{a.key}]: unknown attack {a.name!r}"
                f"{_did_you_mean(a.name, ATTACKS.names())} (`fedshield list attacks`)"
            )
        check_search(a)
    for key in spec.tune:
        if key != DECLARED_F:  # a config key: must exist in the schema
            first = f"{key}={json.dumps(spec.tune[key][0])}"
            cfgmod.validate(cfgmod.apply_overrides(base, [first]),
                            f"bench.tune.{key}")  # fmt: skip
    tunes = tune_candidates(spec)
    settings = [
        Setting(w, h, fl, m)
        for w in spec.shares
        for h in spec.heterogeneity
        for fl in spec.faults
        for m in spec.attack_modes
    ]
    runs: list[Run] = []
    infeasible: dict[tuple[str, Setting], str] = {}
    for d in spec.defenses:
        errors: dict[Setting, str] = {}
        for s in settings:
            for ti, tune in enumerate(tunes):
                for a, pi, point in [(x, *pp) for x in spec.attacks for pp in points(x)]:
                    for seed in spec.seeds:
                        run = Run(d.key, a.key, s, ti, seed, {}, pi)
                        raw = run_config(base, spec, d, a, s, tune, seed, run.id, point)
                        cfg = cfgmod.validate(raw, f"bench run {run.id}")
                        # the seed changes no component: one check per seed-less run
                        if check and s not in errors and seed == spec.seeds[0]:
                            try:
                                check_run(cfg, run.id)
                            except ConfigError as err:
                                errors[s] = str(err)
                        label = a.placement_label(pi)
                        runs.append(Run(d.key, a.key, s, ti, seed, raw, pi, label))
        runs = [r for r in runs if r.defense != d.key or r.setting not in errors]
        if errors and len(errors) == len(settings):  # never runs: the user's error
            raise ConfigError(f"bench.defenses[{d.key}]: {next(iter(errors.values()))}")
        infeasible |= {(d.key, s): why for s, why in errors.items()}
    return Plan(spec, runs, tunes, settings, infeasible)


__all__ = [
    "Plan",
    "Run",
    "Setting",
    "base_config",
    "check_search",
    "plan",
    "points",
    "run_config",
]
