"""Fuzz the CLI's bad-input contract with mutated configs (``tests/test_config_fuzz.py``).

Each case starts from a bundled preset and applies one to three seeded mutations:

* a value in **every parameter table** (``client.params``, ``server.params``,
  ``server.aggregator_args``, ``attack.params``, ``model.params``, ``data.params``,
  ``eval.params.<metric>``): one of the chosen component's own parameters (or an unknown
  key) set to NaN, ±inf, a huge, negative or zero number, a wrong type, an array holding
  NaN, a nested table, ...;
* any leaf of the config (``client.lr``, ``data.root_size``, ``name``, ...) set to such a
  value;
* a component name (``server.aggregator``, ``attack.name``, ``model.name``, ...) swapped
  for another registered one or for a typo.

The mutated config is written as TOML (which spells NaN and infinity) and given to
``fedshield run FILE --out DIR``. With ``depth="checks"`` the experiment's build is replaced
by a sentinel, so a case ends *refused* (exit 2, one ``error:`` line on stderr), *accepted*
(every check before the data passed) or with a *traceback* (any other exception: a bug).
"""

from __future__ import annotations

import copy
import math
import random
import traceback
from collections import Counter
from collections.abc import Iterator
from contextlib import redirect_stderr, redirect_stdout
from dataclasses import dataclass, field
from io import StringIO
from pathlib import Path
from typing import Any

import tomli_w

#: Values a mutation writes: non-finite and extreme numbers, wrong types, nesting.
VALUES: tuple[Any, ...] = (
    math.nan,
    math.inf,
    -math.inf,
    1e308,
    -1e308,
    1e18,
    -1.0,
    -1,
    0,
    0.0,
    1,
    0.5,
    2**63,
    -(2**63),
    5e-324,
    "",
    "x",
    "../escaped",
    True,
    False,
    [],
    [math.nan],
    [1, -math.inf],
    {},
    {"a": math.nan},
)

#: The free-form parameter tables of a config, with the registry whose entry reads them.
PARAM_TABLES = (
    ("client.params", "client.algorithm"),
    ("server.params", "server.algorithm"),
    ("server.aggregator_args", "server.aggregator"),
    ("attack.params", "attack.name"),
    ("model.params", "model.name"),
    ("data.params", "data.dataset"),
)

NAME_KEYS = (
    "client.algorithm",
    "server.algorithm",
    "server.aggregator",
    "attack.name",
    "model.name",
    "data.dataset",
    "data.partition",
)


def _registries() -> dict[str, Any]:
    from fedshield.cli import _registries as regs

    r = regs()
    return {
        "client.algorithm": r["client-algorithms"],
        "server.algorithm": r["server-algorithms"],
        "server.aggregator": r["aggregators"],
        "attack.name": r["attacks"],
        "model.name": r["models"],
        "data.dataset": r["datasets"],
        "data.partition": r["partitioners"],
        "eval.metrics": r["evaluators"],
    }


def _get(raw: dict[str, Any], key: str) -> Any:
    node: Any = raw
    for part in key.split("."):
        if not isinstance(node, dict) or part not in node:
            return None
        node = node[part]
    return node


def _set(raw: dict[str, Any], key: str, value: Any) -> None:
    parts = key.split(".")
    node = raw
    for part in parts[:-1]:
        child = node.get(part)
        if not isinstance(child, dict):
            child = node[part] = {}
        node = child
    node[parts[-1]] = value


def _leaves(node: Any, prefix: str = "") -> list[str]:
    if isinstance(node, dict) and node:
        return [k for key, v in node.items() for k in _leaves(v, f"{prefix}{key}.")]
    return [prefix[:-1]] if prefix else []


@dataclass
class Case:
    """One mutated config: the preset it came from and the mutations, as text."""

    preset: str
    raw: dict[str, Any]
    mutations: list[str] = field(default_factory=list)


def _schema_keys(regs: dict[str, Any], name_key: str, raw: dict[str, Any]) -> list[str]:
    name = _get(raw, name_key)
    reg = regs[name_key]
    if not isinstance(name, str) or name not in reg:
        return []
    return list(reg.entry(name).schema.model_fields)


