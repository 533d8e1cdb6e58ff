"""Vectorised cohorts (run.vectorize) vs client-by-client training, measured side by side.

For S clients × U local SGD steps of ``mlp`` and ``cnn_small`` on bundled data (full
participation, IID, ``data.num_clients = S``, batch 32 or the client's size), one round's
local training (``Simulator.train_cohort``) is timed three ways, interleaved per
repetition so all see the same machine load:

* ``vec``  — the simulator with ``run.vectorize=true`` (one batched computation);
* ``seq``  — the simulator with ``run.vectorize=false`` (client by client);
* ``loop`` — a hand-written sequential loop: per client, copy θ, then U steps of
  ``torch.optim.SGD`` on random batches of the same size (the sequential ceiling);
* ``bare`` — the batching ceiling: per step one ``vmap(grad(cross-entropy))`` call over
  all S clients with batches of one size, then θ ← θ − η∇ on the stacked parameters — no
  per-client index streams, size groups, momentum, client state or uploads (the
  measurement behind the 5× goal of docs/vectorized.md).

Printed: min and median milliseconds, and the ratios loop/vec (the speed-up; goal ≥ 5 at
S = 100 on CPU), seq/vec, seq/loop and loop/bare (what batching alone can give on this
machine, so loop/vec ÷ loop/bare is the share of it the engine keeps). Then FedPGD
clients (PGD-5) at S = 20 (``--algorithms`` adds others, e.g. scaffold), and the memory
peak of one batched round at S = 1000 for several ``run.vectorize_chunk`` values (each
in a fresh process: peak RSS growth on CPU, ``max_memory_allocated`` on CUDA).

    PYTHONPATH=src python bench/bench_vectorized.py [--device cpu] [--dataset mnist5k]
        [--sizes 10,100,1000] [--steps 1,5] [--repeats 3] [--save docs/results/...]
        [--json times.json]

``bench/ab.py`` runs it against two source trees side by side.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from fedshield import config
from fedshield.sim.builder import build
from fedshield.sim.engine import Simulator


def raw_config(
    model: str, dataset: str, clients: int, steps: int, device: str, **client: Any
) -> dict[str, Any]:
    return {
        "name": "bench-vectorized",
        "seed": 0,
        "rounds": 1000,
        "data": {"dataset": dataset, "num_clients": clients, "partition": "iid"},
        "model": {"name": model},
        "client": {"lr": 0.05, "batch_size": 32, "local_steps": steps, **client},
        "server": {"clients_per_round": clients},
        "eval": {"every": 1000},
        "run": {"progress": False, "device": device, "threads": 1},
    }


def simulator(raw: dict[str, Any], vectorize: bool, chunk: int | None = None) -> Simulator:
    raw = json.loads(json.dumps(raw))
    raw["run"]["vectorize"] = vectorize
    if chunk is not None:
        raw["run"]["vectorize_chunk"] = chunk
    return Simulator(build(config.validate(raw)))


def hand_loop(sim: Simulator, pgd_steps: int = 0) -> Callable[[int], None]:
    """Per client: θ ← θ⁰, then U plain SGD steps on random batches of the simulator's
    batch size (capped by the client's size), on PGD-K examples (eval mode, ε = 0.1,
    α = ε/4) when ``pgd_steps`` > 0; the deltas are kept, as a round must."""
    from fedshield.adversarial import pgd

    model, spec, device = sim.model, sim.comp.client.spec, sim.device
    clients = sim.exp.clients
    params = list(model.parameters())
    start = [p.detach().clone() for p in params]

    def run(rnd: int) -> None:
        g = torch.Generator().manual_seed(rnd)
        deltas = []
        for data in clients:
            with torch.no_grad():
                for p, s in zip(params, start):
                    p.copy_(s)
            opt = torch.optim.SGD(params, lr=spec.lr)
            b = min(spec.batch_size, len(data))
            for _ in range(spec.num_steps(len(data))):
                idx = torch.randperm(len(data), generator=g)[:b]
                x, y = data.batch(idx, device)
                if pgd_steps:
                    model.eval()
                    x = pgd(model, x, y, 0.1, 0.025, pgd_steps)
                    model.train()
                opt.zero_grad(set_to_none=True)
                F.cross_entropy(model(x), y).backward()
                opt.step()
            deltas.append(torch.cat([(p - s).detach().reshape(-1) for p, s in zip(params, start)]))
        _sync(device)

    return run


def bare_vmap(sim: Simulator) -> Callable[[int], None]:
    """The batching ceiling (module docstring): U steps of one ``vmap(grad)`` call over the
    S clients' stacked parameters, batches of the most common client batch size drawn at
    random from the pooled training data (which rows does not change the cost)."""
    from torch.func import functional_call, grad, vmap

    model, spec, device = sim.model, sim.comp.client.spec, sim.device
    clients = sim.exp.clients
    s = len(clients)
    b = statistics.mode(min(spec.batch_size, len(d)) for d in clients)
    steps = max(spec.num_steps(len(d)) for d in clients)
    pool_x = torch.cat([d.x for d in clients]).to(device)
    pool_y = torch.cat([d.y for d in clients]).to(device)
    start = {k: v.detach() for k, v in model.named_parameters()}
    buffers = {k: v.detach() for k, v in model.named_buffers()}

    def loss(p: dict[str, torch.Tensor], x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(functional_call(model, (p, buffers), (x,)), y)

    step = vmap(grad(loss), randomness="different")

    def run(rnd: int) -> None:
        g = torch.Generator(device=device).manual_seed(rnd)
        model.train()
        params = {k: v.unsqueeze(0).expand(s, *v.shape).clone() for k, v in start.items()}
        for _ in range(steps):
            idx = torch.randint(len(pool_y), (s * b,), generator=g, device=device)
            x = pool_x[idx]
            if x.dtype == torch.uint8:
                x = x.float().div_(255.0)
            grads = step(params, x.view(s, b, *x.shape[1:]), pool_y[idx].view(s, b))
            with torch.no_grad():
                for k, p in params.items():
                    p.sub_(grads[k], alpha=spec.lr)
        _sync(device)

    return run


def cohort_round(sim: Simulator) -> Callable[[int], None]:
    def run(rnd: int) -> None:
        sim.train_cohort(sim.begin_round(rnd))
        _sync(sim.device)

    return run


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


CLOCKS = {"wall": time.perf_counter, "cpu": time.process_time}


def measure(
    runs: dict[str, Callable[[int], None]], repeats: int, clock: str = "wall"
) -> dict[str, list[float]]:
    """Interleaved repetitions after one warm-up each (noisy shared machine). ``cpu``: the
    process's CPU time, which other processes on a busy machine disturb less than the wall
    time (one thread, so CPU time is the time the run took when it ran)."""
    now = CLOCKS[clock]
    times: dict[str, list[float]] = {k: [] for k in runs}
    for r in range(repeats + 1):
        for name, fn in runs.items():
            t0 = now()
            fn(r + 1)
            if r:
                times[name].append(now() - t0)
    return times


def report(label: str, times: dict[str, list[float]]) -> str:
    lo = {k: min(v) for k, v in times.items()}
    med = {k: statistics.median(v) for k, v in times.items()}
    cols = "  ".join(f"{k} {lo[k] * 1e3:8.1f}/{med[k] * 1e3:8.1f}" for k in times)
    ratios = []
    for a, b in (("loop", "vec"), ("seq", "vec"), ("seq", "loop"), ("loop", "bare")):
        if a in lo and b in lo:
            ratios.append(f"{a}/{b} {lo[a] / lo[b]:5.2f}/{med[a] / med[b]:5.2f}")
    return f"{label:<28} {cols}  |  {'  '.join(ratios)}"


def peak_memory(raw: dict[str, Any], chunk: int) -> float:
    """MiB of peak memory growth during one batched round, in a fresh process: resident
    set size polled every 0.5 ms on CPU, ``max_memory_allocated`` on CUDA."""
    env = dict(os.environ, PYTHONPATH=os.environ.get("PYTHONPATH", "src"))
    out = subprocess.run(
        [sys.executable, __file__, "--memory-child", json.dumps(raw), str(chunk)],
        capture_output=True,
        text=True,
        env=env,
        check=True,
    )
    return float(out.stdout.strip().splitlines()[-1])


def _rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def memory_child(raw_json: str, chunk: int) -> None:
    import threading

    torch.set_num_threads(1)
    sim = simulator(json.loads(raw_json), True, chunk)
    plan = sim.begin_round(1)
    dev = sim.device
    if dev.type == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
        sim.train_cohort(plan)
        torch.cuda.synchronize()
        print((torch.cuda.max_memory_allocated() - base) / 2**20)
        return
    base, peak, done = _rss(), [0], threading.Event()

    def poll() -> None:
        while not done.is_set():
            peak[0] = max(peak[0], _rss())
            time.sleep(0.0005)

    th = threading.Thread(target=poll)
    th.start()
    sim.train_cohort(plan)
    done.set()
    th.join()
    print((max(peak[0], _rss()) - base) / 2**20)


def _server_for(client: str) -> str:
    """The server algorithm whose ``needs_client`` tag names ``client``, else fedavg."""
    from fedshield.algorithms.server import SERVER_ALGORITHMS

    for entry in SERVER_ALGORITHMS.entries():
        if client in entry.tag_values("needs_client"):
            return entry.name
    return "fedavg"


def param_count(raw: dict[str, Any]) -> int:
    sim = simulator(raw, False)
    return sim.state.params.numel()


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--memory-child":
        memory_child(sys.argv[2], int(sys.argv[3]))
        return
    ap = argparse.ArgumentParser()
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--dataset", default="mnist5k")
    ap.add_argument("--models", default="mlp,cnn_small")
    ap.add_argument("--sizes", default="10,100,1000")
    ap.add_argument("--steps", default="1,5")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--loop-max", type=int, default=1000, help="largest S for loop/seq timing")
    ap.add_argument("--pgd-clients", type=int, default=20, help="S of the --algorithms rows")
    ap.add_argument(
        "--algorithms", default="fedpgd", help="client algorithms timed at S=--pgd-clients, U=2"
    )
    ap.add_argument("--chunks", default="32,128,1000", help="chunk sizes of the memory check")
    ap.add_argument("--chunk", type=int, default=None, help="run.vectorize_chunk of the timings")
    ap.add_argument("--save", type=Path, default=None)
    ap.add_argument("--json", type=Path, default=None, help="write every run's times (s)")
    ap.add_argument("--clock", choices=sorted(CLOCKS), default="wall", help="wall or CPU time")
    args = ap.parse_args()
    torch.set_num_threads(1)
    from fedshield.provenance import source_commit

    src = source_commit()
    commit = (src.get("commit") or "unknown")[:12] + ("+dirty" if src.get("dirty") else "")
    lines = [
        f"# bench_vectorized  device={args.device}  dataset={args.dataset}  threads=1  "
        f"torch {torch.__version__}  {platform.processor() or platform.machine()}  "
        f"commit {commit}",
        f"# times: one round's local training ({args.clock} clock), min/median ms over "
        f"{args.repeats} interleaved repeats; ratios min/median",
    ]

    timings: dict[str, dict[str, list[float]]] = {}

    def emit(line: str) -> None:
        print(line, flush=True)
        lines.append(line)

    def timed(label: str, runs: dict[str, Callable[[int], None]]) -> None:
        timings[label] = measure(runs, args.repeats, args.clock)
        emit(report(label, timings[label]))

    for line in lines:
        print(line)
    for model in args.models.split(","):
        for s in (int(v) for v in args.sizes.split(",")):
            for u in (int(v) for v in args.steps.split(",")):
                raw = raw_config(model, args.dataset, s, u, args.device)
                vec = simulator(raw, True, args.chunk)
                runs: dict[str, Callable[[int], None]] = {"vec": cohort_round(vec)}
                if s <= args.loop_max:  # beyond, the sequential runs take minutes
                    seq = simulator(raw, False)
                    runs["seq"] = cohort_round(seq)
                    runs["loop"] = hand_loop(seq)
                    runs["bare"] = bare_vmap(seq)
                timed(f"{model:<9} S={s:<4} U={u}", runs)

    s = args.pgd_clients
    for algo in args.algorithms.split(","):
        pgd = algo == "fedpgd"
        for model in args.models.split(","):
            raw = raw_config(model, args.dataset, s, 2, args.device, algorithm=algo)
            raw["server"]["algorithm"] = _server_for(algo)
            if pgd:
                raw["client"]["params"] = {"steps": 5, "eps": 0.1}
            vec, seq = simulator(raw, True, args.chunk), simulator(raw, False)
            runs = {"vec": cohort_round(vec), "seq": cohort_round(seq)}
            runs["loop"] = hand_loop(seq, 5 if pgd else 0)
            timed(f"{algo} {model:<9} S={s} U=2{' PGD-5' if pgd else ''}", runs)

    if args.chunks:
        s = max(int(v) for v in args.sizes.split(","))
        model = args.models.split(",")[-1]
        raw = raw_config(model, args.dataset, s, 1, args.device)
        d = param_count(raw)
        out = s * d * 4 / 2**20
        emit(
            f"# memory of one batched round: {model}, S={s}, U=1, d={d}; the [S, d] deltas "
            f"alone are {out:.1f} MiB (the sequential path holds them too)"
        )
        for chunk in (int(v) for v in args.chunks.split(",")):
            mib = peak_memory(raw, chunk)
            per = (mib - out) * 2**20 / (min(chunk, s) * d * 4)
            emit(
                f"chunk={chunk:<5} peak growth {mib:8.1f} MiB = deltas + {mib - out:7.1f} MiB "
                f"working set ({per:.1f} θ-sized copies per client of the chunk)"
            )
    if args.save:
        args.save.parent.mkdir(parents=True, exist_ok=True)
        args.save.write_text("\n".join(lines) + "\n")
    if args.json:
        args.json.write_text(json.dumps(timings))


if __name__ == "__main__":
    main()
