"""A bench's output files, from its plan and the protocol's choices.

``<out>/``: ``runs.csv`` (every run: status, test/validation accuracy, ASR, wall time,
commit, config hash), ``cells.csv`` (defense × attack × setting at the chosen candidate:
mean, 95 % half-width, min, max over the seeds, diverged seeds, the attacker's best
placement where it searched one), ``worst.csv`` / ``worst.md`` (each defense's worst case
per setting, naming the attack and its placement; "diverged" where
the model was destroyed), ``choice.csv`` (the candidate chosen per defense and setting,
with its validation worst case), ``asr.csv`` / ``asr.md`` (backdoor attacks), heat maps
``heatmap-<defense>.png`` (worst-case accuracy, share × heterogeneity) and ``best.png`` /
``best.md`` (the best defense per cell and the runner-up), ``header.md`` (the commit,
command, attack mode and faults a page states) and ``provenance.json``. The curves are
:mod:`fedshield.bench.curves`; both are drawn from the run files by
:func:`fedshield.bench.folder.render`.
"""

from __future__ import annotations

import csv
import json
import math
import statistics
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from fedshield.bench.plan import Plan, Setting
from fedshield.bench.select import AttackCell, Choice

PM_NOTE = "± : half-width of the 95 % Student-t interval over the seeds (n_seeds)"


def axes_of(settings: Sequence[Setting]) -> list[str]:
    """The setting axes that vary (a column label names only those)."""
    names = ["share", "heterogeneity", "fault", "mode"]
    return [n for n in names if len({getattr(s, n) for s in settings}) > 1] or ["share"]


def column(s: Setting, axes: Sequence[str]) -> str:
    parts = []
    for n in axes:
        v = getattr(s, n)
        parts.append(f"{round(v * 100)}%" if n == "share" else str(v))
    return " ".join(parts)


def worst_text(c: Choice, digits: int = 3) -> str:
    w = c.worst
    placed = f" {w.placement}" if w.placement else ""
    return f"{w.text(digits)} ({w.attack}{placed})"


