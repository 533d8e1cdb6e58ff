"""Defenses across rounds on the fixed-attacker reproducer of docs/cross-round.md
(``fedshield.crossround``).

digits, mlp (hidden 64), M = 50, S = 10, Dirichlet 0.5 (min_size 10), sgd lr 0.1 × 10
steps of batch 16, fedavg with uniform weighting, 30 % Byzantine ``noise`` (σ = 100),
seed 7, 30 rounds. For each robust rule and each round defense (none, ``step_bound``,
``cache``, both, ``step_bound`` then ``reputation``) it runs the default
``attack.mode = "fixed"`` (attackers chosen once; cohorts hold 1–6 of them), its
``per_round`` twin (exactly 3 per cohort) and the same run without an attack (the
defense's clean cost), and prints the final test accuracy, the
largest ‖θ‖ over the run and the gap between the fixed run and the per_round run without a
round defense (the target: within 5 points, docs/cross-round.md).

    PYTHONPATH=src OMP_NUM_THREADS=1 python bench/bench_cross_round.py [--rules median trimmed_mean]
"""

from __future__ import annotations

import argparse
import subprocess
import time
from typing import Any

from fedshield.config import validate
from fedshield.runner import run

BASE: dict[str, Any] = {
    "name": "cross-round",
    "seed": 7,
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
    "attack": {"name": "noise", "params": {"sigma": 100.0}, "fraction": 0.3},
    "eval": {"every": 30},
    "run": {"threads": 1, "progress": False},
}

DEFENSES: dict[str, list[str]] = {
    "none": [],
    "step_bound": ["step_bound"],
    "cache": ["cache"],
    "cache+step_bound": ["cache", "step_bound"],
    "step_bound+reputation": ["step_bound", "reputation"],
}


def one(
    rule: str, defenses: list[str], mode: str | None, seed: int, rounds: int
) -> dict[str, float]:
    raw = {k: dict(v) if isinstance(v, dict) else v for k, v in BASE.items()}
    raw["seed"], raw["rounds"] = seed, rounds
    raw["eval"] = {"every": rounds}
    raw["server"] = {**BASE["server"], "aggregator": rule, "round_defenses": defenses}
    if mode is None:
        raw.pop("attack")
    else:
        raw["attack"] = {**BASE["attack"], "mode": mode}
    res = run(validate(raw, "bench_cross_round"), None, quiet=True)
    return {
        "acc": float(res["final_test_acc"]),
        "theta": max(float(r["sys/theta_norm"]) for r in res.history),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rules", nargs="+", default=["median", "trimmed_mean"])
    ap.add_argument("--defenses", nargs="+", default=list(DEFENSES), choices=list(DEFENSES))
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--rounds", type=int, default=30)
    args = ap.parse_args()
    commit = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=False
    ).stdout.strip()
    print(
        f"digits mlp64 M=50 S=10 dirichlet 0.5, noise sigma=100 at 30 %, seed {args.seed}, "
        f"{args.rounds} rounds, commit {commit or '?'}"
    )
    head = (
        f"{'rule':<13} {'defense':<21} {'fixed':>6} {'max|θ|':>8} {'per_round':>9} "
        f"{'max|θ|':>8} {'clean':>6} {'gap':>6}"
    )
    print(head)
    print("-" * len(head))
    start = time.perf_counter()
    for rule in args.rules:
        twin: dict[str, float] | None = None  # the per_round run without a round defense
        for name in args.defenses:
            d = DEFENSES[name]
            fixed = one(rule, d, "fixed", args.seed, args.rounds)
            per_round = one(rule, d, "per_round", args.seed, args.rounds)
            clean = one(rule, d, None, args.seed, args.rounds)
            if twin is None:
                twin = per_round if not d else one(rule, [], "per_round", args.seed, args.rounds)
            gap = 100 * (fixed["acc"] - twin["acc"])
            print(
                f"{rule:<13} {name:<21} {fixed['acc']:6.3f} {fixed['theta']:8.1f} "
                f"{per_round['acc']:9.3f} {per_round['theta']:8.1f} {clean['acc']:6.3f} "
                f"{gap:+6.1f}",
                flush=True,
            )
    print(
        f"({time.perf_counter() - start:.0f} s; per_round and clean: the same defense; gap: "
        "fixed − the per_round run without a round defense, in points)"
    )


if __name__ == "__main__":
    main()
