"""Paired per-seed comparison of two variants of a sweep (every verdict names its
seeds, its paired test, and "undecided" where the interval covers zero: docs/results/fedcart.md).

Input: a sweep's per-run ``comparison.csv`` (columns ``variant``, ``seed`` and the metrics;
``docs/results/data/<grid>.csv``). For each metric, the runs of variant A and variant B are
paired by seed (and by every other column named in ``by``, e.g. ``data.long_tail.rho``);
with d_s = A_s − B_s over the n seeds both have (the rendered block tests each value of
``by`` on its own: one row per metric and value):

* mean d̄ and the 95 % Student-t interval d̄ ± t_{0.975, n−1} · sd(d) / √n;
* the two-sided exact sign test: P(at least as lopsided a split of the non-zero d_s under
  Binomial(n', ½)) (``scipy.stats.binomtest``; ties d_s = 0 are dropped, as usual);
* the verdict: "A ahead" / "B ahead" when the interval excludes zero, "undecided" when it
  covers it (or n < 2, or two seeds with the same difference up to float32 rounding: a
  zero-width interval).

Differences are shown in points (×100) by default (``scale=100``). A diverged run (an empty
metric) leaves its seed out of that metric's pairs, and the table says how many seeds were
paired. Used by :mod:`fedshield.results.render` (block option ``paired=A,B``; ``source`` may list
several comparison files of disjoint seeds, comma-separated; ``variant=COLUMN`` names the
column that holds the variants, ``variant`` by default — ``variant=defense`` pairs two
defenses of a bench's ``runs.csv``, with ``where=`` keeping one attack; ``variant=@metric``
pairs two metrics of the same runs instead, A and B filling the ``{}`` of each ``value``:
``paired=robust,fixed variant=@metric value=route/{}/acc`` is route/robust/acc −
route/fixed/acc per run) and as a command:

    fedshield results paired docs/results/data/fedcart-methods-cpu.csv fedcart calfat \\
        robust/worst robust/natural groups/minority/natural
"""

from __future__ import annotations

import argparse
import csv
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from scipy import stats

#: ``variant=`` value that pairs two metrics of the same runs (``value=`` names hold ``{}``)
METRIC_PAIRS = "@metric"
#: the column a source's label fills (``labels=``), grouped by like a ``by`` key
SOURCE = "@source"


@dataclass(frozen=True)
class Paired:
    """One metric's paired comparison: the seeds, their differences A − B and the tests."""

    metric: str
    seeds: list[str]
    diffs: list[float]
    mean: float
    half: float  # half-width of the 95 % t interval (nan for n < 2)
    wins_a: int
    wins_b: int
    sign_p: float  # two-sided exact sign test (1.0 when no non-zero difference)
    #: Differences closer than this are equal: a few float32 ulps of the paired values
    #: (times the scale), the precision the metrics are logged at.
    resolution: float = 0.0
    #: +1: a higher value is better (accuracy); -1: lower is better (rounds to a target),
    #: so a negative difference makes A ahead
    better: int = 1

    @property
    def verdict(self) -> str:
        # Two seeds that differ by the same amount give a zero-width interval: that is no
        # evidence (the sign test's p is 0.5), so it stays undecided. "The same" up to the
        # float32 rounding of the logged metrics (0.4575 is stored as 0.45750001...).
        spread = max(self.diffs, default=0.0) - min(self.diffs, default=0.0)
        degenerate = len(self.diffs) < 3 and spread <= self.resolution
        if len(self.diffs) < 2 or not math.isfinite(self.half) or degenerate:
            return "undecided"
        gain = self.better * self.mean  # A's advantage, in the metric's good direction
        if gain - self.half > 0:
            return "A ahead"
        if gain + self.half < 0:
            return "B ahead"
        return "undecided"


def _float(v: str | None) -> float | None:
    try:
        x = float(v)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return None
    return x if math.isfinite(x) else None


