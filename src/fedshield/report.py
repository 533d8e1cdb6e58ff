"""Compare finished runs: tables (CSV + Markdown), pivots, seed intervals and curves.

* Every row shows what its method measures: test accuracy plus the **headline metrics** of
  the run's evaluators (robust accuracies, per-group accuracy, routed accuracy and depth
  saving per policy, communication, privacy ε), found in the final record.
* Runs that share a name are labelled by their run directory.
* Runs that differ only by their seed form one **cell**: the mean of each metric over the
  seeds ± the half-width of its 95 % Student-t interval (``cells.md``; the standard
  deviation is in ``cells.csv``); a one-seed cell shows its value alone. ``±`` means this
  half-width everywhere fedshield prints or renders a table, and each such table says so.
  Curves show the mean and the same interval as a band.
* A comparison over exactly two varying keys (e.g. attack × defense) is also written as a
  pivot table of final accuracy (``pivot.md``).
"""

from __future__ import annotations

import csv
import io
import json
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fedshield.errors import DataError
from fedshield.sim.checkpoint import JsonlLog, atomic_write_text
from fedshield.sim.outputs import (
    detail_keys,
    headline_keys,
    headline_values,
    integer_rounds,
    is_num,
)

COLUMNS = ("name", "rounds", "final_test_acc", "best_test_acc", "best_round", "rounds_to_target")

def load_run(d: Path) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    metrics = d / "metrics.jsonl"
    if not metrics.exists():
        raise DataError(f"{d}: not a fedshield run directory (no metrics.jsonl)")
    records = JsonlLog(metrics).read()
    for i, r in enumerate(records, 1):
        if not isinstance(r, dict) or isinstance(r.get("round"), bool):
            raise DataError(f"{metrics}: line {i} is not a round record (a JSON object)")
        if not isinstance(r.get("round"), int):
            raise DataError(f"{metrics}: line {i} has no integer 'round'")
    summary_path = d / "summary.json"
    if summary_path.exists():
        summary = _read_summary(summary_path)
    else:  # an unfinished run: summarise what is there
        from fedshield.sim.outputs import summarize

        summary = summarize(d.name, records, {})

    summary["out"] = str(d)
    summary.update(headline_values(records))  # also for runs whose summary predates them
    return summary, records


def _read_summary(path: Path) -> dict[str, Any]:
    """A run's ``summary.json``, checked: a JSON object with a string ``name`` (and a
    ``final`` record, when there is one, that is an object)."""
    try:
        summary = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as err:
        raise DataError(f"{path}: malformed JSON ({err})") from None
    except UnicodeDecodeError:
        raise DataError(f"{path}: not a JSON text file (it is not UTF-8 text)") from None
    except OSError as err:
        raise DataError(f"{path}: cannot read the summary ({err.strerror})") from None
    if not isinstance(summary, dict):
        raise DataError(f"{path}: expected a JSON object, got {type(summary).__name__}")
    if not isinstance(summary.get("name"), str):
        raise DataError(f"{path}: not a run summary (no string 'name')")
    if not isinstance(summary.get("final") or {}, dict):
        raise DataError(f"{path}: 'final' is not a JSON object")
    return summary


def fmt(v: Any) -> str:
    if isinstance(v, float):
        return f"{v:.4f}" if math.isfinite(v) else "-"
    return "-" if v is None else str(v)


#: The label of every table with ``±`` cells (one meaning everywhere: see the module doc).
PM_NOTE = "± : half-width of the 95 % Student-t interval over the seeds (n_seeds)"


@dataclass
class TextTable:
    """A table of formatted cells, written as Markdown (files) and printed with rich (the
    console: aligned columns, no raw Markdown wrapped at the terminal's width)."""

    title: str
    columns: list[str]
    rows: list[list[str]]
    note: str = ""

    def markdown(self) -> str:
        lines = ["| " + " | ".join(self.columns) + " |", "|" + "---|" * len(self.columns)]
        lines += ["| " + " | ".join(r) + " |" for r in self.rows]
        return "\n".join(lines) + "\n" + (f"\n{self.note}\n" if self.note else "")

    def rich(self) -> Any:
        """The table for ``console.print``, at whatever width it is printed (transposed,
        split or in long form where it does not fit: :class:`~fedshield.console_table.FitTable`)."""
        from fedshield.console_table import FitTable

        rows: list[list[Any]] = [list(r) for r in self.rows]
        return FitTable(self.title, self.columns, rows, self.note, ("metric", "value"))


def markdown_table(rows: list[dict[str, Any]], columns: Sequence[str] = COLUMNS) -> str:
    return text_table("", rows, columns).markdown()


