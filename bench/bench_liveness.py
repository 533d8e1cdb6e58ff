"""Liveness under faults: rounds skipped and accuracy, side by side.

digits, mlp (hidden 64), M = 50, S = 10, Dirichlet 0.5 (min_size 10), sgd lr 0.1 × 10 steps
of batch 16, fedavg with uniform weighting, fixed-mode attackers, seed 8, 30 rounds. Each
scenario (a fault model, with or without a 30 % ``noise`` attack) runs with the defaults
(``default``: over-selection where the law of arrivals says it makes the rounds live), with
liveness off (``off``: ``server.over_select = 1``, the behaviour before docs/faults.md,
"Liveness") and with each setting given on the command line
(``server.over_select = "auto"``; ``server.round_defenses = ["fill"]`` with
``faults.invite = "population"``), and prints the final test accuracy, the rounds skipped
and the largest Byzantine share of the rows the rule saw, next to the same run without
faults.

    PYTHONPATH=src OMP_NUM_THREADS=1 python bench/bench_liveness.py [--rule median]
"""

from __future__ import annotations

import argparse
import copy
import subprocess
import time
from typing import Any

from fedshield.config import validate
from fedshield.runner import run

BASE: dict[str, Any] = {
    "name": "liveness",
    "seed": 8,
    "rounds": 30,
    "data": {
        "dataset": "digits",
        "num_clients": 50,
        "partition": "dirichlet",
        "beta": 0.5,
        "min_size": 10,
    },
    "model": {"name": "mlp", "params": {"hidden": 64}},
    "client": {"algorithm": "sgd", "lr": 0.1, "batch_size": 16, "local_steps": 10},
    "server": {"algorithm": "fedavg", "clients_per_round": 10, "weighting": "uniform"},
    "eval": {"every": 30},
    "run": {"threads": 1, "progress": False},
}

ATTACK = {"name": "noise", "params": {"sigma": 100.0}, "fraction": 0.3, "mode": "fixed"}

#: name → [faults] section (None: no faults)
FAULTS: dict[str, dict[str, Any] | None] = {
    "none": None,
    "dropout 0.3": {"models": ["dropout"], "params": {"dropout": {"p": 0.3}}},
    "dropout 0.6": {"models": ["dropout"], "params": {"dropout": {"p": 0.6}}},
    "deadline 0.5 drop": {
        "models": ["deadline"],
        "params": {"deadline": {"deadline": 0.5, "late": "drop"}},
    },
    "availability 0.5": {"models": ["availability"], "params": {"availability": {"p": 0.5}}},
    # deadline = e^(0.5·0.842) = 1.523: a lognormal speed (σ 0.5) makes it with P = 0.80
    "deadline 80 %": {
        "models": ["deadline"],
        "params": {"deadline": {"deadline": 1.523, "late": "drop"}},
    },
    "all three": {
        "models": ["availability", "dropout", "deadline"],
        "params": {
            "availability": {"p": 0.5},
            "dropout": {"p": 0.3},
            "deadline": {"deadline": 1.523, "late": "drop"},
        },
    },
}

#: name → (server keys, faults keys)
SETTINGS: dict[str, tuple[dict[str, Any], dict[str, Any]]] = {
    "default": ({}, {}),
    # the behaviour before liveness was the default (docs/faults.md, "Liveness")
    "off": ({"over_select": 1}, {}),
    "over_select": ({"over_select": "auto"}, {}),
    "fill": ({"round_defenses": ["fill"]}, {"invite": "population"}),
    "both": ({"over_select": "auto", "round_defenses": ["fill"]}, {"invite": "population"}),
    "step_bound+reputation": ({"round_defenses": ["step_bound", "reputation"]}, {}),
    "fill+step_bound+reputation": (
        {"round_defenses": ["fill", "step_bound", "reputation"]},
        {"invite": "population"},
    ),
}


def one(rule: str, faults: str, setting: str, attacked: bool, seed: int, rounds: int) -> dict:
    raw = copy.deepcopy(BASE)
    raw["seed"], raw["rounds"], raw["eval"] = seed, rounds, {"every": rounds}
    server_keys, fault_keys = SETTINGS[setting]
    raw["server"].update(aggregator=rule, **server_keys)
    section = FAULTS[faults]
    if section is not None:
        raw["faults"] = {**copy.deepcopy(section), **fault_keys}
    if attacked:
        raw["attack"] = dict(ATTACK)
    res = run(validate(raw, "bench_liveness"), None, quiet=True)
    hist = res.history
    return {
        "acc": float(res["final_test_acc"]),
        "skipped": sum(1 for r in hist if r.get("sys/skipped")),
        "share": max((float(r.get("byz/share_kept", 0.0)) for r in hist), default=0.0),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rule", default="median")
    ap.add_argument("--faults", nargs="+", default=[k for k in FAULTS if k != "none"])
    ap.add_argument("--settings", nargs="+", default=list(SETTINGS), choices=list(SETTINGS))
    ap.add_argument("--attacked", nargs="+", default=["clean", "noise"])
    ap.add_argument("--seed", type=int, default=8)
    ap.add_argument("--rounds", type=int, default=30)
    args = ap.parse_args()
    commit = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=False
    ).stdout.strip()
    print(
        f"digits mlp64 M=50 S=10 dirichlet 0.5, {args.rule}, fixed mode, seed {args.seed}, "
        f"{args.rounds} rounds, commit {commit or '?'}"
    )
    width = max(19, *(len(s) for s in args.settings))
    head = f"{'attack':<6} {'faults':<17} {'no faults':>9} " + " ".join(
        f"{s:>{width}}" for s in args.settings
    )
    print(head)
    print("-" * len(head))
    start = time.perf_counter()
    for which in args.attacked:
        attacked = which != "clean"
        ref = one(args.rule, "none", "default", attacked, args.seed, args.rounds)
        for faults in args.faults:
            cells = []
            for s in args.settings:
                r = one(args.rule, faults, s, attacked, args.seed, args.rounds)
                cells.append(f"{r['acc']:6.3f} {r['skipped']:3d} ({r['share']:.2f})")
            print(
                f"{which:<6} {faults:<17} {ref['acc']:9.3f} "
                + " ".join(f"{c:>{width}}" for c in cells),
                flush=True,
            )
    print(
        f"({time.perf_counter() - start:.0f} s; each cell: final test accuracy, rounds θ was "
        "kept (skipped), (the largest Byzantine share of the rows the rule saw in a round))"
    )


if __name__ == "__main__":
    main()
