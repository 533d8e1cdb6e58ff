"""Per-run curves of a bench: ``curves-<defense>.png``, drawn from the run folders'
``metrics.csv`` alone.

One figure per defense; a column per setting (share × heterogeneity × fault × mode), a
row per metric present — test accuracy, test loss, and the backdoor attack success rate
where a backdoor attack ran — and a line per attack at the candidate the protocol chose
for that defense and setting: the mean over the seeds, with a band of ± one standard
deviation across them (as ByzFL's benchmark plots accuracy over rounds). A run that
diverged stops where its metrics stop; its attack is marked "diverged" in the legend.
"""

from __future__ import annotations

import csv
import math
import statistics
from pathlib import Path
from typing import Any

from fedshield.bench.plan import Plan
from fedshield.bench.runner import METRICS, run_dir
from fedshield.bench.select import Choice

#: (metrics.csv column, axis label), in row order; a row is drawn when any run has it.
ROWS = (("test_acc", "test accuracy"), ("test_loss", "test loss"),
        ("backdoor/asr", "backdoor ASR"))  # fmt: skip


def read_metrics(path: Path) -> dict[str, dict[int, float]]:
    """``metrics.csv`` as column → {round: value} (blank cells left out)."""
    out: dict[str, dict[int, float]] = {}
    try:
        with path.open(newline="") as fh:
            for row in csv.DictReader(fh):
                rnd = int(row.pop("round"))
                for k, v in row.items():
                    if v not in ("", None):
                        out.setdefault(k, {})[rnd] = float(v)
    except (OSError, ValueError, KeyError):
        return {}
    return out


def band(series: list[dict[int, float]]) -> tuple[list[int], list[float], list[float]]:
    """Rounds, mean and standard deviation over the seeds' finite values at each round
    (sd 0 with one seed)."""
    rounds = sorted({r for s in series for r in s})
    xs, mean, sd = [], [], []
    for r in rounds:
        vals = [s[r] for s in series if r in s and math.isfinite(s[r])]
        if vals:
            xs.append(r)
            mean.append(statistics.fmean(vals))
            sd.append(statistics.stdev(vals) if len(vals) > 1 else 0.0)
    return xs, mean, sd


def curves(plan: Plan, choices: list[Choice], out: Path) -> dict[str, Path]:
    """``curves-<defense>.png`` for every defense with a choice (see the module docstring)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    from fedshield.bench.render import axes_of, column

    runs: dict[tuple[str, Any, int, str], list[str]] = {}
    for r in plan.runs:
        runs.setdefault((r.defense, r.setting, r.tune, r.attack), []).append(r.id)
    attacks = [a.key for a in plan.spec.attacks]
    colours = plt.get_cmap("tab10" if len(attacks) <= 10 else "tab20")
    axes = axes_of(plan.settings)
    files: dict[str, Path] = {}
    for d in [x.key for x in plan.spec.defenses]:
        mine = [c for c in choices if c.defense == d]
        if not mine:
            continue
        data = {(c.setting, a): [read_metrics(run_dir(out, i) / METRICS)
                                 for i in runs.get((d, c.setting, c.tune, a), [])]
                for c in mine for a in attacks}  # fmt: skip
        rows = [(k, label) for k, label in ROWS
                if any(k in m for ms in data.values() for m in ms)]  # fmt: skip
        if not rows:
            continue
        fig, axs = plt.subplots(len(rows), len(mine), figsize=(0.6 + 3.4 * len(mine),
                                0.4 + 2.3 * len(rows)), squeeze=False, sharex=True)  # fmt: skip
        for j, c in enumerate(mine):
            for i, (key, label) in enumerate(rows):
                ax = axs[i][j]
                for n, a in enumerate(attacks):
                    series = [m[key] for m in data[c.setting, a] if key in m]
                    if not series:
                        continue
                    xs, mean, sd = band(series)
                    diverged = c.cells[a].is_diverged
                    name = f"{a} (diverged: ×)" if diverged else a
                    ax.plot(xs, mean, color=colours(n), lw=1.3, label=name, marker=".", ms=3)
                    if diverged and xs:  # where the last finite value was seen
                        ax.plot(xs[-1:], mean[-1:], color=colours(n), marker="x", ms=8, mew=2)
                    ax.fill_between(xs, [m - s for m, s in zip(mean, sd)],
                                    [m + s for m, s in zip(mean, sd)], color=colours(n),
                                    alpha=0.2, lw=0)  # fmt: skip
                if key != "test_loss":
                    ax.set_ylim(-0.02, 1.02)
                if j == 0:
                    ax.set_ylabel(label)
                if i == 0:
                    title = column(c.setting, axes)
                    ax.set_title(f"{title} ({plan.tune_label(c.tune)})", fontsize=8)
                if i == len(rows) - 1:
                    ax.set_xlabel("round")
                    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
                ax.grid(alpha=0.3)
        seeds = len(plan.spec.seeds)
        note = f"mean ± sd over {seeds} seeds" if seeds > 1 else "1 seed"
        fig.suptitle(f"{d}: per attack, at the chosen hyper-parameters ({note})", fontsize=9)
        handles, labels = axs[0][0].get_legend_handles_labels()
        for row in axs:
            for ax in row:
                for h, lab in zip(*ax.get_legend_handles_labels()):
                    if lab not in labels:
                        handles.append(h)
                        labels.append(lab)
        fig.legend(handles, labels, loc="center left", bbox_to_anchor=(1.0, 0.5), fontsize=8,
                   title="attack")  # fmt: skip
        fig.tight_layout()
        path = out / f"curves-{d}.png"
        fig.savefig(path, dpi=110, bbox_inches="tight")
        plt.close(fig)
        files[f"curves-{d}"] = path
    return files


__all__ = ["band", "curves", "read_metrics"]
