"""The steps table of a bench: per defense × attack × setting, the final test accuracy
beside the largest one-round step ‖θ^{t+1} − θ^t‖ of the run ÷ the median step of its
clean twin (the same defense, setting, tuning candidate and seed under the bench's
``clean`` attack — e.g. ``scaling`` with k = 1: the attackers upload their honest update).

A robust rule bounds the share the attackers can move θ by in one round (docs/cross-round.md: "no
robust rule moves θ beyond 10× the clean step"); accuracy at the last round alone hides a
rule that is knocked far away and walks back. The ratio is the largest over the seeds (the
worst case); a run that diverged, or whose twin is missing, shows ``diverged`` / ``-``.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from fedshield.bench.plan import Plan, Run, Setting
from fedshield.bench.select import Choice


def _twin(run: Run, clean: str) -> str:
    s = run.setting
    return (
        f"{run.defense}__{clean}__w{s.share:g}__{s.heterogeneity}__{s.fault}__"
        f"{s.mode}__t{run.tune}__s{run.seed}"
    )


def step_ratio(run: Run, results: dict[str, dict[str, Any]], clean: str) -> float | None:
    """``run``'s largest step ÷ its clean twin's median step; None when either is unknown
    (diverged, not run, a result file from before steps were recorded) or the twin never
    moved θ."""
    rec, twin = results.get(run.id), results.get(_twin(run, clean))
    if rec is None or twin is None:
        return None
    top, ref = rec.get("step_max"), twin.get("step_median")
    if top is None or ref is None or ref <= 0.0:
        return None
    return float(top) / float(ref)


def step_rows(
    plan: Plan, choices: Sequence[Choice], results: dict[str, dict[str, Any]]
) -> list[list[Any]]:
    """One row per defense × attack × setting at the chosen candidate: the setting, the
    mean test accuracy, the worst (largest) step ratio over the seeds, the clean twin's
    median step (mean over the seeds) and, last, the :class:`Setting` (not a CSV column)."""
    clean = plan.spec.clean
    if clean is None:
        return []
    chosen = {(c.defense, c.setting): c for c in choices}
    rows = []
    for c in chosen.values():
        for a in plan.spec.attacks:
            cell = c.cells[a.key]  # at the attacker's best placement
            runs = [r for r in plan.runs if (r.defense, r.setting, r.tune, r.attack,
                    r.placement) == (c.defense, c.setting, c.tune, a.key,
                    cell.placement_index) and r.id in results]  # fmt: skip
            if not runs:
                continue
            ratios = [step_ratio(r, results, clean) for r in runs]
            refs = [results.get(_twin(r, clean), {}).get("step_median") for r in runs]
            s = c.setting
            known = [x for x in ratios if x is not None]
            rows.append([
                c.defense, a.key, s.share, s.heterogeneity, s.fault, s.mode,
                "diverged" if cell.is_diverged else round(cell.mean, 4),
                "diverged" if cell.is_diverged else (round(max(known), 3) if known else ""),
                round(statistics.fmean([x for x in refs if x is not None]), 6)
                if any(x is not None for x in refs) else "",
                s,
            ])  # fmt: skip
    return rows


STEP_COLS = ["defense", "attack", "share", "heterogeneity", "fault", "mode", "test_acc_mean",
             "step_max_over_clean", "clean_step_median"]  # fmt: skip


def step_markdown(rows: Sequence[Sequence[Any]], column: Callable[[Setting], str]) -> str:
    """Per attack a table: defense rows × setting columns, each cell "accuracy · ratio×"."""
    out = []
    for attack in dict.fromkeys(r[1] for r in rows):
        sub = [r for r in rows if r[1] == attack]
        cols = list(dict.fromkeys(column(r[-1]) for r in sub))
        defs = list(dict.fromkeys(r[0] for r in sub))
        cell = {(r[0], column(r[-1])): r for r in sub}
        out.append(f"**{attack}** (final test accuracy · largest step ÷ clean median step)\n")
        out.append("| defense | " + " | ".join(cols) + " |")
        out.append("|---" * (len(cols) + 1) + "|")
        for d in defs:
            vals = []
            for col in cols:
                r = cell.get((d, col))
                if r is None:
                    vals.append("-")
                elif r[6] == "diverged":
                    vals.append("diverged")
                else:
                    ratio = f"{r[7]:.1f}×" if r[7] != "" else "-"
                    vals.append(f"{r[6]:.3f} · {ratio}")
            out.append(f"| {d} | " + " | ".join(vals) + " |")
        out.append("")
    return "\n".join(out)


def write_steps(
    plan: Plan, choices: Sequence[Choice], results: dict[str, dict[str, Any]], out: Path,
    column: Callable[[Setting], str],
) -> dict[str, Path]:  # fmt: skip
    """``steps.csv`` and ``steps.md`` when the bench names a ``clean`` attack."""
    import csv

    rows = step_rows(plan, choices, results)
    if not rows:
        return {}
    with (out / "steps.csv").open("w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(STEP_COLS)
        w.writerows(r[:-1] for r in rows)
    (out / "steps.md").write_text(step_markdown(rows, column))
    return {"steps": out / "steps.md"}


__all__ = ["STEP_COLS", "step_markdown", "step_ratio", "step_rows", "write_steps"]
