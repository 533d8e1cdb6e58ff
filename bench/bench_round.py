"""One FL round (S clients × U local steps) in the simulator vs a plain torch loop doing the
same S·U SGD steps on the same model, data and batch size. Prints the time ratio
(goal ≤ 1.10: the simulator should add almost nothing to the training cost).

    python bench/bench_round.py [--clients 10] [--steps 20] [--repeats 5] [--json out.json]

``bench/ab.py`` runs it against two source trees side by side.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from fedshield import config
from fedshield.sim.builder import build
from fedshield.sim.engine import Simulator


def plain_loop(model, clients, steps, batch_size, lr, seed):
    """What a hand-written FedAvg round costs at minimum: S·U SGD steps + a mean."""
    g = torch.Generator().manual_seed(seed)
    start = [p.detach().clone() for p in model.parameters()]
    acc = [torch.zeros_like(p) for p in start]
    for data in clients:
        with torch.no_grad():
            for p, s in zip(model.parameters(), start):
                p.copy_(s)
        opt = torch.optim.SGD(model.parameters(), lr=lr)
        for _ in range(steps):
            idx = torch.randint(len(data), (batch_size,), generator=g)
            x, y = data.batch(idx)
            opt.zero_grad(set_to_none=True)
            F.cross_entropy(model(x), y).backward()
            opt.step()
        with torch.no_grad():
            for a, p, s in zip(acc, model.parameters(), start):
                a += p - s
    with torch.no_grad():
        for p, s, a in zip(model.parameters(), start, acc):
            p.copy_(s + a / len(clients))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--clients", type=int, default=10)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--model", default="cnn_small")
    ap.add_argument("--threads", type=int, default=1, help="torch threads (1: least noise)")
    ap.add_argument("--json", type=Path, default=None, help="write the times (s) here")
    ap.add_argument(
        "--clock", choices=["wall", "cpu"], default="wall",
        help="cpu: the process's CPU time, less disturbed by a busy machine",
    )  # fmt: skip
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    cfg = config.load(
        preset="demo",
        overrides=[
            f"server.clients_per_round={args.clients}",
            f"data.num_clients={args.clients}",
            f"client.local_steps={args.steps}",
            f"model.name={args.model}",
            "eval.every=1000",
            "rounds=1000",
            f"run.threads={args.threads}",
        ],
    )
    exp = build(cfg)
    sim = Simulator(exp)
    cohort_data = exp.clients
    now = time.process_time if args.clock == "cpu" else time.perf_counter
    sim_times, plain_times = [], []
    for r in range(args.repeats + 1):  # first pair is warm-up
        t0 = now()
        sim.run_round(r + 1)
        t1 = now()
        plain_loop(exp.model, cohort_data, args.steps, cfg.client.batch_size, cfg.client.lr, r)
        t2 = now()
        if r:
            sim_times.append(t1 - t0)
            plain_times.append(t2 - t1)
    # Pairs are interleaved so both see the same machine load; the minimum is the least
    # disturbed repeat, the median shows the spread.
    s, p = min(sim_times), min(plain_times)
    sm, pm = statistics.median(sim_times), statistics.median(plain_times)
    print(f"threads={torch.get_num_threads()} S={args.clients} U={args.steps} model={args.model}")
    print(f"simulator round : min {s * 1000:8.1f} ms, median {sm * 1000:8.1f} ms")
    print(f"plain torch loop: min {p * 1000:8.1f} ms, median {pm * 1000:8.1f} ms")
    print(f"ratio simulator/plain = {s / p:.3f} (min), {sm / pm:.3f} (median)  (goal <= 1.10)")
    if args.json:
        label = f"round S={args.clients} U={args.steps} {args.model}"
        args.json.write_text(json.dumps({label: {"sim": sim_times, "plain": plain_times}}))


if __name__ == "__main__":
    main()