def paired(
    rows: Sequence[dict[str, str]],
    a: str,
    b: str,
    metric: str,
    by: Sequence[str] = (),
    scale: float = 1.0,
    column: str = "variant",
    better: int = 1,
    worst: str | None = None,
) -> Paired:
    """d_s = scale · (A_s − B_s) for every key (seed, *by) that both variants (values of
    ``column``) ran to a finite value of ``metric``; mean, 95 % t half-width, sign counts
    and sign test. ``column = "@metric"``: every row is a run of both, A's value in the
    metric named ``metric`` with A in place of its ``{}``, B's likewise. ``better = -1``:
    lower values are better, so A's wins are its negative differences. ``worst = KEY``:
    each side's value for a key is its worst over the runs that differ in column KEY (the
    worst case over attacks, per seed), and a key counts only where both sides ran every
    value of KEY that either ran, each to a finite value (a run with no value could be the
    worst: its seed is left out, not judged on the others)."""
    by_metric = column == METRIC_PAIRS
    if by_metric and "{}" not in metric:
        raise ValueError(f"variant=@metric: the value {metric!r} has no {{}} for {a} and {b}")

    def table(variant: str) -> dict[tuple[str, ...], dict[str, float | None]]:
        out: dict[tuple[str, ...], dict[str, float | None]] = {}
        for r in rows:
            if not by_metric and r.get(column) != variant:
                continue
            v = _float(r.get(metric.replace("{}", variant) if by_metric else metric))
            if v is None and worst is None:
                continue
            key = (r["seed"], *(r.get(k, "") for k in by))
            inner = r.get(worst, "") if worst else ""
            runs = out.setdefault(key, {})
            if inner in runs:
                raise ValueError(f"{variant}: two runs for seed/keys {(*key, inner)}")
            runs[inner] = v
        return out

    def value(runs: dict[str, float | None]) -> float:
        pick = min if better > 0 else max  # the worst for the metric's direction
        return pick(v for v in runs.values() if v is not None)  # all finite: complete()

    def complete(ra: dict[str, float | None], rb: dict[str, float | None]) -> bool:
        return set(ra) == set(rb) and all(v is not None for v in (*ra.values(), *rb.values()))

    runs_a, runs_b = table(a), table(b)
    shared = [k for k in set(runs_a) & set(runs_b) if complete(runs_a[k], runs_b[k])]
    ta = {k: value(runs_a[k]) for k in shared}
    tb = {k: value(runs_b[k]) for k in shared}
    keys = sorted(shared, key=lambda k: (*k[1:], int(k[0])))
    diffs = [scale * (ta[k] - tb[k]) for k in keys]
    n = len(diffs)
    mean = sum(diffs) / n if n else float("nan")
    if n >= 2:
        sd = math.sqrt(sum((d - mean) ** 2 for d in diffs) / (n - 1))
        half = float(stats.t.ppf(0.975, n - 1)) * sd / math.sqrt(n)
    else:
        half = float("nan")
    seeds = ["/".join(k) for k in keys]
    values = [abs(t[k]) for k in keys for t in (ta, tb)]
    resolution = 4 * 2.0**-23 * abs(scale) * max([1.0, *values])
    # a difference within the float32 rounding of the logged values is a tie, not a win
    wins_a = sum(better * d > resolution for d in diffs)
    wins_b = sum(better * d < -resolution for d in diffs)
    sign_p = float(stats.binomtest(wins_a, wins_a + wins_b, 0.5).pvalue) if wins_a + wins_b else 1.0
    return Paired(metric, seeds, diffs, mean, half, wins_a, wins_b, sign_p, resolution, better)


def render_rows(results: Sequence[Paired], a: str, b: str, digits: int = 1) -> list[str]:
    """A Markdown table: one line per metric, every seed's difference listed."""
    head = (
        f"| metric | seeds | {a} − {b}: mean ± h | per seed | {a} ahead / {b} ahead "
        "| sign test p | verdict |"
    )
    lines = [head, "|---" * 7 + "|"]
    for r in results:
        n = len(r.diffs)
        cell = (
            "-"
            if not n
            else f"{r.mean:+.{digits}f}"
            if not math.isfinite(r.half)
            else f"{r.mean:+.{digits}f} ± {r.half:.{digits}f}"
        )
        seeds = f"{n} ({', '.join(r.seeds)})" if n else "0"
        per = ", ".join(f"{s}: {d:+.{digits}f}" for s, d in zip(r.seeds, r.diffs))
        verdict = {"A ahead": f"{a} ahead", "B ahead": f"{b} ahead"}.get(r.verdict, r.verdict)
        lines.append(
            f"| {r.metric} | {seeds} | {cell} | {per} "
            f"| {r.wins_a} / {r.wins_b} | {r.sign_p:.3f} | {verdict} |"
        )
    return lines