def text_table(
    title: str, rows: list[dict[str, Any]], columns: Sequence[str], note: str = ""
) -> TextTable:
    """``rows`` (dicts) as a :class:`TextTable` of ``columns``, cells through :func:`fmt`."""
    return TextTable(title, list(columns), [[fmt(r.get(c)) for c in columns] for r in rows], note)


def csv_table(rows: list[dict[str, Any]], columns: Sequence[str] = COLUMNS) -> str:
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=list(columns), extrasaction="ignore")
    w.writeheader()
    w.writerows(rows)
    return buf.getvalue()


def label_runs(summaries: list[dict[str, Any]]) -> None:
    """Give every summary a unique ``label``: its name, or its run directory on a clash."""
    names = [s["name"] for s in summaries]
    for s in summaries:
        clash = names.count(s["name"]) > 1
        s["label"] = s.get("out", s["name"]) if clash else s["name"]


# -- seeds --------------------------------------------------------------------------------
def t_interval(values: Sequence[float]) -> tuple[float, float, float]:
    """(mean, sample std, half-width of the 95 % Student-t interval) of ``values``."""
    n = len(values)
    mean = sum(values) / n
    if n < 2:
        return mean, 0.0, float("nan")
    std = math.sqrt(sum((v - mean) ** 2 for v in values) / (n - 1))
    from scipy.stats import t  # scikit-learn's dependency, always installed

    return mean, std, float(t.ppf(0.975, n - 1)) * std / math.sqrt(n)


def cell_key(params: dict[str, Any]) -> tuple[tuple[str, str], ...]:
    return tuple((k, json.dumps(v)) for k, v in params.items() if k != "seed")


def pm(mean: float, half: float) -> str:
    """A cell's text: ``mean ± h`` (h the 95 % half-width), or the mean alone when there is
    no interval (one seed: no ``± 0.0000``, no ``nan``)."""
    return f"{mean:.4f}" if not math.isfinite(half) else f"{mean:.4f} ± {half:.4f}"


def seed_cells(
    summaries: list[dict[str, Any]], params: list[dict[str, Any]], metrics: Sequence[str]
) -> list[dict[str, Any]]:
    """One row per cell (runs equal but for their seed): n, and per metric its mean, std
    and 95 % interval half-width (``<metric>`` = "mean ± half-width", see :func:`pm`;
    ``<metric>_mean``, ``<metric>_std``, ``<metric>_ci95`` as numbers), the lowest and
    highest seed (``<metric>_min``, ``_max``) and every seed's value (``<metric>_seeds``:
    "seed:value" pairs), so a collapsed seed is never hidden by a mean."""
    groups: dict[Any, list[int]] = {}
    for i, p in enumerate(params):
        groups.setdefault(cell_key(p), []).append(i)
    rows = []
    for key, all_idx in groups.items():
        # parameters as their config text (0.05, not 0.0500; strings unquoted)
        row: dict[str, Any] = {k: v.strip('"') for k, v in key}
        row["n_seeds"] = len(all_idx)
        # A diverged run's last numbers are not a result: the cell names its
        # seeds and its statistics come from the others only.
        bad = [i for i in all_idx if summaries[i].get("status") == "diverged"]
        if bad:
            row["n_diverged"] = len(bad)
            row["diverged_seeds"] = " ".join(str(params[i].get("seed", i)) for i in bad)
        idx = [i for i in all_idx if i not in bad]
        for m in metrics:
            vals = [summaries[i][m] for i in idx if is_num(summaries[i].get(m))]
            row[f"{m}_n"] = len(vals)  # seeds with a value (e.g. that reached the target)
            if not vals:
                continue
            mean, std, half = t_interval(vals)
            row[m] = pm(mean, half)
            row[f"{m}_mean"], row[f"{m}_std"], row[f"{m}_ci95"] = mean, std, half
            row[f"{m}_min"], row[f"{m}_max"] = min(vals), max(vals)
            row[f"{m}_seeds"] = " ".join(
                f"{params[i].get('seed', j)}:{summaries[i][m]:.4g}"
                for j, i in enumerate(idx)
                if is_num(summaries[i].get(m))
            )
        rows.append(row)
    return rows


