"""Compare finished runs: one table (CSV + Markdown) and accuracy curves overlaid in one PNG."""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path
from typing import Any

from fedshield.errors import DataError
from fedshield.sim.checkpoint import JsonlLog, atomic_write_text

COLUMNS = ("name", "rounds", "final_test_acc", "best_test_acc", "best_round", "rounds_to_target")


def load_run(d: Path) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    metrics = d / "metrics.jsonl"
    if not metrics.exists():
        raise DataError(f"{d}: not a fedshield run directory (no metrics.jsonl)")
    records = JsonlLog(metrics).read()
    summary_path = d / "summary.json"
    if summary_path.exists():
        summary = json.loads(summary_path.read_text())
    else:  # an unfinished run: summarise what is there
        from fedshield.sim.outputs import summarize

        summary = summarize(d.name, records, {})
    summary["out"] = str(d)
    return summary, records


def markdown_table(rows: list[dict[str, Any]], columns: tuple[str, ...] = COLUMNS) -> str:
    def fmt(v: Any) -> str:
        return f"{v:.4f}" if isinstance(v, float) else ("-" if v is None else str(v))

    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join(fmt(r.get(c)) for c in columns) + " |" for r in rows]
    return "\n".join(lines) + "\n"


def csv_table(rows: list[dict[str, Any]], columns: tuple[str, ...] = COLUMNS) -> str:
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=list(columns), extrasaction="ignore")
    w.writeheader()
    w.writerows(rows)
    return buf.getvalue()


def plot_overlay(
    runs: list[tuple[str, list[dict[str, Any]]]], path: Path, key: str = "test_acc"
) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.5, 4))
    for label, records in runs:
        pts = [(r["round"], r[key]) for r in records if key in r]
        if pts:
            ax.plot(*zip(*pts), label=label)
    ax.set_xlabel("round")
    ax.set_ylabel(key.replace("_", " "))
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def compare_runs(
    dirs: list[Path], out: Path, extra: list[dict[str, Any]] | None = None
) -> tuple[list[dict[str, Any]], Path]:
    """Write comparison.md/.csv and accuracy.png for ``dirs``; ``extra`` adds per-run columns
    (a sweep's parameters)."""
    loaded = [load_run(d) for d in dirs]
    out.mkdir(parents=True, exist_ok=True)
    summaries = [s for s, _ in loaded]
    columns = COLUMNS
    if extra:
        for s, e in zip(summaries, extra):
            s.update(e)
        keys = [k for k in extra[0] if k != "variant" or any(e.get("variant") for e in extra)]
        columns = ("name", *keys, *COLUMNS[1:])
    atomic_write_text(out / "comparison.md", markdown_table(summaries, columns))
    atomic_write_text(out / "comparison.csv", csv_table(summaries, columns))
    png = plot_overlay([(s["name"], r) for s, r in loaded], out / "accuracy.png")
    return summaries, png
