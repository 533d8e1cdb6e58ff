"""Time every fedshield aggregator against ByzFL's (and Flower's) version of the same rule.

    python bench/bench_aggregators.py            # S = 40, d = 10^6, float32, CPU
    python bench/bench_aggregators.py --quick    # d = 10^5

For each registered rule: our time, ByzFL's time for the same rule with parameters chosen
so that both compute the same thing (the ``max|diff|`` column checks it), the ratio, the
time of one pass over the matrix (``updates.sum(0)``, the floor of any O(S·d) rule) and
Flower's numpy version where it has one. Times are the best of ``--repeats`` runs after a
warm-up call, ours, ByzFL's and the floor interleaved so that load from other processes on a
shared machine hits them alike (Flower: one timed call). ``--threads 1`` gives the steadiest
ratios on a busy machine.

Geometric median: ByzFL runs a fixed number of Weiszfeld iterations, so it is given the
count our tolerance-based stopping rule used (same ν), i.e. the same work, and ``max|diff|``
compares it with ours run the ByzFL way (start at 0, that many iterations). ``norm_clip`` is
ByzFL's Clipping pre-aggregator followed by its Average. Bulyan has no ByzFL version;
Flower's (``--flower-bulyan``) runs S − 2f Krum rounds in Python loops, minutes at d = 10^6.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import os
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

import fedshield.aggregators as agg

try:
    import byzfl
except ImportError:  # the table then has no ByzFL column
    byzfl = None
try:
    from flwr.server.strategy import aggregate as flwr_agg
except ImportError:
    flwr_agg = None

O_SD_RULES = {"mean", "drag", "brdrag", "fltrust", "centered_clipping", "norm_clip"}


def best_time(fn: Callable[[], Any], repeats: int) -> tuple[float, Any]:
    out = fn()  # warm-up (and the value to compare)
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times), out


def paired_times(fns: list[Callable[[], Any]], repeats: int) -> list[float]:
    """Best time of each function, calls interleaved so that load from other processes on
    a shared machine hits every contender alike."""
    best = [float("inf")] * len(fns)
    for _ in range(repeats):
        for i, fn in enumerate(fns):
            t0 = time.perf_counter()
            fn()
            best[i] = min(best[i], time.perf_counter() - t0)
    return best


def our_kwargs(name: str, f: int, s: int) -> dict[str, Any]:
    if name == "krum":
        return {"f": f}
    if name == "multikrum":
        return {"f": f, "m": s - f - 1}
    if name == "trimmed_mean":
        return {"f": f}
    if name == "bulyan":  # needs S ≥ 4f + 3
        return {"f": min(f, (s - 3) // 4)}
    if name in ("mda", "meamed", "monna", "caf", "smea", "dnc"):  # 2f < S
        return {"f": f}
    return {}


def byzfl_rule(name: str, f: int, diag: dict[str, float]) -> Callable[[torch.Tensor], Any] | None:
    """ByzFL's implementation of the same rule, parameters mapped to ours (see the tests)."""
    if byzfl is None:
        return None
    if name == "mean":
        return byzfl.Average()
    if name == "krum":  # ByzFL: mean over n − f' − 1 neighbours ⇔ Blanchard's n − f − 2
        return byzfl.Krum(f=f + 1)
    if name == "multikrum":  # ByzFL averages n − f' rows: our m = n − f − 1
        return byzfl.MultiKrum(f=f + 1)
    if name == "median":
        return byzfl.Median()
    if name == "trimmed_mean":
        return byzfl.TrMean(f=f)
    if name == "meamed":
        return byzfl.Meamed(f=f)
    if name in ("geomed", "rfa", "raga"):
        # ByzFL starts at 0, ours at the mean; same ν and iteration count = same work.
        return byzfl.GeometricMedian(nu=1e-6, T=int(diag["agg/iterations"]))
    if name == "centered_clipping":
        # ByzFL's CenteredClipping keeps its centre between calls: a fresh one per call.
        return lambda x: byzfl.CenteredClipping(tau=10.0, L=1)(x)
    if name == "norm_clip":  # clip to τ around 0, then average
        return lambda x: byzfl.Average()(byzfl.Clipping(c=10.0)(x))
    return None