#: The label under a rendered paired table.
PAIRED_NOTE = (
    "Paired by seed: mean of the per-seed differences ± half-width of its 95 % Student-t "
    "interval; sign test: two-sided exact binomial test on the signs (ties dropped); "
    '"undecided" when the interval covers zero.'
)


def _groups(rows: Sequence[dict[str, str]], by: Sequence[str]) -> list[tuple[str, ...]]:
    """The distinct values of the ``by`` columns, numbers in numeric order."""

    def order(v: str) -> tuple[int, float, str]:
        x = _float(v)
        return (0, x, "") if x is not None else (1, 0.0, v)

    found = {tuple(r.get(k, "") for k in by) for r in rows}
    return sorted(found, key=lambda g: [order(v) for v in g])


def _read(source: Path) -> list[dict[str, str]]:
    return list(csv.DictReader(source.open()))


def render_paired(
    opts: dict[str, str],
    root: Path,
    read: Callable[[Path], list[dict[str, str]]] = _read,
) -> str:
    """The block ``source=<comparison.csv>[,<comparison.csv>...] paired=A,B value=m1,m2
    [by=k1,k2] [variant=COLUMN] [scale=100] [digits=1] [better=lower]`` of
    :mod:`fedshield.results.render` (``better=lower``: a metric where less is better, such
    as rounds to a target; ``worst=KEY``: each seed's worst over KEY, e.g. over attacks).
    Several sources (sweeps of disjoint seeds) are pooled; a (variant, seed) in two of them
    is an error. ``labels=L1,L2,...`` (one per source) keeps each source apart instead: its
    rows are tested on their own, tagged with the label (one sweep per Byzantine share).
    ``read`` loads one source (render passes its ``where=`` filter)."""
    rows: list[dict[str, str]] = []
    names = opts["source"].split(",")
    labels = opts["labels"].split(",") if "labels" in opts else None
    if labels is not None and len(labels) != len(names):
        raise SystemExit(f"labels={opts['labels']}: one label per source ({len(names)})")
    for i, name in enumerate(names):
        source = root / name
        if not source.exists():
            raise SystemExit(f"{name}: no such result file")
        part = read(source)
        if labels is not None:  # each source its own group, named by its label
            part = [{**r, SOURCE: labels[i]} for r in part]
        rows += part
    a, b = opts["paired"].split(",")
    by = [SOURCE] * (labels is not None) + [k for k in opts.get("by", "").split(",") if k]
    worst = opts.get("worst")
    column = opts.get("variant", "variant")
    scale = float(opts.get("scale", "100"))
    better = {"higher": 1, "lower": -1}.get(opts.get("better", "higher"))
    if better is None:
        raise SystemExit(f"better={opts['better']}: 'higher' or 'lower'")
    results = []
    for group in _groups(rows, by):  # one test per value of the ``by`` keys
        sub = [r for r in rows if tuple(r.get(k, "") for k in by) == group]
        named = [v if k == SOURCE else f"{k}={v}" for k, v in zip(by, group)]
        tag = " @ " + ", ".join(named) if by else ""
        for m in opts["value"].split(","):
            res = paired(sub, a, b, m, scale=scale, column=column, better=better, worst=worst)
            label = f"worst {m} over {worst}" if worst else m
            results.append(replace(res, metric=label + tag))
    lines = render_rows(results, a, b, int(opts.get("digits", "1")))
    return "\n".join(lines) + f"\n\n{PAIRED_NOTE}\n"


def main(args: argparse.Namespace) -> int:
    """``fedshield results paired SOURCE A B METRIC...``: the table, as a block renders it."""
    opts = {"source": args.source, "paired": f"{args.a},{args.b}", "value": ",".join(args.metrics)}
    print(render_paired(opts, Path.cwd()), end="")
    return 0
