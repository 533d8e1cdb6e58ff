"""The defense × attack × Byzantine-share grid behind the *published* tables of
docs/results/robustness.md ("Under attack") and the README's worst-case table.

Superseded by ``fedshield bench --bench robustness-digits-cpu`` (docs/bench.md): the same
grid with ByzFL's validation protocol, lockstep training (several times faster), resume by
config hash and commit, diverged runs shown as diverged, heat maps. This file stays for
the published CSVs it produced and for the grid setting that
tests/test_attacks_adaptive_e2e.py imports (``overrides``, ``BASE``, ``FIXED``); ``run``
prints a pointer to the bench.

    nice -n 19 python tools/attack_grid.py run [-j 2] [--rounds 30] [--seeds 0,1,2]
    python tools/attack_grid.py cells        # runs CSV → the cells / worst / ASR CSVs
    python tools/attack_grid.py time         # wall time of one run per (defense, attack)

Setting: the ``brdrag-digits-cpu`` preset (scikit-learn digits, 20 workers, Dirichlet 0.5,
S = 10 per round, a root set of 100 for FLTrust / BR-DRAG, MLP 64, U = 10, lr 0.1, uniform
weighting) with exactly ⌊wS⌋ Byzantine workers per round, every defense of the BR-DRAG
tables and each of them behind NNM (f = ⌊wS⌋), against every registered attack. Defenses
whose condition fails at a share are left out (Krum and Multi-Krum need 2f + 2 < S,
Trimmed Mean 2f < S). Every run also scores the backdoor evaluator (its ASR without a
backdoor attack is the control: the rate at which the model calls a triggered non-target
input the target anyway).

``run`` appends one row per finished run to docs/results/data/attack-grid-runs.csv (the
commit and the hash of the run's resolved config in every row; the grid's own spec in
attack-grid.toml), skipping runs already there, so it resumes after an interruption. Runs
are in process without output folders (the measurement needs only the final record).
"""

from __future__ import annotations

import argparse
import csv
import hashlib
import json
import logging
import math
import statistics
import subprocess
import sys
import time
from collections import defaultdict
from concurrent.futures import ProcessPoolExecutor, as_completed
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "docs" / "results" / "data"
RUNS = DATA / "attack-grid-runs.csv"
SPEC = DATA / "attack-grid.toml"
BASE = "brdrag-digits-cpu"
S = 10  # clients per round of the base preset
FRACTIONS = (0.2, 0.4, 0.6, 0.8)
FIXED = ("noise", "sign_flip", "label_flip", "min_max", "min_sum", "alie", "ipm", "scaling")
ADAPTIVE = (
    "alie_opt",
    "ipm_opt",
    "fang_krum",
    "fang_trim",
    "agr_tailored",
    "mimic",
    "adaptive_root",
    "adaptive_root_est",
)
TARGETED = ("backdoor", "model_replacement")
ATTACKS = FIXED + ADAPTIVE + TARGETED
RULES = (
    "fedavg",
    "krum",
    "multikrum",
    "median",
    "trimmed_mean",
    "centered_clipping",
    "norm_clip",
    "rfa",
    "raga",
    "fltrust",
    "brdrag",
)
DEFENSES = RULES + tuple(f"nnm+{r}" for r in RULES)
FIELDS = [
    "defense",
    "attack",
    "fraction",
    "seed",
    "rounds",
    "final_test_acc",
    "best_test_acc",
    "backdoor_asr",
    "wall_s",
    "commit",
    "config_sha",
]


def feasible(rule: str, f: int) -> bool:
    if rule in ("krum", "multikrum"):
        return 2 * f + 2 < S
    if rule == "trimmed_mean":
        return 2 * f < S
    return True


