"""The searched attacker against the recommendations (docs/cross-round.md).

Without root data NNM before the median + collusion, consistency, step_bound, reputation
(``nnm-median``; ``cc-momentum-rep``, Centered Clipping + collusion, consistency, momentum,
step_bound, reputation, was the one before it), with root data BR-DRAG + collusion,
consistency (``brdrag-guarded``, a root set of 100 samples).

Grid of the quiet-attacker measurement (bench/bench_quiet.py; read from
bench/recommend-digits.toml): digits, mlp (hidden 64),
Dirichlet 0.5 (min_size 5), sgd lr 0.1 × 10 steps of batch 16, fedavg with uniform
weighting, 30 % fixed attackers, S = 10 of M = ``--clients`` (100 or 50); ``--rounds``
rounds. Per defense: Optuna TPE
over the ``quiet`` family (:func:`fedshield.search.attack_search.search_attack`, the
menu's quiet attacks first, successive halving over the tuning seeds), then on held-out
seeds the clean run, the menu entries and both searched attacks (each defense also meets
the attack searched against the other). Prints per defense the held-out accuracy per
attack (mean over seeds) and the worst gap to clean; writes every run and the result,
with the commit, to ``--out`` (JSON).

    PYTHONPATH=src nice -n 19 python bench/bench_search.py --out docs/results/bench_search.json
"""

from __future__ import annotations

import argparse
import copy
import json
import re
import subprocess
import sys
import time
import tomllib
from pathlib import Path
from typing import Any

from fedshield.crossround.recommended import CONFIGURATIONS, SEARCHED, differences
from fedshield.search.attack_search import MENU, search_attack
from fedshield.search.trials import Defense, Trials

#: The recommendation's candidates searched against (one definition: the recommended
#: module's configurations, as compositions the trials run).
DEFENSES = {
    name: Defense.of(
        {**CONFIGURATIONS[name].server(), "pre_aggregators": CONFIGURATIONS[name].pre_aggregators}
    )
    for name in ("cc-momentum-rep", "nnm-median", "brdrag-guarded")
}

#: The grid (the server composition is each defense's).
BASE: dict[str, Any] = tomllib.loads(
    (Path(__file__).resolve().parents[1] / "bench/recommend-digits.toml").read_text()
)


def table(result: dict[str, Any]) -> str:
    held = result["held_out"]
    names = list(held)
    attacks = list(next(iter(held.values()))["attacks"])
    head = f"{'attack':<24}" + "".join(f"{n:>18}" for n in names)
    lines = [head, "-" * len(head)]
    clean = {n: sum(held[n]["clean"]) / len(held[n]["clean"]) for n in names}
    lines.append(f"{'none (clean)':<24}" + "".join(f"{clean[n]:>18.3f}" for n in names))
    for a in attacks:
        vals = [sum(held[n]["attacks"][a]) / len(held[n]["attacks"][a]) for n in names]
        lines.append(f"{a:<24}" + "".join(f"{v:>18.3f}" for v in vals))
    lines.append("worst gap to clean (points, mean over held-out seeds), per seed worst:")
    for n in names:
        gaps = {
            a: [x - c for x, c in zip(v, held[n]["clean"], strict=True)]
            for a, v in held[n]["attacks"].items()
        }
        worst = min(gaps, key=lambda a: sum(gaps[a]))
        seed_worst = min(min(g) for g in gaps.values())
        lines.append(
            f"  {n:<18} {100 * sum(gaps[worst]) / len(gaps[worst]):+.1f} ({worst}); "
            f"worst single seed {100 * seed_worst:+.1f}"
        )
    return "\n".join(lines)


def recommend_cells(
    res: dict[str, Any],
    cells: list[dict[str, Any]],
    params: list[dict[str, Any]],
    sources: list[dict[str, Any]],
) -> None:
    """A ``fedshield recommend`` result (``--out``) in :func:`write_measured`'s form: its
    choice (named by the candidate with the same composition) clean and against the
    strongest attack it met on the held-out seeds, on its own grid — ``data`` names the
    data set, the model and the rounds, so its cells never pair with another grid's."""
    choice = res["choice"]
    # the candidate the choice selects, by the statement's own test
    name = next((n for n, c in CONFIGURATIONS.items() if not differences(c, choice)), None)
    if name is None:
        raise SystemExit(f"{res['command']}: its choice {choice['name']} is no candidate")
    cfg = tomllib.loads((Path(__file__).resolve().parents[1] / res["config"]).read_text())
    grid = f"{cfg['data']['dataset']}/{cfg['model']['name']}, {res['rounds']} rounds"
    clients = int(cfg["data"]["num_clients"])
    held = res["held_out"]
    worst = held["worst"]
    for attack, accs in (("none", held["clean"]), ("searched", worst["acc"])):
        for seed, acc in zip(held["seeds"], accs, strict=True):
            cells.append({"config": name, "attack": attack, "clients": clients, "cohort": 10,
                          "seed": seed, "acc": acc, "data": grid})  # fmt: skip
    params.append({"config": name, "clients": clients, "rounds": res["rounds"], "data": grid,
                   "found_against": "the recommend run's attacks (searched and known)",
                   "params": worst["params"]})  # fmt: skip
    sources.append({"commit": res["commit"], "command": res["command"], "grid": grid,
                    "rounds": res["rounds"]})  # fmt: skip


