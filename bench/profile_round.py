"""Where one round's local training spends its time: the sequential simulator, the
hand-written loop and the vectorised cohort of ``bench_vectorized.py``, by phase.

Each phase is a function wrapped with a CPU-time accumulator (the process's CPU time, which
other jobs on a shared machine disturb less than the wall time; one thread), summed over
``--rounds`` rounds after one warm-up round and given per round, nested phases indented
under the phase that contains them; "other" is the rest of the enclosing phase. Also the
minor page faults per round (``getrusage``), which the batched path pays on fresh
MiB-sized tensors unless freed memory is kept (``fedshield.sim.vectorized.heap``).

    PYTHONPATH=src python bench/profile_round.py [--dataset digits] [--models mlp,cnn_small]
        [--clients 100] [--steps 1,5] [--save docs/results/profile_round.txt]
"""

from __future__ import annotations

import argparse
import resource
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_vectorized import cohort_round, hand_loop, raw_config, simulator

import fedshield.algorithms.client.base as client_base
import fedshield.sim.vectorized.trainer as vtrainer
from fedshield.data.bundle import TensorData
from fedshield.sim.engine import Simulator

#: (label, owner, attribute, parent label): the phases, nested by parent.
PHASES: dict[str, list[tuple[str, Any, str, str | None]]] = {
    "seq": [
        ("client_update (per client, all of it)", Simulator, "client_update", None),
        (
            "local_update",
            client_base.ClientAlgorithm,
            "local_update",
            "client_update (per client, all of it)",
        ),
        ("forward (loss)", client_base.ClientAlgorithm, "loss", "local_update"),
        ("backward", torch.autograd, "backward", "local_update"),
        ("SGD step", client_base.SGDStep, "step", "local_update"),
        ("mini-batch gather", TensorData, "batch", "local_update"),
    ],
    "loop": [
        ("forward", torch.nn.Module, "__call__", None),
        ("backward", torch.autograd, "backward", None),
        ("torch.optim.SGD step", torch.optim.SGD, "step", None),
        ("torch.optim.SGD()", torch.optim.SGD, "__init__", None),
        ("mini-batch gather", TensorData, "batch", None),
    ],
    "vec": [
        ("train (the cohort)", vtrainer.VectorizedTrainer, "train", None),
        ("train_chunk", vtrainer.VectorizedTrainer, "train_chunk", "train (the cohort)"),
        ("batched forward+backward", vtrainer.VectorizedTrainer, "grads", "train_chunk"),
        ("SGD step on stacked tensors", vtrainer.VectorizedTrainer, "_sgd_step", "train_chunk"),
        ("mini-batch gather", vtrainer._Feed, "batch", "train_chunk"),
        ("per-client batch streams", vtrainer, "make_generator", "train_chunk"),
        ("client constants", vtrainer.VectorizedTrainer, "constants", "train_chunk"),
    ],
}


class Timers:
    def __init__(self) -> None:
        self.acc: dict[str, float] = {}
        self.undo: list[Callable[[], None]] = []

    def wrap(self, label: str, owner: Any, name: str) -> None:
        fn = getattr(owner, name)
        acc = self.acc
        acc[label] = 0.0
        depth = [0]

        def timed(*a: Any, **k: Any) -> Any:
            if depth[0]:  # recursive calls (nested modules) count once
                return fn(*a, **k)
            depth[0] += 1
            t0 = time.process_time()
            try:
                return fn(*a, **k)
            finally:
                acc[label] += time.process_time() - t0
                depth[0] -= 1

        setattr(owner, name, timed)
        self.undo.append(lambda: setattr(owner, name, fn))

    def restore(self) -> None:
        for u in reversed(self.undo):
            u()
        self.undo.clear()


def profile(kind: str, run: Callable[[int], None], rounds: int) -> tuple[float, float, Timers]:
    run(1)
    timers = Timers()
    for label, owner, name, _ in PHASES[kind]:
        timers.wrap(label, owner, name)
    try:
        f0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        t0 = time.process_time()
        for r in range(rounds):
            run(r + 2)
        total = (time.process_time() - t0) / rounds
        faults = (resource.getrusage(resource.RUSAGE_SELF).ru_minflt - f0) / rounds
    finally:
        timers.restore()
    return total, faults, timers


def table(kind: str, total: float, faults: float, timers: Timers, rounds: int) -> list[str]:
    lines = [f"  {kind:<5} round {total * 1e3:8.2f} ms CPU   minor page faults {faults:7.0f}"]
    children: dict[str | None, list[str]] = {}
    for label, _, _, parent in PHASES[kind]:
        children.setdefault(parent, []).append(label)

    def emit(parent: str | None, depth: int, whole: float) -> None:
        used = 0.0
        for label in children.get(parent, []):
            t = timers.acc[label] / rounds
            used += t
            lines.append(
                f"  {'  ' * depth}  {label:<40}{t * 1e3:8.2f} ms  {100 * t / total:5.1f} %"
            )
            emit(label, depth + 1, t)
        rest = whole - used
        if children.get(parent):
            lines.append(
                f"  {'  ' * depth}  {'other':<40}{rest * 1e3:8.2f} ms  {100 * rest / total:5.1f} %"
            )

    emit(None, 0, total)
    return lines


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dataset", default="digits")
    ap.add_argument("--models", default="mlp,cnn_small")
    ap.add_argument("--clients", type=int, default=100)
    ap.add_argument("--steps", default="1,5")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--save", type=Path, default=None)
    args = ap.parse_args()
    torch.set_num_threads(1)
    from fedshield.provenance import source_commit

    src = source_commit()
    commit = (src.get("commit") or "unknown")[:12] + ("+dirty" if src.get("dirty") else "")
    lines = [
        f"# profile_round  dataset={args.dataset}  S={args.clients}  threads=1  "
        f"torch {torch.__version__}  commit {commit}",
        f"# CPU time per round (mean of {args.rounds}), by phase; shares of the round",
    ]
    print("\n".join(lines), flush=True)
    for model in args.models.split(","):
        for u in (int(v) for v in args.steps.split(",")):
            raw = raw_config(model, args.dataset, args.clients, u, "cpu")
            seq = simulator(raw, False)
            vec = simulator(raw, True)
            block = [f"{model} U={u}"]
            for kind, run in (
                ("seq", cohort_round(seq)),
                ("loop", hand_loop(seq)),
                ("vec", cohort_round(vec)),
            ):
                total, faults, timers = profile(kind, run, args.rounds)
                block += table(kind, total, faults, timers, args.rounds)
            print("\n".join(block), flush=True)
            lines += block
    if args.save:
        args.save.parent.mkdir(parents=True, exist_ok=True)
        args.save.write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
