"""One trial of the searches (:mod:`fedshield.search`): a base experiment with a server
defense composition and an attack swapped in, run in memory and read as its final test
accuracy (docs/cross-round.md, "Searched attacker").

Runs are cached by (defense, attack, seed, rounds): the alternating searches ask for the
same cell more than once.
"""

from __future__ import annotations

import copy
import json
import logging
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import optuna

from fedshield.errors import FedshieldError


@contextmanager
def quiet_logs() -> Iterator[None]:
    """fedshield's log at ERROR for the block: every trial would repeat its build-time
    statement (the byzantine budget, the recommendation)."""
    log = logging.getLogger("fedshield")
    level = log.level
    log.setLevel(logging.ERROR)
    try:
        yield
    finally:
        log.setLevel(level)


@dataclass(frozen=True)
class Defense:
    """A server composition: ``server.pre_aggregators``, ``server.aggregator`` (None: the
    algorithm's own), ``server.round_defenses``, ``server.over_select`` (liveness; None:
    unset) and ``server.algorithm`` (a root-referenced one, BR-DRAG or FLTrust, is given a
    root set of :data:`ROOT_SIZE` samples unless the base config has one)."""

    pre: tuple[str, ...]
    rule: str | None
    defenses: tuple[str, ...]
    over_select: float | str | None = None
    algorithm: str = "fedavg"

    @property
    def name(self) -> str:
        pre = "+".join((*self.pre, self.rule or self.algorithm))
        live = "" if self.over_select is None else f" over_select={self.over_select}"
        return f"{pre}[{','.join(self.defenses)}]{live}"

    @property
    def needs_root(self) -> bool:
        """Its server algorithm trains on a root set (the registry's ``needs_root`` tag)."""
        from fedshield.algorithms.server import SERVER_ALGORITHMS

        return "needs_root" in SERVER_ALGORITHMS.entry(self.algorithm, "server.algorithm").tags

    def server(self) -> dict[str, Any]:
        """The ``[server]`` keys that select it."""
        out: dict[str, Any] = {
            "algorithm": self.algorithm,
            "pre_aggregators": list(self.pre),
            "round_defenses": list(self.defenses),
        }
        if self.rule is not None:
            out["aggregator"] = self.rule
        if self.over_select is not None:
            out["over_select"] = self.over_select
        return out

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, **self.server()}

    @classmethod
    def of(cls, server: dict[str, Any]) -> Defense:
        """The composition a ``[server]`` section selects."""
        algorithm = str(server.get("algorithm", "fedavg"))
        rule = server.get("aggregator")
        return cls(
            tuple(server.get("pre_aggregators") or ()),
            None if rule is None and algorithm != "fedavg" else str(rule or "mean"),
            tuple(server.get("round_defenses") or ()),
            server.get("over_select"),
            algorithm,
        )


#: The root set a root-referenced defense gets when the base config has none (the quiet
#: grid's, bench/bench_quiet.py).
ROOT_SIZE = 100


def experiment(
    base: dict[str, Any],
    defense: Defense,
    attack: dict[str, Any] | None,
    seed: int,
    rounds: int,
) -> dict[str, Any]:
    """The raw config of one trial: ``base`` with the defense's server keys, ``attack`` as
    the ``quiet`` family's parameters (None: the clean twin, no attack), the seed and
    rounds, evaluated once at the end, in memory and without a progress bar. The base's
    attack share and mode are kept."""
    raw = copy.deepcopy(base)
    server = raw.setdefault("server", {})
    for key in (
        "aggregator",
        "aggregator_args",
        "pre_aggregator_args",
        "round_defense_args",
        "over_select",
    ):
        server.pop(key, None)
    server.update(defense.server())
    if defense.needs_root and not raw.get("data", {}).get("root_size"):
        raw.setdefault("data", {})["root_size"] = ROOT_SIZE
    raw.update(seed=seed, rounds=rounds, name=f"search-{seed}")
    raw["eval"] = {**raw.get("eval", {}), "every": rounds, "metrics": [], "metrics_every": None}
    raw["run"] = {**raw.get("run", {}), "progress": False}
    raw.pop("checkpoint", None)
    share = raw.get("attack", {})
    if attack is None:
        raw.pop("attack", None)
    else:
        raw["attack"] = {
            "name": "quiet",
            "params": dict(attack),
            "fraction": share.get("fraction", 0.0),
            "mode": share.get("mode", "fixed"),
            **({"f_quantile": share["f_quantile"]} if "f_quantile" in share else {}),
        }
    return {k: v for k, v in raw.items() if v is not None}


def refusal(base: dict[str, Any], defense: Defense) -> str | None:
    """Why the builder refuses ``defense`` on ``base`` (its error message), or None when it
    builds (checked as the CLI checks a run: before any data is loaded)."""
    from fedshield.config import validate
    from fedshield.sim.builder import build_components

    rounds = int(base.get("rounds", 1))
    try:
        with quiet_logs():
            build_components(validate(experiment(base, defense, {}, 0, rounds), "search"))
    except FedshieldError as err:
        return str(err)
    return None


@dataclass
class Trials:
    """Runs trials of ``base`` (a raw config whose ``attack`` section gives the attackers'
    share and mode), caching each accuracy."""

    base: dict[str, Any]
    rounds: int
    cache: dict[str, float] = field(default_factory=dict)
    runs: int = 0
    seconds: float = 0.0

    def accuracy(self, defense: Defense, attack: dict[str, Any] | None, seed: int) -> float:
        """Final test accuracy of ``defense`` against the ``quiet`` attack with ``attack``'s
        parameters (None: clean) on ``seed``."""
        from fedshield.config import validate
        from fedshield.runner import run

        key = json.dumps([defense.name, attack, seed, self.rounds], sort_keys=True)
        if key not in self.cache:
            start = time.perf_counter()
            with quiet_logs():
                raw = experiment(self.base, defense, attack, seed, self.rounds)
                res = run(validate(raw, "search"), None, quiet=True)
            self.cache[key] = float(res["final_test_acc"])
            self.runs += 1
            self.seconds += time.perf_counter() - start
        return self.cache[key]

    def per_run(self) -> float:
        """Mean seconds of a run so far (0 before any)."""
        return self.seconds / self.runs if self.runs else 0.0


def optimize(
    study: optuna.Study,
    objective: Callable[[optuna.Trial], float],
    n_trials: int,
    timeout: float | None,
    callback: Callable[[optuna.Study, optuna.trial.FrozenTrial], None],
) -> None:
    """``study.optimize`` one trial at a time: at most ``n_trials``, none started after
    ``timeout`` seconds (Optuna's own timeout lets a started trial finish as well, but
    checks it only between its batches). Optuna's per-trial log lines are silenced."""
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    began = time.perf_counter()
    n = 0
    while n < n_trials and (timeout is None or time.perf_counter() - began < timeout):
        study.optimize(objective, n_trials=1, callbacks=[callback])
        n += 1


__all__ = ["ROOT_SIZE", "Defense", "Trials", "experiment", "optimize", "quiet_logs", "refusal"]