# -- pivots -------------------------------------------------------------------------------
def pivot_table(
    rows: list[dict[str, Any]],
    row_key: str,
    col_key: str,
    value: str = "final_test_acc",
    title: str = "",
) -> TextTable:
    """A ``row_key × col_key`` table of ``value`` (numbers with 3 decimals). A diverged run,
    or a cell of :func:`seed_cells` with diverged seeds, reads "diverged" (its
    last numbers, or a mean over the other seeds only, are not the cell's result)."""
    rkeys = list(dict.fromkeys(str(r.get(row_key)) for r in rows))
    ckeys = list(dict.fromkeys(str(r.get(col_key)) for r in rows))
    cell = {(str(r.get(row_key)), str(r.get(col_key))): _pivot_value(r, value) for r in rows}
    out = []
    for rk in rkeys:
        vals = [rk]
        for ck in ckeys:
            v = cell.get((rk, ck))
            try:
                f = float(v)  # type: ignore[arg-type]
                vals.append(f"{f:.3f}" if math.isfinite(f) else "-")
            except (TypeError, ValueError):
                vals.append(str(v) if v not in (None, "") else "-")
        out.append(vals)
    return TextTable(title or value, [f"{row_key} \\ {col_key}", *ckeys], out)


def diverged_label(row: dict[str, Any]) -> str:
    """"diverged" for a diverged run, "diverged (seed 1, 2)" for a :func:`seed_cells` cell
    with diverged seeds (numbers or, read back from a CSV, their text), "" otherwise."""
    if row.get("status") == "diverged":
        return "diverged"
    if row.get("n_diverged") not in (None, "", 0, "0"):
        return f"diverged (seed {str(row.get('diverged_seeds', '?')).replace(' ', ', ')})"
    return ""


def _pivot_value(row: dict[str, Any], value: str) -> Any:
    bad = diverged_label(row)
    if not bad:
        return row.get(value)
    rest = row.get(value)
    return f"{bad}; others {rest:.3f}" if bad != "diverged" and is_num(rest) else bad


def pivot(
    rows: list[dict[str, Any]], row_key: str, col_key: str, value: str = "final_test_acc"
) -> str:
    """A ``row_key × col_key`` Markdown table of ``value`` (numbers with 3 decimals)."""
    return pivot_table(rows, row_key, col_key, value).markdown()


def varying_keys(params: list[dict[str, Any]]) -> list[str]:
    """The parameter keys (seed aside) that take more than one value across runs."""
    keys = list(dict.fromkeys(k for p in params for k in p if k != "seed"))
    return [k for k in keys if len({json.dumps(p.get(k)) for p in params}) > 1]


