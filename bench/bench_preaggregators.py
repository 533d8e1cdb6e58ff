"""ARC and static clipping: fedshield vs ByzFL 0.0.11, side by side.

    python bench/bench_preaggregators.py                 # n = 50 rows, d = 1e5, float32
    python bench/bench_preaggregators.py --d 1000000 --repeats 11

Rows g_i ~ N(0, I) scaled by a spread of norms (0.5–3×), so ARC(f) clips its
⌊2f/n·(n − f)⌋ largest rows and Clipping(c) the rows above c. Both libraries get the same
float32 torch matrix. ByzFL clips its input in place; fedshield returns a new matrix and
leaves its input alone (the pre-aggregator contract), so ByzFL is timed twice: on a copy
made outside the timed region (``byzfl``: the clipping alone) and with the copy a caller
needs to keep its rows (``byzfl+copy``). Calls alternate, so a busy machine slows all
alike; the table gives the fastest and the median wall time per call (ms), the ratios of
the fastest times, and the largest difference of the outputs relative to the largest
entry (float32 tolerance: ~1e-7). Run with OMP_NUM_THREADS=1 for the single-thread figure.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import torch

import fedshield.preaggregators as pre

try:
    import byzfl
except ImportError as err:  # this bench compares with ByzFL
    raise SystemExit(f"bench_preaggregators needs byzfl: {err}") from None

Call = Callable[[torch.Tensor], object]


def timed(ours: Call, theirs: Call, x: torch.Tensor, repeats: int) -> dict[str, list[float]]:
    """Seconds per call of ours, ByzFL's on a ready copy and ByzFL's with the copy."""
    out: dict[str, list[float]] = {"fedshield": [], "byzfl": [], "byzfl+copy": []}
    for _ in range(repeats):
        t0 = time.perf_counter()
        ours(x)
        out["fedshield"].append(time.perf_counter() - t0)
        arg = x.clone()
        t0 = time.perf_counter()
        theirs(arg)
        out["byzfl"].append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        theirs(x.clone())
        out["byzfl+copy"].append(time.perf_counter() - t0)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--n", type=int, default=50)
    ap.add_argument("--d", type=int, default=100_000)
    ap.add_argument("--f", type=int, default=10)
    ap.add_argument("--c", type=float, default=300.0, help="static clipping radius")
    ap.add_argument("--repeats", type=int, default=31)
    args = ap.parse_args()
    g = torch.Generator().manual_seed(0)
    x = torch.randn(args.n, args.d, generator=g)
    x *= torch.linspace(0.5, 3.0, args.n)[:, None]
    cases = [
        ("arc", pre.build("arc", f=args.f), byzfl.ARC(f=args.f)),
        ("clip", pre.build("clip", c=args.c), byzfl.Clipping(c=args.c)),
    ]
    print(f"n={args.n} d={args.d} f={args.f} float32, {torch.get_num_threads()} thread(s)")
    cols = ("fedshield", "byzfl", "byzfl+copy")
    head = " ".join(f"{c + ' min/med':>20}" for c in cols)
    print(f"{'rule':5} {head} {'ours/byzfl':>10} {'ours/+copy':>10} {'max rel diff':>12}")
    for name, ours, theirs in cases:
        ours(x, None)  # warm-up
        theirs(x.clone())
        t = timed(lambda a, r=ours: r(a, None), theirs, x, args.repeats)
        best = {k: min(v) for k, v in t.items()}
        cells = " ".join(
            f"{1e3 * best[c]:9.2f}/{1e3 * statistics.median(t[c]):<10.2f}" for c in cols
        )
        a = ours(x, None)[0]
        b = torch.as_tensor(theirs(x.clone()))
        diff = float((a - b).abs().max() / x.abs().max())
        r1 = best["fedshield"] / best["byzfl"]
        r2 = best["fedshield"] / best["byzfl+copy"]
        print(f"{name:5} {cells} {r1:10.2f} {r2:10.2f} {diff:12.2e}")


if __name__ == "__main__":
    main()