def write_measured(paths: list[Path]) -> Path:
    """The held-out cells of ``paths`` (results of this script) as the recommended module's
    searched-attacker measurement: per defense, its clean runs and the runs of the
    strongest searched attack it met (the one searched against it or against another
    defense: an attacker may read every result), in the menu measurement's cell form, with
    the parameters, the defense they were searched against, the commits and the commands."""
    cells: list[dict[str, Any]] = []
    params: list[dict[str, Any]] = []
    sources: list[dict[str, Any]] = []
    for path in paths:
        res = json.loads(path.read_text())
        if "choice" in res:  # a `fedshield recommend` result: its choice, held out
            recommend_cells(res, cells, params, sources)
            continue
        # results made before the key existed name M in their grid line only
        named = re.search(r"S/M 10/(\d+)", res["grid"])
        clients = int(res.get("clients") or (named[1] if named else 100))
        sources.append({k: res.get(k) for k in ("commit", "command", "grid", "rounds")})
        for name, held in res["held_out"].items():
            found = {k: v for k, v in held["attacks"].items() if k.startswith("searched vs ")}
            if not found:
                continue
            label = min(found, key=lambda k: (sum(found[k]), k))
            for attack, accs in (("none", held["clean"]), ("searched", found[label])):
                for seed, acc in zip(res["held_out_seeds"], accs, strict=True):
                    cells.append({"config": name, "attack": attack, "clients": clients,
                                  "cohort": 10, "seed": seed, "acc": acc})  # fmt: skip
            params.append({"config": name, "clients": clients, "rounds": res.get("rounds"),
                           "found_against": label.removeprefix("searched vs "),
                           "params": held["params"][label]})  # fmt: skip
    out = Path(__file__).resolve().parents[1] / "src/fedshield/crossround" / SEARCHED
    data = {"sources": sources, "params": params, "cells": cells}
    out.write_text(json.dumps(data, indent=1) + "\n")
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=30)
    ap.add_argument("--clients", type=int, default=100, choices=[50, 100], help="M (S = 10)")
    ap.add_argument("--tuning-seeds", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--held-out-seeds", type=int, nargs="+", default=[11, 12, 13])
    ap.add_argument("--trials", type=int, default=20, help="attack-search trials per defense")
    ap.add_argument("--defenses", nargs="+", default=list(DEFENSES), choices=list(DEFENSES))
    ap.add_argument("--out", type=Path, help="the result (JSON; the table beside it, .txt)")
    ap.add_argument(
        "--write-from",
        type=Path,
        nargs="+",
        help="instead of running: store these results' searched cells for the recommendation "
        f"(src/fedshield/crossround/{SEARCHED}); `fedshield recommend` results too, on their "
        "own grid",
    )
    ap.add_argument(
        "--known",
        type=Path,
        nargs="+",
        default=[],
        help="earlier results of this script: their searched attacks start every search and "
        "are measured on the held-out seeds too (an attacker reads every published result)",
    )
    args = ap.parse_args()
    if args.write_from:
        print(f"wrote {write_measured(args.write_from)}")
        return
    if args.out is None:
        ap.error("--out is required")
    commit = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=False
    ).stdout.strip()
    base = copy.deepcopy(BASE)
    base["data"]["num_clients"] = args.clients
    trials = Trials(base, args.rounds)
    start = time.perf_counter()
    result: dict[str, Any] = {
        "commit": commit,
        "command": "python " + " ".join(sys.argv),
        "grid": "digits mlp64 dirichlet 0.5 min_size 5, sgd 0.1 x 10, uniform weights, "
        f"30 % fixed attackers, S/M 10/{args.clients}",
        "rounds": args.rounds,
        "clients": args.clients,
        "tuning_seeds": args.tuning_seeds,
        "held_out_seeds": args.held_out_seeds,
        "searches": {},
        "held_out": {},
    }

    def save() -> None:
        result["runs"], result["seconds"] = trials.runs, round(time.perf_counter() - start, 1)
        args.out.write_text(json.dumps(result, indent=1) + "\n")

    searched: dict[str, dict[str, Any]] = {}
    for path in args.known:
        known = json.loads(path.read_text())
        for name, found in known["searches"].items():
            searched[f"searched vs {name} at M={known.get('clients', '?')}"] = found["params"]
    for name in args.defenses:
        found = search_attack(
            trials,
            DEFENSES[name],
            args.tuning_seeds,
            n_trials=args.trials,
            seed=0,
            known=list(searched.values()),  # those found against the defenses before it
            on_trial=lambda text: print(f"{text} ({trials.runs} runs)", flush=True),
        )
        searched[f"searched vs {name}"] = found.params
        result["searches"][name] = found.to_json()
        print(f"{name}: searched attack {found.params} tuning acc {found.acc:.3f}", flush=True)
        save()
    attacks = {**MENU, **searched}
    for name in args.defenses:
        d = DEFENSES[name]
        held = {
            "defense": d.to_json(),
            "clean": [trials.accuracy(d, None, s) for s in args.held_out_seeds],
            "attacks": {},
            "params": attacks,
        }
        for label, params in attacks.items():
            held["attacks"][label] = [trials.accuracy(d, params, s) for s in args.held_out_seeds]
            result["held_out"][name] = held
            save()
    print(f"commit {commit}; {trials.runs} runs, {time.perf_counter() - start:.0f} s")
    print(table(result))
    args.out.with_suffix(".txt").write_text(
        f"{result['command']}\ncommit {commit}; {result['grid']}; {args.rounds} rounds; "
        f"tuning seeds {args.tuning_seeds}, held-out seeds {args.held_out_seeds}; "
        f"{trials.runs} runs, {result['seconds']} s\n{table(result)}\n"
    )


if __name__ == "__main__":
    main()