def overrides(defense: str, attack: str, fraction: float, seed: int, rounds: int) -> list[str]:
    """The ``--set`` overrides of one run on the base preset."""
    f = math.floor(fraction * S)
    rule = defense.removeprefix("nnm+")
    sets = [
        f"seed={seed}",
        f"rounds={rounds}",
        f"eval.every={rounds}",
        'eval.metrics=["backdoor"]',
        'attack.mode="per_round"',
        f"attack.fraction={fraction}",
        f'attack.name="{attack}"',
        "run.threads=1",
        "run.progress=false",
    ]
    if rule in ("fltrust", "brdrag"):
        sets += [f"server.algorithm={rule}", f'server.aggregator="{rule}"']
    else:
        agg = "mean" if rule == "fedavg" else rule
        sets += ["server.algorithm=fedavg", f'server.aggregator="{agg}"']
        if rule in ("krum", "multikrum", "trimmed_mean"):
            sets.append(f"server.aggregator_args.f={f}")
        if rule in ("centered_clipping", "norm_clip"):
            sets.append("server.aggregator_args.tau=1.0")
    if defense.startswith("nnm+"):
        sets += ['server.pre_aggregators=["nnm"]', f"server.pre_aggregator_args.nnm.f={f}"]
    return sets


def cells(rounds: int, seeds: list[int]) -> list[tuple[str, str, float, int]]:
    """Every run, seed by seed (an interrupted grid has whole seeds done)."""
    out = []
    for seed in seeds:
        for fraction in FRACTIONS:
            f = math.floor(fraction * S)
            for defense in DEFENSES:
                if not feasible(defense.removeprefix("nnm+"), f):
                    continue
                for attack in ATTACKS:
                    out.append((defense, attack, fraction, seed))
    return out


def commit() -> str:
    try:
        sha = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "src"], cwd=ROOT, capture_output=True, text=True
        ).stdout.strip()
    except OSError:
        return "unknown"
    return f"{sha}{'+dirty' if dirty else ''}"


def run_one(task: tuple[str, str, float, int], rounds: int, sha: str) -> dict[str, Any]:
    """One run in this process; its CSV row."""
    import torch

    from fedshield import config as cfgmod
    from fedshield.sim.builder import build
    from fedshield.sim.engine import Simulator

    logging.disable(logging.WARNING)
    torch.set_num_threads(1)
    defense, attack, fraction, seed = task
    cfg = cfgmod.load(preset=BASE, overrides=overrides(defense, attack, fraction, seed, rounds))
    text = cfgmod.dump(cfg)
    t0 = time.perf_counter()
    summary = Simulator(build(cfg)).run()
    return {
        "defense": defense,
        "attack": attack,
        "fraction": fraction,
        "seed": seed,
        "rounds": rounds,
        # A run the attack drove non-finite stops (status "diverged"): nothing is left of θ.
        "final_test_acc": summary.get(
            "final_test_acc", 0.0 if summary.get("status") == "diverged" else None
        ),
        "best_test_acc": summary.get("best_test_acc"),
        "backdoor_asr": summary.get("final", {}).get("backdoor/asr"),
        "wall_s": round(time.perf_counter() - t0, 3),
        "commit": sha,
        "config_sha": hashlib.sha256(text.encode()).hexdigest()[:12],
    }


def _key(row: dict[str, Any]) -> tuple[str, str, float, int]:
    return (row["defense"], row["attack"], float(row["fraction"]), int(row["seed"]))


def write_spec(rounds: int, seeds: list[int]) -> None:
    from fedshield import config as cfgmod

    base = cfgmod.dump(cfgmod.load(preset=BASE))
    lines = [
        "# The attack grid of tools/attack_grid.py: base config and the per-run overrides.",
        f"# rounds = {rounds}, seeds = {seeds}, fractions = {list(FRACTIONS)}",
        f"# defenses = {list(DEFENSES)}",
        f"# attacks = {list(ATTACKS)}",
        "# per-run overrides, e.g. " + " ".join(overrides("nnm+krum", "fang_krum", 0.2, 0, rounds)),
        "",
        base,
    ]
    SPEC.write_text("\n".join(lines))


