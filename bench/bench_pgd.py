"""PGD-10 throughput: fedshield.adversarial.pgd vs torchattacks.PGD (same model, same batch).

Small CNN (2 conv + fc) on 3×32×32, batch 128, ε = 8/255, α = 2/255, random start, CPU by
default. Runs alternate between the two implementations (ABBA order) so drift in machine
load hits both equally. Each repeat is timed twice: wall clock, and the process's CPU time
(which other processes on a shared machine disturb far less). Throughputs (images/s) are
printed from the best and the median repeat of each clock, with ours/torchattacks (goal
≥ 1.0); the best repeat is the least disturbed one (the ``timeit`` convention).

    PYTHONPATH=src python bench/bench_pgd.py [--repeats 7] [--threads N] [--device cpu]
"""

from __future__ import annotations

import argparse
import platform
import statistics
import time
from collections.abc import Callable

import torch
import torchattacks
from torch import Tensor, nn

from fedshield.adversarial import pgd


def small_cnn(num_classes: int = 10) -> nn.Module:
    return nn.Sequential(
        nn.Conv2d(3, 32, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(32, 64, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        nn.Flatten(), nn.Linear(64 * 8 * 8, num_classes),
    )  # fmt: skip


def timed(fn: Callable[[], Tensor], device: torch.device) -> tuple[float, float]:
    """(wall seconds, CPU seconds of this process) for one call."""
    if device.type == "cuda":
        torch.cuda.synchronize()
    wall, cpu = time.perf_counter(), time.process_time()
    fn()
    if device.type == "cuda":
        torch.cuda.synchronize()
    return time.perf_counter() - wall, time.process_time() - cpu


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batch", type=int, default=128)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--device", default="cpu")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    device = torch.device(args.device)

    torch.manual_seed(0)
    model = small_cnn().to(device).eval()
    x = torch.rand(args.batch, 3, 32, 32, device=device)
    y = torch.randint(0, 10, (args.batch,), device=device)
    eps, alpha = 8 / 255, 2 / 255
    gen = torch.Generator(device=device).manual_seed(0)
    theirs = torchattacks.PGD(model, eps=eps, alpha=alpha, steps=args.steps, random_start=True)

    candidates: dict[str, Callable[[], Tensor]] = {
        "fedshield": lambda: pgd(model, x, y, eps, alpha, args.steps, generator=gen),
        "torchattacks": lambda: theirs(x, y),
    }
    for fn in candidates.values():  # warm-up: allocator, oneDNN kernel selection
        fn()
    times: dict[str, list[tuple[float, float]]] = {name: [] for name in candidates}
    order = list(candidates)
    for _ in range(args.repeats):
        for name in order:
            times[name].append(timed(candidates[name], device))
        order.reverse()  # ABBA: neither side always runs right after the other

    print(
        f"PGD-{args.steps}, batch {args.batch}, 3x32x32, small CNN (2 conv + fc), "
        f"device {device}, torch {torch.__version__}, torchattacks {torchattacks.__version__}, "
        f"threads {torch.get_num_threads()}, {platform.processor() or platform.machine()}"
    )
    print(f"{args.repeats} repeats each; images/s from the best and the median repeat")
    for clock, col in (("wall", 0), ("cpu", 1)):
        best, median = {}, {}
        for name, ts in times.items():
            secs = [t[col] for t in ts]
            best[name], median[name] = args.batch / min(secs), args.batch / statistics.median(secs)
            print(f"  {clock:>4} {name:>12}: best {best[name]:7.1f}   median {median[name]:7.1f}")
        ours, ref = "fedshield", "torchattacks"
        print(
            f"  {clock:>4} ratio fedshield/torchattacks: best {best[ours] / best[ref]:.3f}"
            f"   median {median[ours] / median[ref]:.3f}"
        )


if __name__ == "__main__":
    main()
