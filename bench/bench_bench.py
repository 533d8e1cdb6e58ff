"""``fedshield bench`` against the per-run path, side by side (the retired attack_grid.py's path).

    python bench/bench_bench.py                 # 24 runs (4 defenses × 6 attacks, 20 %), 20 rounds
    python bench/bench_bench.py --rounds 5      # quicker

Both paths run the same defense × attack × share × seed runs of the digits attack grid in
this process on one thread (half the per-run path, the bench runner, the other half):
(a) the per-run path — each config validated, built and run to its last round by the
simulator, one run at a time (what the retired ``tools/attack_grid.py run`` did per
run, evaluation at the last round only), on the bench's own configs; (b)
``fedshield bench``'s runner — the same runs trained in lockstep
(:mod:`fedshield.bench.lockstep`), with the validation accuracy the protocol needs on
top. Prints both wall times, the ratio and the largest difference of the final test
accuracies (lockstep training equals run-by-run training).
"""

from __future__ import annotations

import argparse
import logging
import time
from pathlib import Path

import torch

DEFENSES = ["median", "nnm+krum", "brdrag", "fedavg"]
ATTACKS = ["ipm", "alie_opt", "label_flip", "adaptive_root", "backdoor", "sign_flip"]


def per_run(raw: dict) -> float | None:
    """The per-run path (the retired tools/attack_grid.py's ``run_one``): validate the config,
    build data, model and components, run the simulator to the last round."""
    from fedshield import config as cfgmod
    from fedshield.sim.builder import build
    from fedshield.sim.engine import Simulator

    return Simulator(build(cfgmod.validate(raw))).run().get("final_test_acc")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=20)
    ap.add_argument("--share", type=float, default=0.2)
    args = ap.parse_args()
    torch.set_num_threads(1)
    logging.disable(logging.WARNING)
    from fedshield.bench.plan import plan
    from fedshield.bench.runner import groups, run_group
    from fedshield.bench.spec import parse_spec

    spec = parse_spec({"name": "speed", "base": "brdrag-digits-cpu", "rounds": args.rounds,
                       "shares": [args.share], "defenses": DEFENSES,
                       "attacks": ATTACKS})  # fmt: skip
    runs = plan(spec, Path(".")).runs
    per_run(runs[0].raw)  # warm-up: imports, first build
    # A-B-A: half the per-run path, the bench runner, the other half, so that load from
    # other processes on a shared machine falls on both alike.
    half = len(runs) // 2
    t0 = time.perf_counter()
    old = [per_run(r.raw) for r in runs[:half]]
    t_old = time.perf_counter() - t0
    t0 = time.perf_counter()
    new = [rec for g in groups(runs, 24) for rec in run_group([r.raw for r in g])]
    t_new = time.perf_counter() - t0
    t0 = time.perf_counter()
    old += [per_run(r.raw) for r in runs[half:]]
    t_old += time.perf_counter() - t0
    diffs = [
        abs(a - b["test_acc"])
        for a, b in zip(old, new)
        if a is not None and b["test_acc"] is not None
    ]
    print(f"{len(runs)} runs ({len(DEFENSES)} defenses × {len(ATTACKS)} attacks, share "
          f"{args.share}, {args.rounds} rounds, digits, 1 thread)")  # fmt: skip
    print(
        f"per-run path (build + run each config)    : {t_old:7.2f} s  {t_old / len(runs):.3f} s/run"
    )
    print(
        f"fedshield bench runner (lockstep)         : {t_new:7.2f} s  {t_new / len(runs):.3f} s/run"
    )
    print(f"speed-up: {t_old / t_new:.2f}x")
    print(
        "final test accuracy, largest |difference| between the paths: "
        f"{max(diffs, default=0.0):.2e}"
    )


if __name__ == "__main__":
    main()