def cmd_run(args: argparse.Namespace) -> int:
    print(
        "note: tools/attack_grid.py is superseded by `fedshield bench --bench "
        "robustness-digits-cpu` (docs/bench.md)",
        file=sys.stderr,
    )
    seeds = [int(s) for s in args.seeds.split(",")]
    todo = cells(args.rounds, seeds)
    done: set[tuple[str, str, float, int]] = set()
    if RUNS.exists():
        with RUNS.open() as fh:
            done = {_key(r) for r in csv.DictReader(fh) if int(r["rounds"]) == args.rounds}
    todo = [t for t in todo if t not in done]
    if args.limit:
        todo = todo[: args.limit]
    DATA.mkdir(parents=True, exist_ok=True)
    write_spec(args.rounds, seeds)
    sha = commit()
    new = not RUNS.exists()
    t0 = time.time()
    print(f"{len(done)} runs done, {len(todo)} to run with {args.jobs} process(es)", flush=True)
    with RUNS.open("a", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=FIELDS)
        if new:
            writer.writeheader()
        import multiprocessing as mp

        with ProcessPoolExecutor(args.jobs, mp_context=mp.get_context("spawn")) as pool:
            futs = {pool.submit(run_one, t, args.rounds, sha): t for t in todo}
            for i, fut in enumerate(as_completed(futs), 1):
                writer.writerow(fut.result())
                fh.flush()
                if i % 50 == 0 or i == len(todo):
                    rate = (time.time() - t0) / i
                    left = (len(todo) - i) * rate / 3600
                    print(f"{i}/{len(todo)} runs, {rate:.2f} s/run, ~{left:.1f} h left", flush=True)
    print(f"grid wall time this session: {(time.time() - t0) / 3600:.2f} h", flush=True)
    return 0


def cmd_time(args: argparse.Namespace) -> int:
    sha = commit()
    rows = []
    for defense in ("fedavg", "rfa", "brdrag", "nnm+rfa", "nnm+krum"):
        for attack in ATTACKS:
            rows.append(run_one((defense, attack, 0.2, 0), args.rounds, sha))
            print(f"{defense:14s} {attack:18s} {rows[-1]['wall_s']:6.2f} s", flush=True)
    total = sum(r["wall_s"] for r in rows) / len(rows)
    n = len(cells(args.rounds, [int(s) for s in args.seeds.split(",")]))
    print(f"mean {total:.2f} s/run; {n} runs ≈ {n * total / 3600:.1f} h in one process")
    return 0


# -- aggregation ---------------------------------------------------------------------------
T975 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571}


def _stats(values: list[float]) -> tuple[float, float, float]:
    """(mean, 95 % Student-t half-width, min) over the seeds."""
    m = statistics.fmean(values)
    if len(values) < 2:
        return m, math.nan, min(values)
    sd = statistics.stdev(values)
    return m, T975.get(len(values) - 1, 1.96) * sd / math.sqrt(len(values)), min(values)


def _pct(fraction: float) -> str:
    return f"{round(fraction * 100)}%"


def cmd_cells(args: argparse.Namespace) -> int:
    with RUNS.open() as fh:
        rows = [r for r in csv.DictReader(fh) if int(r["rounds"]) == args.rounds]
    groups: dict[tuple[str, str, float], list[dict[str, str]]] = defaultdict(list)
    for r in rows:
        groups[r["defense"], r["attack"], float(r["fraction"])].append(r)
    commits = sorted({r["commit"] for r in rows})
    # Per share: one cells file in render_results' format (variant, attack.name, *_mean, *_ci95).
    for fraction in FRACTIONS:
        out = DATA / f"attack-grid-{round(fraction * 100)}-cells.csv"
        with out.open("w", newline="") as fh:
            w = csv.writer(fh)
            w.writerow(
                ["variant", "attack.name", "n_seeds", "final_test_acc_mean", "final_test_acc_ci95",
                 "final_test_acc_min", "backdoor_asr_mean", "backdoor_asr_ci95", "commit"]
            )  # fmt: skip
            for (d, a, fr), rs in groups.items():
                if fr != fraction:
                    continue
                acc = _stats([float(r["final_test_acc"]) for r in rs])
                asr = _stats([float(r["backdoor_asr"]) for r in rs])
                w.writerow([d, a, len(rs), *acc, asr[0], asr[1], "|".join(commits)])
    # The headline: each defense's worst case over all attacks, per share; and over the
    # seeds' fixed attacks only, to show what the adaptive ones change.
    for name, pool in (("attack-grid-worst.csv", ATTACKS), ("attack-grid-worst-fixed.csv", FIXED)):
        with (DATA / name).open("w", newline="") as fh:
            w = csv.writer(fh)
            w.writerow(["defense", *[_pct(f) for f in FRACTIONS]])
            for d in DEFENSES:
                w.writerow([d, *[_worst_cell(groups, d, f, pool) for f in FRACTIONS]])
    worst = DATA / "attack-grid-worst.csv"
    asr = DATA / "attack-grid-asr.csv"
    with asr.open("w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(
            ["defense", *[f"{a}@{_pct(f)}" for a in TARGETED for f in FRACTIONS], "control@20%"]
        )
        for d in DEFENSES:
            row = [d]
            for a in TARGETED:
                for fraction in FRACTIONS:
                    rs = groups.get((d, a, fraction))
                    row.append(_fmt(_stats([float(r["backdoor_asr"]) for r in rs])) if rs else "-")
            ctrl = [float(r["backdoor_asr"]) for a in FIXED for r in groups.get((d, a, 0.2), [])]
            row.append(f"{statistics.fmean(ctrl):.3f}" if ctrl else "-")
            w.writerow(row)
    write_provenance(rows, commits)
    print(f"wrote {worst.relative_to(ROOT)}, {asr.relative_to(ROOT)} and the per-share cells")
    return 0