def flower_rule(
    name: str, f: int, s: int, flower_bulyan: bool = False
) -> Callable[[np.ndarray], Any] | None:
    if flwr_agg is None:
        return None

    def results(x: np.ndarray) -> list[tuple[list[np.ndarray], int]]:
        return [([row], 1) for row in x]

    if name == "mean":
        return lambda x: flwr_agg.aggregate(results(x))[0]
    if name == "krum":
        return lambda x: flwr_agg.aggregate_krum(results(x), f, 0)[0]
    if name == "multikrum":
        return lambda x: flwr_agg.aggregate_krum(results(x), f, s - f - 1)[0]
    if name == "median":
        return lambda x: flwr_agg.aggregate_median(results(x))[0]
    if name == "trimmed_mean":  # ⌊βS⌋ = f
        return lambda x: flwr_agg.aggregate_trimmed_avg(results(x), (f + 0.5) / s)[0]
    if name == "bulyan" and flower_bulyan:  # S − 2f Krum rounds in Python: minutes at 10^6
        fb = min(f, (s - 3) // 4)
        return lambda x: flwr_agg.aggregate_bulyan(
            results(x), fb, flwr_agg.aggregate_krum, to_keep=0
        )[0]
    return None


def version(dist: str) -> str:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return "n/a"


def fmt_ms(t: float | None) -> str:
    return "-" if t is None else f"{t * 1e3:9.1f}"


def fmt_ratio(a: float, b: float | None) -> str:
    return "-" if b is None else f"{a / b:6.2f}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="d = 10^5 instead of 10^6")
    ap.add_argument("--clients", type=int, default=40, help="S, rows of the update matrix")
    ap.add_argument("--dim", type=int, default=None, help="d (overrides --quick)")
    ap.add_argument("--byzantine", type=int, default=8, help="f for krum/multikrum/trimmed")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    ap.add_argument("--no-flower", action="store_true", help="skip Flower (slow numpy Krum)")
    ap.add_argument("--flower-bulyan", action="store_true", help="time Flower's Bulyan too (slow)")
    ap.add_argument("--only", nargs="*", default=None, help="subset of aggregator names")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    s, f = args.clients, args.byzantine
    d = args.dim or (10**5 if args.quick else 10**6)

    gen = torch.Generator().manual_seed(0)
    # Heterogeneous-looking updates: a shared direction plus per-client noise, and f
    # Byzantine rows sending a scaled sign flip, so the robust rules have work to do.
    base = torch.randn(d, generator=gen)
    x = 0.5 * base + torch.randn(s, d, generator=gen)
    x[:f] *= -3.0
    reference = base + 0.5 * torch.randn(d, generator=gen)
    xn = x.numpy()

    print(
        f"# fedshield aggregators vs ByzFL {version('byzfl')} / Flower {version('flwr')}: "
        f"S={s}, d={d}, float32, CPU, torch {torch.__version__}, "
        f"{torch.get_num_threads()} threads, best of {args.repeats}; f={f}"
    )
    print(f"# load average at start: {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs")
    header = (
        f"{'rule':18s} {'ours ms':>9s} {'byzfl ms':>9s} {'ours/byzfl':>10s} {'floor ms':>9s} "
        f"{'ours/floor':>10s} {'flower ms':>9s} {'max|diff|':>10s}"
    )
    print(header)
    print("-" * len(header))
    for name in args.only or agg.names():
        rule = agg.build(name, **our_kwargs(name, f, s))
        ref = reference if rule.needs_reference else None

        def ours(r: agg.Aggregator = rule, rf: torch.Tensor | None = ref) -> Any:
            return r.aggregate(x, None, reference=rf)

        ours_out, diag = ours()  # warm-up, and the value to compare
        theirs_t, diff, note = None, None, ""
        theirs = byzfl_rule(name, f, diag)
        if theirs is not None:
            try:
                theirs_out = theirs(x)  # warm-up
                if name in ("geomed", "rfa", "raga"):
                    iters = int(diag["agg/iterations"])
                    note = f"  [{iters} Weiszfeld iterations]"
                    same = agg.build(name, max_iter=iters, tol=0.0, init="zeros")
                    ours_out = same(x)
                diff = float((ours_out - theirs_out).abs().max())
            except Exception as err:  # e.g. torch.quantile's input size limit
                note = f"  byzfl failed: {type(err).__name__}: {str(err)[:60]}"
                theirs = None
        fns: list[Callable[[], Any]] = [ours, lambda: x.sum(0)]
        if theirs is not None:
            fns.append(lambda t=theirs: t(x))
        times = paired_times(fns, args.repeats)
        ours_t, floor = times[0], times[1]
        if theirs is not None:
            theirs_t = times[2]
        fl_t = None
        fl = None if args.no_flower else flower_rule(name, f, s, args.flower_bulyan)
        if fl is not None:
            fl_t, _ = best_time(lambda g=fl: g(xn), 1)
        floor_ratio = fmt_ratio(ours_t, floor) if name in O_SD_RULES else "-"
        print(
            f"{name:18s} {fmt_ms(ours_t)} {fmt_ms(theirs_t):>9s} "
            f"{fmt_ratio(ours_t, theirs_t):>10s} {fmt_ms(floor)} {floor_ratio:>10s} "
            f"{fmt_ms(fl_t):>9s} "
            f"{'-' if diff is None else f'{diff:10.2e}':>10s}{note}"
        )


if __name__ == "__main__":
    main()
