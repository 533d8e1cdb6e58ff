"""Run outputs (docs/usage.md): summary.json, plots, report.md."""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from fedshield.sim.checkpoint import atomic_write_text, dumps

#: Final-record keys shown next to test accuracy when a run has them (evaluator outputs).
HEADLINE = (
    r"robust/(natural|fgsm|pgd20|cw|aa|avg|worst)",
    r"groups/(majority|medium|minority)/(natural|pgd20|worst)",
    r"route/[a-z_]+/(acc|depth_saving)",
    r"route_local/[a-z_]+/(mean_acc|worst_acc)",
    r"route_adv/(fgsm|pgd)/[0-9.e+-]+/(fixed|robust|full)/acc",
    r"client/(mean_acc|worst_acc)",
    r"privacy/epsilon",
    r"comm/cum_gib",
)
_HEADLINE_RE = re.compile("^(" + "|".join(HEADLINE) + ")$")

#: Per-round counters of what the server's defenses did, summed over the run into
#: summary.json's ``events`` (and shown by report.md and the console): uploads rejected,
#: and each cross-round defense's acts (docs/cross-round.md).
EVENTS = (
    r"sys/rejected",
    r"defense/[a-z_]+/(duplicates|flagged|suspended|filled|cached|clipped_blocks|reset)",
)
_EVENTS_RE = re.compile("^(" + "|".join(EVENTS) + ")$")

#: Final-record keys kept in a comparison's CSV files only (comparison.csv, cells.csv), for
#: the result documents: per-exit accuracy and the routing risk decomposition (early-exit ViT
#: paper).
DETAIL = (
    r"route/exit/[0-9]+/acc",
    r"route/[a-z_]+/exit/[0-9]+/(deferral_gain|frac)",
    r"route_adv/(fgsm|pgd)/[0-9.e+-]+/exit/[0-9]+/acc",
    r"route_adv/(fgsm|pgd)/[0-9.e+-]+/[a-z_]+/exit/[0-9]+/deferral_gain",
)
_DETAIL_RE = re.compile("^(" + "|".join(DETAIL) + ")$")


def headline_keys(finals: Sequence[dict[str, Any]]) -> list[str]:
    """The headline keys present in any of the final records, in a stable order."""
    keys = {k for f in finals for k, v in f.items() if _HEADLINE_RE.match(k) and is_num(v)}
    order = {p: i for i, p in enumerate(HEADLINE)}

    def rank(k: str) -> tuple[int, str]:
        i = next(order[p] for p in HEADLINE if re.match(f"^({p})$", k))
        return i, k

    return sorted(keys, key=rank)


def event_totals(records: Sequence[dict[str, Any]]) -> dict[str, float]:
    """The :data:`EVENTS` counters summed over ``records`` (a zero says the defense ran and
    never acted)."""
    out: dict[str, float] = {}
    for r in records:
        for k, v in r.items():
            if _EVENTS_RE.match(k) and is_num(v) and math.isfinite(v):
                out[k] = out.get(k, 0.0) + float(v)
    return dict(sorted(out.items()))


def shown_events(summary: dict[str, Any]) -> dict[str, float]:
    """The ``events`` report.md and the console show: an attacked run's, or any run's where
    a defense acted (not "sys/rejected 0" on every clean run)."""
    events: dict[str, float] = summary.get("events") or {}
    return events if summary.get("attack") or any(events.values()) else {}


def detail_keys(finals: Sequence[dict[str, Any]]) -> list[str]:
    """The ``DETAIL`` keys present in any of the final records, sorted."""
    return sorted({k for f in finals for k, v in f.items() if _DETAIL_RE.match(k) and is_num(v)})


def is_num(v: Any) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool) and v == v


def integer_rounds(ax: Any) -> None:
    """Round axes tick at whole rounds only (matplotlib would label 2.5 on a short run)."""
    from matplotlib.ticker import MaxNLocator

    ax.xaxis.set_major_locator(MaxNLocator(integer=True))


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
        f'{summary.get("diverged_round")} (summary.json: status = "diverged")'
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
    events = event_totals(records)
    if events:
        summary["events"] = events
    summary.update(headline_values(records))
    summary.update(extra)
    return summary


def headline_values(records: list[dict[str, Any]]) -> dict[str, Any]:
    """The evaluators' headline metrics (``HEADLINE``) of a run: each from the last
    record holding it, since an evaluator appears only in the rounds it ran."""

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

    keys = ("rounds", "final_test_acc", "best_test_acc", "best_round", "rounds_to_target")
    for key in (*keys, *headline_keys([summary])):
        if key in summary:
            val = summary[key]
            lines.append(
                f"- **{key}**: {val:.4f}" if isinstance(val, float) else f"- **{key}**: {val}"
            )
    if summary.get("attack"):
        lines.append(f"- **attack**: {summary['attack']}")
    if events := shown_events(summary):  # what the defenses did, summed over the rounds
        text = ", ".join(f"{k} {v:g}" for k, v in events.items())
        lines.append(f"- **events** (run totals): {text}")
    if summary.get("faults"):  # [faults]: what the clients' availability and deadlines did
        text = ", ".join(f"{k} {v:.4g}" for k, v in summary["faults"].items())
        lines.append(f"- **faults**: {text}")
    dropped = summary.get("dropped")
    if dropped and dropped.get("total"):  # Flower: sampled clients whose row never arrived
        why = ", ".join(f"{k} {v}" for k, v in dropped["by_reason"].items())
        who = ", ".join(f"client {k} ×{v}" for k, v in dropped["by_client"].items())
        lines.append(
            f"- **dropped**: {dropped['total']} missing rows in {dropped['rounds']} rounds "
            f"({why}; {who})"
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
