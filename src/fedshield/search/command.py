"""``fedshield recommend CONFIG --budget-minutes N``: the searched attacker against the
searched defense (:mod:`fedshield.search.alternate`), with a progress line, the choice, its
held-out worst case and the attack that set it printed, and a JSON result with the commit
and the config's hash (:mod:`fedshield.provenance`)."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

from fedshield.errors import ConfigError


def seeds(text: str) -> list[int]:
    """``"1,2"`` → [1, 2]."""
    try:
        out = [int(s) for s in text.split(",") if s.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: expected seeds like 1,2,3") from None
    if not out:
        raise argparse.ArgumentTypeError("expected at least one seed")
    return out


def add_parser(sub: Any, parents: list[argparse.ArgumentParser], func: Any) -> None:
    r = sub.add_parser(
        "recommend", parents=parents,
        help="search an attacker and a defense against each other; the defense with the best "
        "held-out worst case",
    )  # fmt: skip
    r.add_argument("config", help="experiment TOML: data, model, client, rounds, attack share")
    r.add_argument("--budget-minutes", type=float, required=True, help="wall-clock budget")
    r.add_argument("--tuning-seeds", type=seeds, default=[1, 2], help="searched on (default 1,2)")
    r.add_argument(
        "--held-out-seeds", type=seeds, default=[11, 12, 13],
        help="the choice measured on (default 11,12,13)",
    )  # fmt: skip
    r.add_argument("--rounds", type=int, help="rounds of every trial (default: the config's)")
    r.add_argument("--attack-trials", type=int, default=12, help="trials per attacker search")
    r.add_argument("--defense-trials", type=int, default=12, help="trials per defense search")
    r.add_argument(
        "--attacks",
        nargs="+",
        help="JSON files of attacks found before, to start the attacker's pool from: a list of "
        "quiet-family parameter sets, or a result of fedshield recommend (its pool) or of "
        "bench/bench_search.py (the attacks it searched)",
    )
    r.add_argument("--out", default="recommend.json", help="the JSON result")
    r.add_argument("-q", "--quiet", action="store_true", help="no progress line")
    r.set_defaults(func=func)


def known_attacks(path: str) -> list[dict[str, Any]]:
    """The attacks in ``path`` (see ``--attacks``), each checked against the quiet family's
    schema; a file that holds none, or a set the family refuses, is a ConfigError."""
    from pydantic import ValidationError

    from fedshield.attacks.quiet_family import QuietParams

    try:
        data = json.loads(Path(path).read_text())
    except (OSError, ValueError) as err:
        raise ConfigError(f"--attacks {path}: cannot read a JSON file ({err})") from None
    if isinstance(data, dict) and "pool" in data:
        found = data["pool"]
    elif isinstance(data, dict) and "searches" in data:
        found = [s["params"] for s in data["searches"].values()]
    else:
        found = data
    if not isinstance(found, list) or not found or not all(isinstance(a, dict) for a in found):
        raise ConfigError(
            f"--attacks {path}: expected a list of parameter sets, a fedshield recommend result "
            "or a bench_search result"
        )
    for i, attack in enumerate(found):
        try:
            QuietParams(**attack)
        except ValidationError as err:
            first = err.errors()[0]
            where = ".".join(str(x) for x in first["loc"])
            raise ConfigError(f"--attacks {path}: attack {i}: {where}: {first['msg']}") from None
    return [dict(a) for a in found]


def cmd_recommend(args: argparse.Namespace, console: Console) -> int:
    from fedshield.config import dump, load
    from fedshield.provenance import sha256_text, source_commit
    from fedshield.search.alternate import Budget, recommend
    from fedshield.search.trials import Defense, Trials, refusal

    cfg = load(args.config)
    if cfg.attack.fraction <= 0.0:
        raise ConfigError(
            f"{args.config}: attack.fraction = 0; set the attackers' share the search plays "
            '(e.g. attack.fraction = 0.3, attack.mode = "fixed")'
        )
    if cfg.server.algorithm != "fedavg":
        raise ConfigError(
            f"{args.config}: server.algorithm = {cfg.server.algorithm!r}; the searched "
            "compositions are fedavg's (pre-aggregators, rule, round defenses)"
        )
    if set(args.tuning_seeds) & set(args.held_out_seeds):
        raise ConfigError("--tuning-seeds and --held-out-seeds must not share a seed")
    known: list[dict[str, Any]] = []
    for path in args.attacks or []:
        known += [a for a in known_attacks(path) if a not in known]
    base = cfg.model_dump(mode="json", exclude_none=True)
    rounds = args.rounds or cfg.rounds
    if cfg.server.round_defenses is None:  # the search starts from what the run applies
        from fedshield.aggregators.base import AGGREGATORS
        from fedshield.sim.builder import (
            default_pre_aggregators,
            default_round_defenses,
            load_plugins,
        )

        load_plugins(cfg.plugins)
        entry = AGGREGATORS.entry(cfg.server.aggregator, "server.aggregator")
        pre = default_pre_aggregators(cfg, entry)
        base["server"]["pre_aggregators"] = pre[0]
        base["server"]["round_defenses"] = default_round_defenses(cfg, entry, pre)[0]
    start = Defense.of(base["server"])
    why = refusal(base, start)
    if why is not None:
        raise ConfigError(f"{args.config}: the configured server composition is refused: {why}")
    trials = Trials(base, rounds)
    budget = Budget(args.budget_minutes * 60.0, args.attack_trials, args.defense_trials)
    with Progress(
        SpinnerColumn(), TextColumn("{task.description}"), TimeElapsedColumn(),
        console=console, disable=args.quiet, transient=True,
    ) as bar:  # fmt: skip
        task = bar.add_task("search", total=None)
        result = recommend(
            trials,
            [start],
            args.tuning_seeds,
            args.held_out_seeds,
            budget,
            known=known,
            on_step=lambda text: bar.update(task, description=text),
        )
    out = {
        **source_commit(),
        "config_sha256": sha256_text(dump(cfg)),
        "config": str(args.config),
        "command": "fedshield " + " ".join(sys.argv[1:]),
        "rounds": rounds,
        "budget_minutes": args.budget_minutes,
        "tuning_seeds": args.tuning_seeds,
        **result,
    }
    Path(args.out).write_text(json.dumps(out, indent=1) + "\n")
    held = result["held_out"]
    worst = held["worst"]
    clean = sum(held["clean"]) / len(held["clean"])
    console.print(f"choice: {result['choice']['name']}", highlight=False)
    console.print(
        f"held-out worst case (seeds {held['seeds']}): {clean + worst['gap']:.3f} vs clean "
        f"{clean:.3f} ({100 * worst['gap']:+.1f} points)",
        highlight=False,
    )
    console.print(f"set by quiet {json.dumps(worst['params'])}", highlight=False)
    console.print(f"{trials.runs} runs; wrote {args.out}", highlight=False)
    return 0


__all__ = ["add_parser", "cmd_recommend", "known_attacks", "seeds"]
