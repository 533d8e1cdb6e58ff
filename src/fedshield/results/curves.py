"""Curves over rounds with a band across seeds, from a sweep's per-run budget file.

    fedshield results curves docs/results/data/fedcart-methods-t150-cpu-budget.csv \
        --metrics robust/natural,robust/worst,groups/minority/natural \
        --out docs/results/figures/fedcart-t150.png [--budgets 20,40,80,150]

One panel per metric; per variant (``--by``, default ``variant``) the mean over the seeds
at each evaluated round, with the band from the lowest to the highest seed (a collapsed
seed shows; the paired verdicts per budget are ``paired=A,B by=round`` blocks on the same
file, :mod:`fedshield.results.render`). The budgets named by ``--budgets`` are marked. The
figure's corner names the file it was drawn from, so a reader can find the data.
"""

from __future__ import annotations

import argparse
import csv
import math
import sys
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path


def series(
    rows: Sequence[dict[str, str]], metric: str, by: str
) -> dict[str, list[tuple[int, float, float, float, int]]]:
    """Per value of ``by``: (round, mean, min, max, n) over the runs (seeds) with a finite
    value of ``metric`` at that round, sorted by round."""
    acc: dict[str, dict[int, list[float]]] = defaultdict(lambda: defaultdict(list))
    for r in rows:
        try:
            v = float(r.get(metric, ""))
        except ValueError:
            continue
        if math.isfinite(v):
            acc[r.get(by, "")][int(r["round"])].append(v)
    return {
        key: [(rnd, sum(vs) / len(vs), min(vs), max(vs), len(vs)) for rnd, vs in sorted(d.items())]
        for key, d in acc.items()
    }


def draw(
    source: Path, metrics: Sequence[str], out: Path, by: str = "variant",
    budgets: Sequence[int] = (),
) -> Path:  # fmt: skip
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = list(csv.DictReader(source.open()))
    missing = [m for m in metrics if not rows or m not in rows[0]]
    if missing:
        raise SystemExit(f"error: {source}: no column {', '.join(missing)}")
    fig, axes = plt.subplots(1, len(metrics), figsize=(4.2 * len(metrics), 3.4), squeeze=False)
    for ax, metric in zip(axes[0], metrics):
        for key, pts in sorted(series(rows, metric, by).items()):
            x = [p[0] for p in pts]
            n = max(p[4] for p in pts)
            (line,) = ax.plot(x, [p[1] for p in pts], marker=".", label=f"{key} (n = {n})")
            ax.fill_between(x, [p[2] for p in pts], [p[3] for p in pts], alpha=0.2,
                            color=line.get_color())  # fmt: skip
        for b in budgets:
            ax.axvline(b, color="0.8", lw=0.8, zorder=0)
        ax.set_title(metric, fontsize=9)
        ax.set_xlabel("round")
        ax.grid(alpha=0.3)
    axes[0][0].set_ylabel("accuracy")
    axes[0][0].legend(fontsize=8)
    fig.suptitle(f"mean over seeds; band: lowest to highest seed — {source.name}", fontsize=8)
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out


def main(args: argparse.Namespace) -> int:
    """``fedshield results curves`` (its arguments: :mod:`fedshield.results.__main__`)."""
    if not args.source.is_file():
        print(f"error: {args.source}: no such file", file=sys.stderr)
        return 2
    try:
        budgets = [int(b) for b in args.budgets.split(",") if b]
    except ValueError:
        print(f"error: --budgets {args.budgets!r}: expected rounds like 20,40,80", file=sys.stderr)
        return 2
    metrics = [m for m in args.metrics.split(",") if m]
    print(draw(args.source, metrics, args.out, args.by, budgets))
    return 0
