"""Run outputs (SPEC §11): summary.json, plots, report.md."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from fedshield.sim.checkpoint import atomic_write_text, dumps


def _num(v: Any) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool) and v == v


#: Record keys whose non-finite value (NaN, ±inf; ``null`` once written as strict JSON)
#: means the run diverged: the training loss and the test loss and accuracy.
DIVERGENCE_KEYS = ("train/loss", "test_loss", "test_acc")


def nonfinite_keys(record: dict[str, Any]) -> list[str]:
    """The :data:`DIVERGENCE_KEYS` of ``record`` that are present but not finite numbers."""
    out = []
    for key in DIVERGENCE_KEYS:
        if key not in record:
            continue
        v = record[key]
        if not (_num(v) and math.isfinite(v)):
            out.append(key)
    return out


def divergence(records: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The first round whose loss or accuracy is non-finite, with those keys (None: none)."""
    for r in records:
        bad = nonfinite_keys(r)
        if bad:
            return {"round": r.get("round"), "keys": bad}
    return None


def describe_divergence(summary: dict[str, Any]) -> str:
    """One line for a diverged run's summary (``status == "diverged"``)."""
    keys = ", ".join(summary.get("diverged_keys", [])) or "a metric"
    return (
        f"run {summary.get('name')!r} diverged: {keys} non-finite at round "
        f"{summary.get('diverged_round')} (summary.json: status = \"diverged\")"
    )


def summarize(name: str, records: list[dict[str, Any]], extra: dict[str, Any]) -> dict[str, Any]:
    """A run's summary from its records. ``status``: ``"diverged"`` (with
    ``diverged_round`` and ``diverged_keys``) once a loss or accuracy turned non-finite,
    else ``"ok"``. Final/best values come from the rounds with a finite accuracy."""
    evals = [r for r in records if _num(r.get("test_acc"))]
    summary: dict[str, Any] = {"name": name, "rounds": records[-1]["round"] if records else 0}
    if evals:
        best = max(evals, key=lambda r: r["test_acc"])
        loss = evals[-1].get("test_loss")  # a record may come without a loss (report)
        summary.update(
            final_test_acc=evals[-1]["test_acc"],
            final_test_loss=loss if _num(loss) else None,
            best_test_acc=best["test_acc"],
            best_round=best["round"],
        )
    div = divergence(records)
    summary["status"] = "ok" if div is None else "diverged"
    if div is not None:
        summary.update(diverged_round=div["round"], diverged_keys=div["keys"])
    summary["final"] = records[-1] if records else {}
    summary.update(headline_values(records))
    summary.update(extra)
    return summary


def headline_values(records: list[dict[str, Any]]) -> dict[str, Any]:
    """The evaluators' headline metrics (``report.HEADLINE``) of a run: each from the last
    record holding it, since an evaluator appears only in the rounds it ran."""
    from fedshield.report import headline_keys

    latest: dict[str, Any] = {}
    for r in records:
        latest.update({k: v for k, v in r.items() if _num(v)})
    return {k: latest[k] for k in headline_keys([latest])}


def rounds_to(records: list[dict[str, Any]], target: float) -> int | None:
    """First round whose test accuracy reaches ``target`` (None if never)."""
    for r in records:
        if _num(r.get("test_acc")) and r["test_acc"] >= target:
            return int(r["round"])
    return None


def plot_curves(records: list[dict[str, Any]], out: Path, title: str) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from fedshield.report import integer_rounds

    evals = [r for r in records if _num(r.get("test_acc"))]
    if not evals:
        return []
    rounds = [r["round"] for r in evals]
    paths = []
    for key, label in (("test_acc", "test accuracy"), ("test_loss", "test loss")):
        fig, ax = plt.subplots(figsize=(5, 3.5))
        values = [r[key] if _num(r.get(key)) else float("nan") for r in evals]
        ax.plot(rounds, values, marker="o" if len(rounds) < 50 else None)
        ax.set_xlabel("round")
        ax.set_ylabel(label)
        integer_rounds(ax)
        ax.set_title(title)
        ax.grid(alpha=0.3)
        fig.tight_layout()
        path = out / f"{key}.png"
        fig.savefig(path, dpi=110)
        plt.close(fig)
        paths.append(path)
    return paths


def write_report(out: Path, summary: dict[str, Any], config_text: str) -> None:
    lines = [f"# {summary['name']}", ""]
    from fedshield.report import headline_keys

    keys = ("rounds", "final_test_acc", "best_test_acc", "best_round", "rounds_to_target")
    for key in (*keys, *headline_keys([summary])):
        if key in summary:
            val = summary[key]
            lines.append(
                f"- **{key}**: {val:.4f}" if isinstance(val, float) else f"- **{key}**: {val}"
            )
    lines += [
        "",
        "![accuracy](test_acc.png)",
        "",
        "## Config",
        "",
        "```toml",
        config_text,
        "```",
        "",
    ]
    atomic_write_text(out / "report.md", "\n".join(lines))
    atomic_write_text(out / "summary.json", dumps(summary, indent=2) + "\n")