def write_provenance(rows: list[dict[str, str]], commits: list[str]) -> None:
    """``attack-grid.provenance.json`` (checked by tools/render_results.py): the commits
    that ran the grid, each run's config hash (as its row in attack-grid-runs.csv records
    it), the grid's definition hash, and the SHA-256 of every file this tool wrote."""
    files = sorted(DATA.glob("attack-grid*.csv")) + [SPEC]
    record = {
        "command": ["python", "tools/attack_grid.py", "run"],
        "commits": commits,
        "config_sha256": hashlib.sha256(SPEC.read_bytes()).hexdigest(),
        "files": {f.name: hashlib.sha256(f.read_bytes()).hexdigest() for f in files},
        "grid": "attack-grid",
        "runs": {
            f"{r['defense']}_{r['attack']}_{r['fraction']}_seed={r['seed']}": r["config_sha"]
            for r in rows
        },
    }
    out = DATA / "attack-grid.provenance.json"
    out.write_text(json.dumps(record, indent=2, sort_keys=True) + "\n")


def _fmt(stats: tuple[float, float, float]) -> str:
    m, h, _ = stats
    return f"{m:.3f}" if h != h else f"{m:.3f} ± {h:.3f}"


def _worst_cell(
    groups: dict[tuple[str, str, float], list[dict[str, str]]],
    defense: str,
    fraction: float,
    attacks: tuple[str, ...],
) -> str:
    """``mean ± h (attack)`` of the attack with the lowest mean final accuracy, the
    adaptive attacks in bold, and the worst single seed when it is below 0.5·mean."""
    best: tuple[float, str, tuple[float, float, float]] | None = None
    for a in attacks:
        rs = groups.get((defense, a, fraction))
        if not rs:
            continue
        st = _stats([float(r["final_test_acc"]) for r in rs])
        if best is None or st[0] < best[0]:
            best = (st[0], a, st)
    if best is None:
        return "-"
    _, a, st = best
    name = f"**{a}**" if a in ADAPTIVE else a
    collapse = f", seed min {st[2]:.3f}" if st[2] < 0.5 * st[0] else ""
    return f"{_fmt(st)} ({name}{collapse})"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    for name in ("run", "cells", "time"):
        p = sub.add_parser(name)
        p.add_argument("--rounds", type=int, default=30)
        p.add_argument("--seeds", default="0,1,2")
        p.add_argument("-j", "--jobs", type=int, default=1)
        p.add_argument("--limit", type=int, default=0, help="run at most this many (testing)")
    args = ap.parse_args()
    return {"run": cmd_run, "cells": cmd_cells, "time": cmd_time}[args.cmd](args)


if __name__ == "__main__":
    sys.exit(main())
