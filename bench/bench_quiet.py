"""Which server configuration holds against quiet attackers (docs/security.md §6b):
every candidate of :data:`fedshield.crossround.recommended.CONFIGURATIONS` on the grid.

digits, mlp (hidden 64), Dirichlet 0.5 (min_size 5), sgd lr 0.1 × 10 steps of batch 16,
fedavg with uniform weighting, 30 % fixed attackers (``attack.mode = "fixed"``), S = 10
of M = 100 and of M = 50, 30 rounds, seeds 11 and 12 (not tuned on; the defenses'
thresholds were set from seed 3's honest rows). Attacks: noise (σ = 100), sign_flip, alie,
ipm, stealth (the hug row at the published radius; ``stealth~`` jittered by 0.3 of the
honest distance, an attacker that knows collusion's ρ; ``stealth*`` reads collusion's ρ
and consistency's γ and spreads and turns its rows just past both: ``evade = true``),
opportunist, cache_poison, and the clean twin. Root-data configurations get a root set of
100. Prints, side by side, each configuration's final test accuracy per cell (mean over
the seeds) and, per configuration, its worst gap to its clean twin; ``--write`` stores
the cells (with the commit and the command) as the measurement the recommendation reads
(``src/fedshield/crossround/quiet_measured.json``).

    PYTHONPATH=src nice -n 19 python bench/bench_quiet.py [--jobs 2] [--write]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

from fedshield.crossround import recommended
from fedshield.crossround.recommended import CONFIGURATIONS

ATTACKS: dict[str, tuple[str, dict[str, Any]]] = {
    "none": ("none", {}),
    "noise": ("noise", {"sigma": 100.0}),
    "sign_flip": ("sign_flip", {}),
    "alie": ("alie", {}),
    "ipm": ("ipm", {}),
    "stealth": ("stealth", {}),
    "stealth~": ("stealth", {"jitter": 0.3}),
    "stealth*": ("stealth", {"evade": True}),
    "opportunist": ("opportunist", {}),
    "cache_poison": ("cache_poison", {}),
}

OUT = Path(__file__).resolve().parents[1] / "src/fedshield/crossround" / recommended.MEASURED


def config(name: str, attack: str, clients: int, seed: int, rounds: int) -> dict[str, Any]:
    conf = CONFIGURATIONS[name]
    atk, params = ATTACKS[attack]
    raw: dict[str, Any] = {
        "name": f"quiet-{name}-{attack}",
        "seed": seed,
        "rounds": rounds,
        "data": {
            "dataset": "digits",
            "num_clients": clients,
            "partition": "dirichlet",
            "beta": 0.5,
            "min_size": 5,
            "root_size": 100 if conf.root else 0,
        },
        "model": {"name": "mlp", "params": {"hidden": 64}},
        "client": {"algorithm": "sgd", "lr": 0.1, "batch_size": 16, "local_steps": 10},
        "server": {"clients_per_round": 10, "weighting": "uniform", **conf.server()},
        "eval": {"every": rounds},
        "run": {"threads": 1, "progress": False},
    }
    if atk != "none":
        raw["attack"] = {"name": atk, "params": params, "fraction": 0.3, "mode": "fixed"}
    return raw


def one(job: tuple[str, str, int, int, int]) -> dict[str, Any]:
    import logging

    from fedshield.config import validate
    from fedshield.runner import run

    logging.getLogger("fedshield").setLevel(logging.ERROR)
    name, attack, clients, seed, rounds = job
    start = time.perf_counter()
    res = run(
        validate(config(name, attack, clients, seed, rounds), "bench_quiet"), None, quiet=True
    )
    events = {"suspended": 0.0, "duplicates": 0.0, "clipped_blocks": 0.0}
    for row in res.history:
        for k, v in row.items():
            tail = str(k).rsplit("/", 1)[-1]
            if str(k).startswith("defense/") and tail in events:
                events[tail] += float(v)
    return {
        "config": name,
        "attack": attack,
        "clients": clients,
        "cohort": 10,
        "seed": seed,
        "acc": round(float(res["final_test_acc"]), 4),
        "seconds": round(time.perf_counter() - start, 1),
        **{k: int(v) for k, v in events.items()},
    }


def table(cells: list[dict[str, Any]], names: list[str]) -> str:
    """Accuracy per (attack, M) × configuration, mean over seeds; then each configuration's
    worst gap to its clean twin."""
    acc: dict[tuple[str, int, str], list[float]] = {}
    for c in cells:
        acc.setdefault((c["attack"], c["clients"], c["config"]), []).append(c["acc"])
    width = max(14, *(len(n) + 1 for n in names))
    head = f"{'attack':<13} {'S/M':>6} " + "".join(f"{n:>{width}}" for n in names)
    lines = [head, "-" * len(head)]
    for clients in sorted({c["clients"] for c in cells}, reverse=True):
        for attack in ATTACKS:
            vals = [acc.get((attack, clients, n)) for n in names]
            if not any(vals):
                continue
            row = "".join(
                f"{'-':>{width}}" if not v else f"{sum(v) / len(v):>{width}.3f}" for v in vals
            )
            lines.append(f"{attack:<13} {f'10/{clients}':>6} {row}")
    lines.append("worst gap to clean (points, mean over seeds):")
    data = {"cells": cells}
    for n in names:
        w = recommended.worst_case(n, data)
        lines.append(f"  {n:<16} " + ("-" if w is None else w.describe()))
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--configs", nargs="+", default=list(CONFIGURATIONS), choices=list(CONFIGURATIONS)
    )
    ap.add_argument("--attacks", nargs="+", default=list(ATTACKS), choices=list(ATTACKS))
    ap.add_argument("--clients", nargs="+", type=int, default=[100, 50])
    ap.add_argument("--seeds", nargs="+", type=int, default=[11, 12])
    ap.add_argument("--rounds", type=int, default=30)
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--cells", type=Path, help="append each finished cell to this JSON-lines file")
    ap.add_argument("--resume", action="store_true", help="skip the cells --cells holds")
    ap.add_argument("--table", type=Path, help="only print the table of a JSON-lines file")
    ap.add_argument("--write", action="store_true", help=f"store the cells as {OUT.name}")
    ap.add_argument("--note", default="", help="provenance note stored with --write")
    args = ap.parse_args()
    commit = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=False
    ).stdout.strip()
    if args.table is not None:
        cells = [json.loads(x) for x in args.table.read_text().splitlines() if x.strip()]
    else:
        jobs = [
            (n, a, m, s, args.rounds)
            for s in args.seeds
            for a in args.attacks
            for m in args.clients
            for n in args.configs
        ]
        cells = []
        if args.resume and args.cells is not None and args.cells.exists():
            cells = [json.loads(x) for x in args.cells.read_text().splitlines() if x.strip()]
            done = {(c["config"], c["attack"], c["clients"], c["seed"]) for c in cells}
            jobs = [j for j in jobs if j[:4] not in done]
        start = time.perf_counter()
        with ProcessPoolExecutor(args.jobs) as pool:
            for cell in pool.map(one, jobs):
                cells.append(cell)
                print(json.dumps(cell), file=sys.stderr, flush=True)
                if args.cells is not None:
                    with args.cells.open("a") as fh:
                        fh.write(json.dumps(cell) + "\n")
        print(f"({len(cells)} runs, {time.perf_counter() - start:.0f} s)")
    names = [n for n in CONFIGURATIONS if any(c["config"] == n for c in cells)]
    print(
        f"digits mlp64 dirichlet 0.5, 30 % fixed attackers, "
        f"seeds {sorted({c['seed'] for c in cells})}, commit {commit or '?'}"
    )
    print(table(cells, names))
    if args.write:
        OUT.write_text(
            json.dumps(
                {
                    "commit": commit,
                    "command": "python " + " ".join(sys.argv),
                    "note": args.note,
                    "grid": "digits mlp64 dirichlet 0.5 min_size 5, sgd 0.1 x 10, uniform "
                    "weights, 30 % fixed attackers, S = 10",
                    "cells": sorted(
                        cells, key=lambda c: (c["config"], c["attack"], c["clients"], c["seed"])
                    ),
                },
                indent=1,
            )
            + "\n"
        )
        print(f"wrote {OUT}")


if __name__ == "__main__":
    main()