def mutate(raw: dict[str, Any], rng: random.Random, regs: dict[str, Any]) -> list[str]:
    """Apply one random mutation to ``raw`` in place; returns what it did, as text."""
    kind = rng.choice(("param", "param", "param", "leaf", "name"))
    value = rng.choice(VALUES)
    if kind == "param":
        table, name_key = rng.choice(PARAM_TABLES)
        if rng.random() < 0.3 and raw.get("eval", {}).get("metrics"):
            metric = rng.choice(raw["eval"]["metrics"])
            table, keys = f"eval.params.{metric}", list(
                regs["eval.metrics"].entry(metric).schema.model_fields
            )
        else:
            keys = _schema_keys(regs, name_key, raw)
        key = rng.choice(keys) if keys and rng.random() < 0.85 else "unknown_key"
        _set(raw, f"{table}.{key}", value)
        return [f"{table}.{key}={value!r}"]
    if kind == "leaf":
        key = rng.choice(_leaves(raw))
        _set(raw, key, value)
        return [f"{key}={value!r}"]
    key = rng.choice(NAME_KEYS)
    names = regs[key].package_names()
    new = rng.choice([*names, "no_such_name", f"{_get(raw, key)}x"])
    _set(raw, key, new)
    return [f"{key}={new!r}"]


def cases(n: int, seed: int = 0, presets: list[str] | None = None) -> Iterator[Case]:
    """``n`` mutated configs, a pure function of ``seed``."""
    from fedshield.config import preset_names, read_preset

    regs = _registries()
    rng = random.Random(seed)
    pool = presets or preset_names()
    bases = {p: read_preset(p) for p in pool}
    for _ in range(n):
        preset = rng.choice(pool)
        raw = copy.deepcopy(bases[preset])
        case = Case(preset, raw)
        for _ in range(rng.randint(1, 3)):
            case.mutations += mutate(raw, rng, regs)
        yield case


class _Reached(Exception):
    """The config passed every check before the data (the build was reached)."""


@dataclass
class Outcome:
    case: Case
    kind: str  # "refused", "accepted", "traceback" or "bad-error" (not one error: line)
    detail: str = ""


def run_case(case: Case, workdir: Path) -> Outcome:
    """``fedshield run`` on the case, up to the experiment's build (see the module doc)."""
    import fedshield.sim.builder as builder
    from fedshield.cli import main

    path = workdir / "case.toml"
    path.write_text(tomli_w.dumps(case.raw))
    out = workdir / "out"
    real = builder.build

    def reached(*a: Any, **k: Any) -> Any:
        raise _Reached

    builder.build = reached
    err, sink = StringIO(), StringIO()
    try:
        with redirect_stderr(err), redirect_stdout(sink):
            code = main(["run", str(path), "--out", str(out), "-q"])
    except _Reached:
        return Outcome(case, "accepted")
    except BaseException as exc:
        tb = "".join(traceback.format_exception(exc))
        return Outcome(case, "traceback", tb[-2000:])
    finally:
        builder.build = real
    lines = err.getvalue().strip().splitlines()
    if code == 2 and len(lines) == 1 and lines[0].startswith("error: "):
        return Outcome(case, "refused", lines[0])
    return Outcome(case, "bad-error", f"exit {code}: {lines[-3:]}")


def run_fuzz(n: int, workdir: Path, seed: int = 0) -> tuple[Counter[str], list[Outcome]]:
    """Run ``n`` cases; returns the outcome counts and the failures (tracebacks, and exits
    that are not one ``error:`` line with status 2)."""
    counts: Counter[str] = Counter()
    bad = []
    for i, case in enumerate(cases(n, seed)):
        d = workdir / str(i)
        d.mkdir(parents=True, exist_ok=True)
        res = run_case(case, d)
        counts[res.kind] += 1
        if res.kind in ("traceback", "bad-error"):
            bad.append(res)
    return counts, bad


__all__ = ["Case", "Outcome", "VALUES", "cases", "mutate", "run_case", "run_fuzz"]
