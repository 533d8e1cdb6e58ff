"""The same FL workload per round in the in-process simulator vs Flower's simulation
engine (Ray): S clients × U local steps of a small CNN, full participation. Four backends
are timed: the simulator client by client (``run.vectorize=false``) and as one batched
computation per round (``run.vectorize=true``, docs/vectorized.md), Flower with one Ray
actor (the simulator's compute, so the ratio is Flower's own overhead) and with all cores.

The four run interleaved, A-B-C-D, ``--repeats`` times (≥ 5 by default), so each
repetition's ratios compare runs made under the same machine load; printed are the
median per-round time and the median ratio with its range (min–max over the
repetitions). Goal: Flower (1 actor) ÷ vectorised ≥ 10 at S = 100, ``cnn_small``.

Per-round time is steady state: the wall time between the ends of round 1 and round R−1,
divided by R − 2 (start-up and the final evaluation excluded; both backends evaluate only
in the last round). Flower's start-up (Ray, node discovery) is reported separately. The
output records the commit it was made at.

    PYTHONPATH=src python bench/bench_flower.py [--clients 100] [--steps 2] [--rounds 4]
        [--repeats 5] [--save docs/results/flower_bench.txt]
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from fedshield import config
from fedshield.sim.builder import build
from fedshield.sim.engine import Simulator


def workload(
    clients: int, steps: int, rounds: int, dataset: str, model: str, vectorize: bool = False
) -> dict[str, Any]:
    return {
        "name": "bench-flower",
        "seed": 0,
        "rounds": rounds,
        "data": {"dataset": dataset, "num_clients": clients, "partition": "iid"},
        "model": {"name": model},
        "client": {"lr": 0.05, "batch_size": 16, "local_steps": steps},
        "server": {"clients_per_round": clients},
        "eval": {"every": rounds},
        "run": {"progress": False, "device": "cpu", "vectorize": vectorize},
    }


class Clock:
    """Timestamps of round ends, passed as ``on_round``."""

    def __init__(self) -> None:
        self.t0 = time.perf_counter()
        self.ends: list[float] = []
        self.last: dict[str, Any] = {}

    def __call__(self, m: dict[str, Any]) -> None:
        self.ends.append(time.perf_counter())
        self.last = m

    def per_round(self) -> float:
        n = len(self.ends)
        return (self.ends[n - 2] - self.ends[0]) / (n - 2)


def spread(values: list[float], fmt: str = "{:.1f}") -> str:
    """``median [min–max]`` of ``values``."""
    lo, hi = min(values), max(values)
    return f"{fmt.format(statistics.median(values))} [{fmt.format(lo)}–{fmt.format(hi)}]"


def commit_line() -> str:
    from fedshield.provenance import source_commit

    src = source_commit()
    sha = src.get("commit") or "unknown"
    dirty = " (with uncommitted changes)" if src.get("dirty") else ""
    return f"commit: {sha[:12]}{dirty}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--clients", type=int, default=100)
    ap.add_argument("--steps", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--repeats", type=int, default=5, help="interleaved repetitions")
    ap.add_argument("--dataset", default="digits", help="digits: ~18 samples per client")
    ap.add_argument("--model", default="cnn_small")
    ap.add_argument("--threads", type=int, default=1, help="torch threads in this process")
    ap.add_argument("--client-cpus", type=float, default=1.0, help="Ray CPUs per virtual client")
    ap.add_argument("--save", type=Path, default=None, help="also write the report here")
    args = ap.parse_args()
    if args.rounds < 3:
        ap.error("--rounds must be >= 3 (steady state needs rounds 2..R-1)")
    if args.repeats < 1:
        ap.error("--repeats must be >= 1")
    # One thread by default: tiny models gain nothing from intra-op threads, and Ray's
    # actors run with one thread each (OMP_NUM_THREADS=1), so both sides compute alike.
    torch.set_num_threads(args.threads)
    cores = os.cpu_count() or 1
    load0 = os.getloadavg()[0]

    from fedshield.flower.simulation import run_simulation

    def sim(vectorize: bool) -> Clock:
        raw = workload(args.clients, args.steps, args.rounds, args.dataset, args.model, vectorize)
        clock = Clock()
        Simulator(build(config.validate(raw))).run(clock)
        return clock

    def flower(ray_cpus: int | None) -> Clock:
        raw = workload(args.clients, args.steps, args.rounds, args.dataset, args.model)
        clock = Clock()
        run_simulation(
            config.validate(raw),
            None,
            on_round=clock,
            quiet=True,
            client_cpus=args.client_cpus,
            ray_cpus=ray_cpus,
        )
        return clock

    # One Ray CPU = one actor: the same compute as the single-threaded simulator, so the
    # ratio is Flower's own overhead. Then all cores: what Flower gains from parallelism.
    backends: dict[str, Callable[[], Clock]] = {
        "simulator": lambda: sim(False),
        "vectorised": lambda: sim(True),
        "flower 1 actor": lambda: flower(1),
        f"flower all {cores} cores": lambda: flower(None),
    }
    rounds: dict[str, list[float]] = {k: [] for k in backends}
    startup: list[float] = []
    last: dict[str, Clock] = {}
    for rep in range(args.repeats):
        for name, run in backends.items():
            clock = run()
            rounds[name].append(clock.per_round())
            last[name] = clock
            if name == "flower 1 actor":  # beyond the simulator's round 1 of this repetition
                sim_first = last["simulator"].ends[0] - last["simulator"].t0
                startup.append(clock.ends[0] - clock.t0 - sim_first)
        print(
            f"repetition {rep + 1}/{args.repeats}: "
            + ", ".join(f"{k} {v[-1] * 1e3:.1f} ms" for k, v in rounds.items()),
            flush=True,
        )

    def ratio(a: str, b: str) -> list[float]:
        return [x / y for x, y in zip(rounds[a], rounds[b])]

    names = list(backends)
    seq, vec, fl1, fla = names
    r2 = "{:.2f}"
    accs = [last[k].last.get("test_acc") for k in (seq, fl1, fla)]
    same = accs[0] == accs[1] == accs[2]
    lines = [
        "bench_flower: one FL round, in-process simulator vs Flower simulation engine (Ray)",
        f"workload: {args.clients} clients/round (full participation) x {args.steps} local "
        f"steps, batch 16, {args.model} on {args.dataset}, {args.rounds} rounds",
        f"machine: {platform.processor() or platform.machine()}, {cores} cores, "
        f"torch threads {torch.get_num_threads()}, Ray CPUs per client {args.client_cpus}, "
        f"load avg {load0:.1f} at start, {os.getloadavg()[0]:.1f} at end (shared machine)",
        commit_line(),
        f"{args.repeats} interleaved repetitions (simulator, vectorised, flower 1 actor, "
        "flower all cores); median [min–max] over them",
        *(f"{f'{k} per round':36s} : {spread([t * 1e3 for t in v])} ms" for k, v in rounds.items()),
        f"ratio flower (1 actor) / vectorised   : {spread(ratio(fl1, vec), r2)} x  (goal >= 10)",
        f"ratio flower (all cores) / vectorised : {spread(ratio(fla, vec), r2)} x",
        f"ratio flower (1 actor) / simulator    : {spread(ratio(fl1, seq), r2)} x",
        f"ratio flower (all cores) / simulator  : {spread(ratio(fla, seq), r2)} x",
        f"ratio simulator / vectorised          : {spread(ratio(seq, vec), r2)} x",
        f"flower start-up (Ray, node discovery), beyond round 1: {spread(startup)} s",
        "final test_acc, simulator / flower 1 actor / flower all cores: "
        + " / ".join(f"{a:.4f}" for a in accs)
        + (" (identical)" if same else " (DIFFERENT)"),
        f"final test_acc, vectorised: {last[vec].last.get('test_acc'):.4f} (float tolerance: "
        f"batched kernels sum in another order)",
    ]
    report = "\n".join(lines)
    print(report)
    if args.save:
        args.save.parent.mkdir(parents=True, exist_ok=True)
        args.save.write_text(report + "\n")


if __name__ == "__main__":
    main()