def _md(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|---" * len(header) + "|"]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    text = "\n".join(lines) + "\n"
    return text + f"\n{PM_NOTE}\n" if any(" ± " in x for r in rows for x in r) else text


def _write_csv(path: Path, header: list[str], rows: list[list[Any]]) -> None:
    with path.open("w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(header)
        w.writerows(rows)


def write_all(
    plan: Plan, choices: list[Choice], results: dict[str, dict[str, Any]], out: Path,
    command: list[str], updates: Sequence[list[str]] = (),
) -> dict[str, Path]:  # fmt: skip
    """Every output file; returns them by kind. ``updates``: the ``--only`` commands that
    re-ran cells since ``command`` made the folder."""
    out.mkdir(parents=True, exist_ok=True)
    files: dict[str, Path] = {}
    axes = axes_of(plan.settings)
    cols = [column(s, axes) for s in plan.settings]
    defenses = [d.key for d in plan.spec.defenses]
    by = {(c.defense, c.setting): c for c in choices}

    run_cols = ["id", "defense", "attack", "share", "heterogeneity", "fault", "mode", "tune",
                "seed", "status", "diverged_round", "test_acc", "val_acc", "backdoor_asr",
                "wall_s", "commit", "config_sha256", "placement"]  # fmt: skip
    rows = [[results[r.id].get(k, "") if k != "id" else r.id for k in run_cols]
            for r in plan.runs if r.id in results]  # fmt: skip
    _write_csv(out / "runs.csv", run_cols, rows)
    files["runs"] = out / "runs.csv"

    cell_rows = []
    for c in choices:
        for a in c.cells.values():
            s = c.setting
            t = a.test
            cell_rows.append([
                c.defense, a.attack, s.share, s.heterogeneity, s.fault, s.mode,
                plan.tune_label(c.tune), len(t) + a.diverged, a.diverged,
                "" if a.is_diverged else round(a.mean, 6),
                "" if a.is_diverged or a.half != a.half else round(a.half, 6),
                "" if a.is_diverged else round(min(t), 6),
                "" if a.is_diverged else round(max(t), 6),
                round(sum(a.asr) / len(a.asr), 6) if a.asr and not a.is_diverged else "",
                a.placement,
            ])  # fmt: skip
    _write_csv(out / "cells.csv", ["defense", "attack", "share", "heterogeneity", "fault",
               "mode", "tune", "n_seeds", "diverged_seeds", "test_acc_mean", "test_acc_ci95",
               "test_acc_min", "test_acc_max", "backdoor_asr_mean", "placement"],
               cell_rows)  # fmt: skip
    files["cells"] = out / "cells.csv"

    worst_rows, choice_rows = [], []
    for d in defenses:
        row = []
        for s in plan.settings:
            ch = by.get((d, s))
            gap = "infeasible" if (d, s) in plan.infeasible else "-"
            row.append(worst_text(ch) if ch else gap)
            if ch:
                choice_rows.append([d, column(s, axes), plan.tune_label(ch.tune),
                                    round(ch.val_worst, 6)])  # fmt: skip
        worst_rows.append([d, *row])
    _write_csv(out / "worst.csv", ["defense", *cols], worst_rows)
    (out / "worst.md").write_text(_md(["defense", *cols], worst_rows))
    _write_csv(out / "choice.csv", ["defense", "setting", "chosen", "val_worst"], choice_rows)
    files |= {"worst": out / "worst.md", "choice": out / "choice.csv"}

    backdoor = [b for b in plan.spec.attacks if any(x.cells[b.key].asr for x in choices)]
    if backdoor:
        hdr = ["defense", *[f"{b.key}@{col}" for b in backdoor for col in cols]]
        asr_rows = []
        for d in defenses:
            r = [d]
            for b in backdoor:
                for s in plan.settings:
                    ch = by.get((d, s))
                    cell = ch.cells[b.key] if ch else None
                    if cell is None:
                        r.append("-")
                    elif cell.is_diverged:
                        r.append("diverged")
                    else:
                        r.append(f"{sum(cell.asr) / len(cell.asr):.3f}" if cell.asr else "-")
            asr_rows.append(r)
        _write_csv(out / "asr.csv", hdr, asr_rows)
        (out / "asr.md").write_text(_md(hdr, asr_rows))
        files["asr"] = out / "asr.md"

    from fedshield.bench.steps import write_steps

    files |= write_steps(plan, choices, results, out, lambda s: column(s, axes))
    (out / "header.md").write_text(header(plan, results, command, updates))
    files["header"] = out / "header.md"
    files |= heatmaps(plan, choices, out)
    prov = provenance(plan, results, command) | {"updates": [list(c) for c in updates]}
    (out / "provenance.json").write_text(json.dumps(prov, indent=2, sort_keys=True) + "\n")
    files["provenance"] = out / "provenance.json"
    return files


def worst_table(out: Path) -> Any:
    """worst.csv for the console: each defense's worst case per setting, at the console's
    width (:class:`~fedshield.console_table.FitTable`; worst.md keeps the wide table)."""
    from fedshield.console_table import FitTable

    with (out / "worst.csv").open(newline="") as fh:
        header, *rows = list(csv.reader(fh))
    note = PM_NOTE if any(" ± " in x for r in rows for x in r) else ""
    title = "worst test accuracy over the attacks (the attack named)"
    cells: list[list[Any]] = [list(r) for r in rows]
    return FitTable(title, header, cells, note, ("setting", "worst case"))


def header(
    plan: Plan, results: dict[str, dict[str, Any]], command: list[str],
    updates: Sequence[list[str]] = (),
) -> str:  # fmt: skip
    """What a rendered page states above the tables: commit(s), command (and the ``--only``
    commands that re-ran cells since), attack mode(s), faults, seeds, rounds, protocol."""
    spec = plan.spec
    commits = sorted({str(results[r.id].get("commit"))[:12] for r in plan.runs if r.id in results})
    dirty = any(results[r.id].get("dirty") for r in plan.runs if r.id in results)
    rounds = sorted({int(r.raw.get("rounds", 0)) for r in plan.runs})
    faults = "; ".join(f"{k} ({', '.join(v)})" if v else k for k, v in spec.faults.items())
    tune = ", ".join(f"{k} ∈ {v}" for k, v in spec.tune.items()) or "none (the base config's)"
    since = "".join(f" and `{' '.join(c)}`" for c in updates)
    return (
        f"Produced by `{' '.join(command)}`{since} (bench `{spec.name}`) at commit "
        f"{', '.join(f'`{c}`' for c in commits)}{' (uncommitted changes)' if dirty else ''}; "
        f"attack mode {', '.join(spec.attack_modes)}; faults / dropout: {faults}; seeds "
        f"{spec.seeds}; rounds {rounds[0] if len(rounds) == 1 else rounds}; "
        f"{len(plan.runs)} runs. Hyper-parameters chosen per defense and setting by the worst "
        f"case over the attacks on a {spec.val_size}-sample validation split ({tune}); cells: "
        f"test accuracy at the last round for that choice, the worst attack named; "
        f'"diverged": the attack drove the model non-finite.\n'
    )


def provenance(
    plan: Plan, results: dict[str, dict[str, Any]], command: list[str]
) -> dict[str, Any]:
    from fedshield.provenance import combined_sha256

    runs = {r.id: results[r.id].get("config_sha256", "") for r in plan.runs if r.id in results}
    commits = sorted({str(results[i].get("commit")) for i in runs})
    return {
        "bench": plan.spec.name,
        "command": command,
        "commits": commits,
        "dirty": any(results[i].get("dirty") for i in runs),
        "config_sha256": combined_sha256(runs),
        "runs": runs,
        "attack_modes": plan.spec.attack_modes,
        "faults": plan.spec.faults,
        "infeasible": {f"{d} @ {s.label}": why for (d, s), why in plan.infeasible.items()},
    }


def _grid(plan: Plan) -> tuple[list[float], list[str], list[tuple[str, str]]]:
    """The heat maps' axes: the shares and heterogeneities that have a setting (columns,
    rows), one panel per fault × attack mode."""
    st = plan.settings
    shares = [w for w in plan.spec.shares if any(s.share == w for s in st)]
    hets = [h for h in plan.spec.heterogeneity if any(s.heterogeneity == h for s in st)]
    panels = [(f, str(m)) for f in plan.spec.faults for m in plan.spec.attack_modes
              if any(s.fault == f and s.mode == m for s in st)]  # fmt: skip
    return shares, hets, panels


def spread(c: AttackCell) -> str:
    """A heat-map cell's value: the mean over the seeds ± their standard deviation (the
    spread a reader compares two cells by; the tables give the 95 % interval)."""
    if c.is_diverged:
        return f"div. ({c.diverged}/{len(c.test) + c.diverged})"
    if len(c.test) < 2:
        return f"{c.mean:.2f}"
    return f"{c.mean:.2f} ± {statistics.stdev(c.test):.2f}"


def _draw(ax: Any, grid: list[list[tuple[float, str]]], shares: list[float], hets: list[str],
          title: str) -> Any:  # fmt: skip
    """One heat-map panel (accuracy in [0, 1], text dark on the light end of the map)."""
    import matplotlib

    cmap = matplotlib.colormaps["viridis"].with_extremes(bad="0.9")  # not run: light grey
    im = ax.imshow([[v for v, _ in r] for r in grid], vmin=0, vmax=1, cmap=cmap,
                   aspect="auto")  # fmt: skip
    for i, r in enumerate(grid):
        for j, (v, text) in enumerate(r):
            dark = v != v or v > 0.6  # dark text on grey and on the light end
            ax.text(j, i, text, ha="center", va="center", fontsize=7,
                    color="black" if dark else "white")  # fmt: skip
    ax.set_xticks(range(len(shares)), [f"{round(w * 100)}%" for w in shares])
    ax.set_yticks(range(len(hets)), hets)
    ax.set_xlabel("Byzantine share")
    ax.set_title(title, fontsize=8)
    return im


def _figure(plt: Any, n_panels: int, shares: int, hets: int, cell_w: float) -> Any:
    return plt.subplots(1, n_panels, figsize=(1.8 + cell_w * shares * n_panels,
                        1.4 + 0.9 * hets), squeeze=False)  # fmt: skip


def heatmaps(plan: Plan, choices: list[Choice], out: Path) -> dict[str, Path]:
    """Worst-case accuracy per defense (rows: heterogeneity, columns: share; each cell the
    mean ± sd over the seeds of the worst attack, named; "div." where a seed diverged), and
    the best defense per cell with the runner-up (PNG + Markdown), one panel per fault ×
    attack mode, each figure with its colour bar."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    shares, hets, panels = _grid(plan)
    by = {(c.defense, c.setting): c for c in choices}
    files: dict[str, Path] = {}
    seeds = len(plan.spec.seeds)

    def values(d: str, fault: str, mode: str) -> list[list[tuple[float, str]]]:
        grid = []
        for h in hets:
            row = []
            for w in shares:
                c = by.get((d, Setting(w, h, fault, mode)))
                if c is None:
                    gone = (d, Setting(w, h, fault, mode)) in plan.infeasible
                    row.append((math.nan, "infeasible" if gone else "–"))
                else:
                    v = 0.0 if c.worst.is_diverged else c.worst.mean
                    row.append((v, f"{spread(c.worst)}\n{c.worst.attack}"))
            grid.append(row)
        return grid

    note = f"mean ± sd over {seeds} seeds" if seeds > 1 else "1 seed"
    for d in [x.key for x in plan.spec.defenses]:
        fig, axs = _figure(plt, len(panels), len(shares), len(hets), 1.6)
        for ax, (fault, mode) in zip(axs[0], panels):
            title = f"{d}: worst case over the attacks ({fault}, {mode})\n{note}"
            im = _draw(ax, values(d, fault, mode), shares, hets, title)
        fig.colorbar(im, ax=axs[0].tolist(), shrink=0.8, label="test accuracy")
        path = out / f"heatmap-{d}.png"
        fig.savefig(path, dpi=110, bbox_inches="tight")
        plt.close(fig)
        files[f"heatmap-{d}"] = path

    md = []
    fig, axs = _figure(plt, len(panels), len(shares), len(hets), 2.0)
    for ax, (fault, mode) in zip(axs[0], panels):
        md.append(f"**{fault}, {mode}** — best defense by worst-case test accuracy "
                  f"(and the runner-up)\n")  # fmt: skip
        header = ["heterogeneity", *[f"{round(w * 100)}%" for w in shares]]
        rows, grid = [], []
        for h in hets:
            row, vals = [h], []
            for w in shares:
                s = Setting(w, h, fault, mode)
                ranked = sorted((c for c in choices if c.setting == s),
                                key=lambda c: -c.worst_score)  # fmt: skip
                if not ranked:
                    row.append("-")
                    vals.append((math.nan, "–"))
                    continue
                best, *rest = ranked
                text = f"{best.defense}: {worst_text(best)}"
                label = f"{best.defense}\n{_score(best)}"
                if rest:
                    text += f"; runner-up {rest[0].defense}: {worst_text(rest[0])}"
                    label += f"\n2nd: {rest[0].defense} {_score(rest[0])}"
                row.append(text)
                vals.append((max(best.worst_score, 0.0), label))
            rows.append(row)
            grid.append(vals)
        md.append(_md(header, rows))
        im = _draw(ax, grid, shares, hets, f"best defense ({fault}, {mode})\n"
                   f"colour: its worst-case test accuracy")  # fmt: skip
    fig.colorbar(im, ax=axs[0].tolist(), shrink=0.8, label="worst-case test accuracy")
    fig.savefig(out / "best.png", dpi=110, bbox_inches="tight")
    plt.close(fig)
    (out / "best.md").write_text("\n".join(md))
    files |= {"best": out / "best.md", "best_png": out / "best.png"}
    return files


def _score(c: Choice) -> str:
    return "div." if c.worst.is_diverged else f"{c.worst_score:.2f}"


__all__ = [
    "axes_of", "column", "heatmaps", "provenance", "spread", "worst_table", "write_all",
    "worst_text",
]
