"""The end-of-run summary printed on the console, fitted to its width (docs/usage.md).

The metrics shown are the ones :data:`fedshield.sim.outputs.HEADLINE` declares, the same
list report.md and comparison.md are written from, plus the attack and the defenses'
:data:`~fedshield.sim.outputs.EVENTS` of an attacked run.

* One run: its accuracy as a key/value list, then each evaluator's headline metrics as a
  small table (``route/<policy>/<metric>``: a row per policy, a column per metric), and
  where report.md is.
* Several runs: one row per run, a :class:`~fedshield.console_table.FitTable` (transposed,
  split or in long form where it does not fit).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from rich.text import Text

from fedshield.console_table import Cell, FitTable
from fedshield.report import fmt, label_runs
from fedshield.sim.outputs import HEADLINE, headline_keys, shown_events

#: The columns every run has, before its evaluators' headline metrics.
BASE = (("rounds", "rounds"), ("final acc", "final_test_acc"), ("best acc", "best_test_acc"),
        ("to target", "rounds_to_target"))  # fmt: skip


def status_text(summary: dict[str, Any]) -> Text:
    if summary.get("status") != "diverged":
        return Text("ok")
    return Text(f"diverged at round {summary.get('diverged_round')}", style="red")


def attack_text(summary: dict[str, Any]) -> str | None:
    """``noise: 2 of 10 clients per round (per_round)`` for an attacked run (None: none)."""
    name = summary.get("attack")
    if not name:
        return None
    byz = summary.get("byzantine") or {}
    who = ""
    if byz.get("attackers") is not None:
        who = f": {byz['attackers']} of {byz.get('cohort', '?')} clients per round"
    mode = f" ({byz['mode']})" if byz.get("mode") else ""
    return f"{name}{who}{mode}"


def event_lines(summary: dict[str, Any]) -> list[tuple[str, str]]:
    """The defenses' events summed over the run (:func:`~fedshield.sim.outputs.shown_events`)."""
    return [(f"{k} (total)", f"{v:g}") for k, v in shown_events(summary).items()]


def families(keys: Sequence[str]) -> dict[str, list[str]]:
    """Headline keys by their first part (``route/fixed/acc`` → ``route``), in order."""
    out: dict[str, list[str]] = {}
    for k in keys:
        out.setdefault(k.split("/", 1)[0], []).append(k)
    return out


def _declared(family: str, part: str) -> tuple[int, str]:
    """Columns in the order the family's :data:`HEADLINE` pattern names them (``natural``
    before ``pgd20``), those it does not name (a ``[a-z_]+``) after, by name."""
    text = "|".join(p for p in HEADLINE if p.startswith(f"{family}/"))
    found = re.search(rf"(?<![\w.]){re.escape(part)}(?![\w.])", text)
    return (found.start() if found else 1 << 30), part


def family_table(family: str, keys: list[str], values: dict[str, Any]) -> FitTable | None:
    """``keys`` of one family as a table: the parts that vary between them, the last a
    column and the others a row (``route_adv/fgsm/0.01/robust/acc``: row ``fgsm/0.01``,
    column ``robust``); parts every key shares are dropped, and the title reads as the keys
    do (``route_adv/<row>/<column>/acc``). None for one key alone (a key/value line)."""
    split = [k.split("/")[1:] for k in keys]
    if len(keys) < 2 or len({len(p) for p in split}) != 1:
        return None
    n = len(split[0])
    vary = [i for i in range(n) if len({p[i] for p in split}) > 1]
    named = [family]
    for i in range(n):
        part = split[0][i] if i not in vary else "<column>" if i == vary[-1] else "<row>"
        if part != "<row>" or named[-1] != "<row>":  # a row label spans several parts
            named.append(part)
    title = "/".join(named)
    cols = sorted(dict.fromkeys(p[vary[-1]] for p in split), key=lambda c: _declared(family, c))
    row_of = ["/".join(p[i] for i in vary[:-1]) or family for p in split]
    rows: dict[str, dict[str, str]] = {}
    for key, parts, row in zip(keys, split, row_of):
        rows.setdefault(row, {})[parts[vary[-1]]] = fmt(values.get(key))
    body: list[list[Cell]] = [[r, *[cells.get(c, "-") for c in cols]] for r, cells in rows.items()]
    return FitTable(title, ["", *cols], body, long_headers=("metric", "value"))


def run_summary(summary: dict[str, Any]) -> list[Any]:
    """One run's summary: renderables for ``console.print``."""
    best = fmt(summary.get("best_test_acc"))
    if summary.get("best_round") is not None:
        best += f" (round {summary['best_round']})"
    lines: list[tuple[str, Cell]] = [
        ("rounds", str(summary.get("rounds", "-"))),
        ("final acc", fmt(summary.get("final_test_acc"))),
        ("best acc", best),
    ]
    if "rounds_to_target" in summary:
        target = summary.get("target_acc")
        label = f"to {fmt(target)}" if target is not None else "to target"
        lines.append((label, fmt(summary.get("rounds_to_target"))))
    attack = attack_text(summary)
    if attack:
        lines.append(("attack", attack))
    lines += event_lines(summary)
    if summary.get("status") == "diverged":
        lines.append(("status", status_text(summary)))
    tables = []
    for family, keys in families(headline_keys([summary])).items():
        table = family_table(family, keys, summary)
        if table is None:
            lines += [(k, fmt(summary.get(k))) for k in keys]
        else:
            tables.append(table)
    head = FitTable(f"results: {summary.get('label', summary.get('name', ''))}",
                    ["", ""], [list(x) for x in lines], show_header=False)  # fmt: skip
    out: list[Any] = [head, *tables]
    if summary.get("out"):
        out.append(f"the rest in {Path(summary['out']) / 'report.md'}")
    return out


def runs_table(summaries: list[dict[str, Any]]) -> FitTable:
    """Several runs: a row each (accuracy, the headline metrics, a status if one diverged)."""
    label_runs(summaries)
    heads = headline_keys(summaries)
    status = any(s.get("status") == "diverged" for s in summaries)
    cols = ["run", *[c for c, _ in BASE], *heads, *(["status"] if status else [])]
    rows: list[list[Cell]] = [
        [s["label"], *[fmt(s.get(k)) for _, k in BASE], *[fmt(s.get(k)) for k in heads],
         *([status_text(s)] if status else [])]
        for s in summaries
    ]  # fmt: skip
    return FitTable("results", cols, rows, long_headers=("metric", "value"))


def summary_renderables(summaries: list[dict[str, Any]]) -> list[Any]:
    """What ``fedshield run``, ``sweep`` and ``report`` print for their runs."""
    if len(summaries) == 1:
        label_runs(summaries)
        return run_summary(summaries[0])
    return [runs_table(summaries)]


__all__ = ["families", "family_table", "run_summary", "runs_table", "summary_renderables"]