# -- curves -------------------------------------------------------------------------------
def plot_overlay(
    runs: list[tuple[str, list[list[dict[str, Any]]]]], path: Path, key: str = "test_acc"
) -> Path:
    """One curve per entry; an entry with several record lists (seeds) is drawn as their
    mean with its 95 % Student-t interval as a band (the ``±`` of the tables). A run with
    one evaluation point is drawn as a marker."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    fig, ax = plt.subplots(figsize=(7, 4.2))
    banded = False
    for label, seeds in runs:
        series = [{r["round"]: r[key] for r in recs if is_num(r.get(key))} for recs in seeds]
        rounds = sorted(set.intersection(*(set(s) for s in series))) if series else []
        if not rounds:
            continue
        vals = np.array([[s[r] for r in rounds] for s in series])
        mean = vals.mean(0)
        marker = "o" if len(rounds) <= 20 else None
        (line,) = ax.plot(rounds, mean, label=label, marker=marker, markersize=3)
        if len(series) > 1:
            half = np.array([t_interval(list(col))[2] for col in vals.T])
            ax.fill_between(rounds, mean - half, mean + half, alpha=0.2, color=line.get_color())
            banded = True
    ax.set_xlabel("round")
    ax.set_ylabel(key.replace("_", " "))
    integer_rounds(ax)
    if banded:
        ax.set_title("mean over seeds; band: 95 % Student-t interval", fontsize=8)
    ax.grid(alpha=0.3)
    n = len(runs)
    if n:
        # Many runs: the legend goes beside the axes in columns instead of over the curves.
        ncol = 1 if n <= 12 else 2 if n <= 30 else 3
        ax.legend(fontsize=7 if n > 8 else 8, loc="upper left", bbox_to_anchor=(1.01, 1.0),
                  ncol=ncol, frameon=False)  # fmt: skip
    fig.tight_layout()
    fig.savefig(path, dpi=110, bbox_inches="tight")
    plt.close(fig)
    return path


#: The per-round values kept in ``curves.csv`` (the evaluated rounds of every run).
CURVE_KEYS = ("test_acc", "test_loss")


def curves_table(summaries: list[dict[str, Any]], records: list[list[dict[str, Any]]]) -> str:
    """CSV of every run's evaluated rounds (label, round, test accuracy and loss): the
    curves behind accuracy.png, kept as data (a re-run can be compared round by round)."""
    rows = [
        {"label": s["label"], "round": r["round"], **{k: r.get(k) for k in CURVE_KEYS}}
        for s, recs in zip(summaries, records)
        for r in recs
        if is_num(r.get("test_acc"))
    ]
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=["label", "round", *CURVE_KEYS], lineterminator="\n")
    w.writeheader()
    for row in rows:
        w.writerow({k: repr(v) if isinstance(v, float) else v for k, v in row.items()})
    return buf.getvalue()


# -- the comparison -----------------------------------------------------------------------
@dataclass
class Comparison:
    """What :func:`compare_runs` wrote: the runs' summaries, the curves, and the tables
    beyond the per-run one (cells over seeds, a pivot) for the console to print."""

    summaries: list[dict[str, Any]]
    png: Path
    out: Path
    tables: list[TextTable] = field(default_factory=list)


def compare_runs(
    dirs: list[Path], out: Path, extra: list[dict[str, Any]] | None = None
) -> Comparison:
    """Write comparison.md/.csv, curves.csv and accuracy.png for ``dirs`` (plus cells.md/.csv
    with seed intervals, and pivot.md for two varying keys). ``extra`` adds per-run columns (a
    sweep's parameters)."""
    from fedshield.sim.rundir import check_out_dir

    check_out_dir(out)
    loaded = [load_run(d) for d in dirs]
    out.mkdir(parents=True, exist_ok=True)
    summaries = [s for s, _ in loaded]
    label_runs(summaries)
    params = extra or [{} for _ in summaries]
    for s, e in zip(summaries, params):
        s.update(e)
    heads = headline_keys(summaries)
    finals: list[dict[str, Any]] = [
        f if isinstance(f := s.get("final"), dict) else {} for s in summaries
    ]
    details = detail_keys(finals)
    for s, f in zip(summaries, finals):
        s.update({k: f[k] for k in details if k in f and k not in s})
    keys = [k for k in dict.fromkeys(k for p in params for k in p)]
    keys = [k for k in keys if k != "variant" or any(p.get("variant") for p in params)]
    status = ["status"] if any(s.get("status") == "diverged" for s in summaries) else []
    columns = ("label", *keys, *COLUMNS[1:], *status, *heads)
    atomic_write_text(out / "comparison.md", markdown_table(summaries, columns))
    atomic_write_text(out / "comparison.csv", csv_table(summaries, (*columns, *details)))
    atomic_write_text(out / "curves.csv", curves_table(summaries, [r for _, r in loaded]))
    tables: list[TextTable] = []
    seeded = any("seed" in p for p in params)
    if seeded:
        metrics = ["final_test_acc", "best_test_acc", "rounds_to_target", *heads]
        cells = seed_cells(summaries, params, [*metrics, *details])
        ckeys = [k for k in keys if k != "seed"]
        cols = (*ckeys, "n_seeds", *[m for m in metrics if any(m in c for c in cells)])
        if any("n_diverged" in c for c in cells):
            cols = (*cols, "n_diverged", "diverged_seeds")
        table = text_table("cells (mean over seeds)", cells, cols, PM_NOTE)
        atomic_write_text(out / "cells.md", table.markdown())
        tables.append(table)
        # The CSV also keeps the numbers apart (mean, std, interval) for tools to read.
        stats = ("mean", "std", "ci95", "n", "min", "max", "seeds")
        nums = [f"{m}_{x}" for m in [*metrics, *details] for x in stats]
        nums = [k for k in nums if any(k in c for c in cells)]
        atomic_write_text(out / "cells.csv", csv_table(cells, (*cols, *nums)))
    vary = varying_keys(params)
    if len(vary) == 2:
        rows = seed_cells(summaries, params, ["final_test_acc"]) if seeded else summaries
        value = "final_test_acc_mean" if seeded else "final_test_acc"
        title = "final_test_acc" + (" (mean over seeds)" if seeded else "")
        table = pivot_table(rows, vary[0], vary[1], value, title)
        atomic_write_text(out / "pivot.md", table.markdown())
        tables.append(table)
    curves: dict[Any, tuple[str, list[list[dict[str, Any]]]]] = {}
    for (s, recs), p in zip(loaded, params):
        key = cell_key(p) if seeded else s["label"]
        label = s["label"] if not seeded else "_".join(f"{v}" for k, v in cell_key(p))
        label = label.replace('"', "").strip("_") or s["name"]
        curves.setdefault(key, (label, []))[1].append(recs)
    png = plot_overlay(list(curves.values()), out / "accuracy.png")
    return Comparison(summaries, png, out, tables)
