"""The same FL workload per round in the in-process simulator vs Flower's simulation
engine (Ray): S clients × U local steps of a small CNN, full participation. Prints the
per-round times and their ratio (goal: the simulator ≥ 10× faster per round at S = 100
tiny clients), and Flower's one-off start-up (Ray + node discovery). The simulator runs
twice: client by client (``run.vectorize=false``) and as one batched computation per
round (``run.vectorize=true``, docs/vectorized.md); Flower trains one client per node.

Per-round time is steady state: the wall time between the ends of round 1 and round R−1,
divided by R − 2 (start-up and the final evaluation excluded; both backends evaluate only
in the last round).

    PYTHONPATH=src python bench/bench_flower.py [--clients 100] [--steps 2] [--rounds 4]
        [--save docs/results/flower_bench.txt]
"""

from __future__ import annotations

import argparse
import os
import platform
import time
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


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--clients", type=int, default=100)
    ap.add_argument("--steps", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--dataset", default="digits", help="digits: ~18 samples per client")
    ap.add_argument("--model", default="cnn_small")
    ap.add_argument("--threads", type=int, default=1, help="torch threads in this process")
    ap.add_argument("--client-cpus", type=float, default=1.0, help="Ray CPUs per virtual client")
    ap.add_argument("--save", type=Path, default=None, help="also write the report here")
    args = ap.parse_args()
    if args.rounds < 3:
        ap.error("--rounds must be >= 3 (steady state needs rounds 2..R-1)")
    # One thread by default: tiny models gain nothing from intra-op threads, and Ray's
    # actors run with one thread each (OMP_NUM_THREADS=1), so both sides compute alike.
    torch.set_num_threads(args.threads)
    raw = workload(args.clients, args.steps, args.rounds, args.dataset, args.model)
    load0 = os.getloadavg()[0]

    sim_clock = Clock()
    sim = Simulator(build(config.validate(raw)))
    built = time.perf_counter()
    sim.run(sim_clock)
    sim_round = sim_clock.per_round()
    vec_clock = Clock()
    vec_raw = workload(args.clients, args.steps, args.rounds, args.dataset, args.model, True)
    Simulator(build(config.validate(vec_raw))).run(vec_clock)
    vec_round = vec_clock.per_round()

    from fedshield.flower.simulation import run_simulation

    def flower(ray_cpus: int | None) -> Clock:
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
    fl_one, fl_all = flower(1), flower(None)
    fl_round = fl_one.per_round()
    fl_startup = fl_one.ends[0] - fl_one.t0 - (sim_clock.ends[0] - built)

    accs = [c.last.get("test_acc") for c in (sim_clock, fl_one, fl_all)]
    same = accs[0] == accs[1] == accs[2]
    cores = os.cpu_count() or 1
    lines = [
        "bench_flower: one FL round, in-process simulator vs Flower simulation engine (Ray)",
        f"workload: {args.clients} clients/round (full participation) x {args.steps} local "
        f"steps, batch 16, {args.model} on {args.dataset}, {args.rounds} rounds",
        f"machine: {platform.processor() or platform.machine()}, {os.cpu_count()} cores, "
        f"torch threads {torch.get_num_threads()}, Ray CPUs per client {args.client_cpus}, "
        f"load avg {load0:.1f} at start, {os.getloadavg()[0]:.1f} at end (shared machine)",
        f"simulator per round                  : {sim_round * 1e3:9.1f} ms",
        f"simulator per round, vectorised      : {vec_round * 1e3:9.1f} ms",
        f"flower per round, 1 Ray actor        : {fl_round * 1e3:9.1f} ms",
        f"{f'flower per round, all {cores} cores':37s}: {fl_all.per_round() * 1e3:9.1f} ms",
        f"ratio flower (1 actor) / simulator   : {fl_round / sim_round:9.1f} x  (goal >= 10)",
        f"ratio flower (all cores) / simulator : {fl_all.per_round() / sim_round:9.1f} x",
        f"ratio flower (1 actor) / vectorised  : {fl_round / vec_round:9.1f} x",
        f"ratio flower (all cores) / vectorised: {fl_all.per_round() / vec_round:9.1f} x",
        f"ratio simulator / vectorised         : {sim_round / vec_round:9.1f} x",
        f"flower start-up (Ray, node discovery), beyond round 1: {fl_startup:.1f} s",
        "final test_acc, simulator / flower 1 actor / flower all cores: "
        + " / ".join(f"{a:.4f}" for a in accs)
        + (" (identical)" if same else " (DIFFERENT)"),
        f"final test_acc, vectorised: {vec_clock.last.get('test_acc'):.4f} (float tolerance: "
        f"batched kernels sum in another order)",
    ]
    report = "\n".join(lines)
    print(report)
    if args.save:
        args.save.parent.mkdir(parents=True, exist_ok=True)
        args.save.write_text(report + "\n")


if __name__ == "__main__":
    main()
