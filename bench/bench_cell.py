"""Where a bench run's time goes: build, training, attack, aggregation, evaluation.

    python bench/bench_cell.py                          # median × ipm at 20 %, 20 rounds
    python bench/bench_cell.py --defense brdrag --attack adaptive_root --rounds 10

One run of the digits attack grid (brdrag-digits-cpu, the setting of the README's
robustness table) on one thread, timed by phase by wrapping the simulator's own steps:
``build`` (config, data, partition, model), ``training`` (the cohort's local steps),
``attack`` (the update attack rewriting its rows), ``aggregation`` (the server round step:
upload checks, pre-aggregators, rule), ``evaluation`` (test set, evaluators, validation).
Then the same run inside a lockstep group of ``--group`` runs (other attacks of the grid),
its training time being the group's divided by its runs.
"""

from __future__ import annotations

import argparse
import logging
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import torch

ATTACKS = ["ipm", "alie", "sign_flip", "label_flip", "noise", "min_max", "min_sum", "scaling"]


def timed(table: dict[str, float], key: str, fn: Any) -> Any:
    def wrapper(*a: Any, **k: Any) -> Any:
        t0 = time.perf_counter()
        try:
            return fn(*a, **k)
        finally:
            table[key] += time.perf_counter() - t0

    return wrapper


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--defense", default="median")
    ap.add_argument("--attack", default="ipm")
    ap.add_argument("--share", type=float, default=0.2)
    ap.add_argument("--rounds", type=int, default=20)
    ap.add_argument("--group", type=int, default=8, help="runs in the lockstep group")
    args = ap.parse_args()
    torch.set_num_threads(1)
    logging.disable(logging.WARNING)
    import fedshield.sim.engine as engine
    from fedshield import config as cfgmod
    from fedshield.bench.plan import plan
    from fedshield.bench.runner import _val_acc, run_group
    from fedshield.bench.spec import parse_spec
    from fedshield.sim.builder import build

    attacks = [args.attack, *[a for a in ATTACKS if a != args.attack]][: args.group]
    spec = parse_spec({"name": "cell", "base": "brdrag-digits-cpu", "rounds": args.rounds,
                       "shares": [args.share], "defenses": [args.defense],
                       "attacks": attacks})  # fmt: skip
    runs = plan(spec, Path(".")).runs
    raw = runs[0].raw
    run_group([raw])  # warm-up (imports, first build)

    t: dict[str, float] = defaultdict(float)
    sim_cls = engine.Simulator
    orig = {name: getattr(sim_cls, name) for name in
            ("train_cohort", "_apply_update_attack", "evaluate", "evaluate_extra")}  # fmt: skip
    step = engine.server_round_step
    sim_cls.train_cohort = timed(t, "training", orig["train_cohort"])  # type: ignore[method-assign]
    sim_cls._apply_update_attack = timed(t, "attack", orig["_apply_update_attack"])  # type: ignore[method-assign]
    sim_cls.evaluate = timed(t, "evaluation", orig["evaluate"])  # type: ignore[method-assign]
    sim_cls.evaluate_extra = timed(t, "evaluation", orig["evaluate_extra"])  # type: ignore[method-assign]
    engine.server_round_step = timed(t, "aggregation", step)  # type: ignore[assignment]
    try:
        t0 = time.perf_counter()
        cfg = cfgmod.validate(raw)
        sim = engine.Simulator(build(cfg))
        t["build"] += time.perf_counter() - t0
        t1 = time.perf_counter()
        sim.run()
        t2 = time.perf_counter()
        _val_acc(sim)
        t["evaluation"] += time.perf_counter() - t2
        total = t["build"] + (t2 - t1) + (time.perf_counter() - t2)
    finally:
        for name, fn in orig.items():
            setattr(sim_cls, name, fn)
        engine.server_round_step = step
    t["other (round loop, metrics)"] = total - sum(t.values())
    print(f"one run, {args.defense} × {args.attack} at {args.share:.0%}, {args.rounds} rounds, "
          f"digits MLP, 1 thread: {total:.3f} s")  # fmt: skip
    for key in ("build", "training", "attack", "aggregation", "evaluation",
                "other (round loop, metrics)"):  # fmt: skip
        print(f"  {key:28s} {t[key]:7.3f} s  {100 * t[key] / total:5.1f} %")
    res = run_group([r.raw for r in runs])
    prof = res[0]["profile"]
    print(f"the same run in a lockstep group of {len(runs)} runs: {res[0]['wall_s']:.3f} s "
          f"(training {prof['train_s']:.3f} s = the group's / {len(runs)}, server "
          f"{prof['server_s']:.3f} s, evaluation {prof['eval_s']:.3f} s, build "
          f"{prof['build_s']:.3f} s)")  # fmt: skip


if __name__ == "__main__":
    main()
