"""The end-of-run summaries a person reads first fit the console: every header and every
value of ``fedshield run``, ``sweep``/``report`` and ``bench`` is printed whole at 80 and
120 columns and in a pipe (rich's 80), whatever the number of metrics (45 routing metrics
were folded into one letter each)."""

from __future__ import annotations

import csv
import io
import re
from pathlib import Path
from typing import Any

import pytest
from rich.cells import cell_len
from rich.console import Console

from fedshield import cli
from fedshield.report import PM_NOTE, fmt, seed_cells, text_table
from fedshield.sim.outputs import headline_keys

#: The headline metrics each preset family's evaluators write (their real names).
POLICIES = ("ensemble", "fixed", "full", "global_resource", "robust")
LOCAL = ("client_resource", "client_robust", "fixed", "full", "global_resource", "robust")
EEVIT = [
    *[f"route/{p}/acc" for p in POLICIES],
    *[f"route/{p}/depth_saving" for p in ("fixed", "global_resource", "robust")],
    *[f"route_local/{p}/{m}" for p in LOCAL for m in ("mean_acc", "worst_acc")],
    *[f"route_adv/{a}/{e}/{p}/acc" for a in ("fgsm", "pgd") for e in ("0.0001", "0.001", "0.01")
      for p in ("fixed", "full", "robust")],
    "comm/cum_gib",
]  # fmt: skip
FEDCART = [
    *[f"robust/{m}" for m in ("natural", "fgsm", "pgd20", "cw", "aa", "avg", "worst")],
    *[f"groups/{g}/{m}" for g in ("majority", "medium", "minority")
      for m in ("natural", "pgd20", "worst")],
    "comm/cum_gib",
]  # fmt: skip


def _summary(name: str, keys: list[str], start: float, **extra: Any) -> dict[str, Any]:
    """A run's summary with a distinct value per metric (so each can be found whole)."""
    values = {k: round(start + 0.0007 * i, 4) for i, k in enumerate(keys)}
    return {
        "name": name, "out": f"runs/{name}", "rounds": 15, "final_test_acc": start - 0.0123,
        "best_test_acc": start - 0.0011, "best_round": 14, "status": "ok", **values, **extra,
    }  # fmt: skip


FAMILIES = {
    "demo": _summary("demo", ["comm/cum_gib"], 0.9012, events={"sys/rejected": 0.0}),
    "brdrag": _summary(
        "brdrag-mnist5k-alie-cpu", ["comm/cum_gib"], 0.8123, attack="alie",
        byzantine={"attackers": 3, "cohort": 10, "mode": "fixed"},
        events={"defense/consistency/flagged": 7.0, "sys/rejected": 2.0},
        rounds_to_target=12, target_acc=0.8,
    ),  # fmt: skip
    "drag-diverged": _summary(
        "drag-mnist5k-dir0.1-cpu", ["comm/cum_gib"], 0.4321, status="diverged",
        diverged_round=9, final_test_acc=float("nan"),
    ),  # fmt: skip
    "eevit": _summary("eevit-mnist5k-dir0.5-cpu", EEVIT, 0.6012),
    "fedcart": _summary("fedcart-fmnistlt-cpu", FEDCART, 0.7012),
}

WIDTHS = [80, 120, None]  # None: a pipe (no terminal: rich's default width)


def _console(width: int | None, monkeypatch) -> tuple[Console, io.StringIO]:
    monkeypatch.delenv("COLUMNS", raising=False)  # a pipe: rich's own default, 80
    buf = io.StringIO()
    return Console(file=buf, width=width, force_terminal=False, color_system=None), buf


def _whole(text: str, word: str) -> bool:
    """``word`` printed whole: not run into a longer name, not folded across lines."""
    return re.search(rf"(?<![\w.]){re.escape(word)}(?![\w.])", text) is not None


#: lines that name a path: printed whole, however wide (the terminal wraps them, no path is
#: broken inside a name)
PATH_LINES = ("the rest in ", "outputs: ", "outputs under: ")


def _check(text: str, width: int, words: list[str]) -> None:
    wide = [
        line for line in text.splitlines()
        if cell_len(line) > width and not line.startswith(PATH_LINES)
    ]  # fmt: skip
    assert not wide, wide
    cut = [w for w in words if not _whole(text, w)]
    assert not cut, (cut, text)


def _print_summaries(summaries: list[dict[str, Any]], width: int | None, monkeypatch) -> str:
    console, buf = _console(width, monkeypatch)
    monkeypatch.setattr(cli, "console", console)
    cli.print_summaries([dict(s) for s in summaries])
    return buf.getvalue()


@pytest.mark.parametrize("width", WIDTHS)
@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_one_runs_summary_shows_every_headline_metric_whole(family, width, monkeypatch) -> None:
    s = FAMILIES[family]
    text = _print_summaries([s], width, monkeypatch)
    keys = headline_keys([s])
    assert len(keys) == len([k for k in s if "/" in k])  # the synthetic keys are headline
    # every value, and every part of every metric's name (a row, a column or a title)
    words = [fmt(s[k]) for k in keys] + [p for k in keys for p in k.split("/")]
    words += [fmt(s["best_test_acc"]), s["name"], "final acc", "best acc"]
    words += [str(Path(s["out"]) / "report.md")]
    if s.get("attack"):
        words += ["alie: 3 of 10 clients per round (fixed)"]
        words += [f"{k} (total)" for k in s["events"]]
    if s.get("rounds_to_target") is not None:
        words += ["to 0.8000", "12"]
    if s["status"] == "diverged":
        words += ["diverged at round 9"]
    _check(text, width or 80, words)
    if family == "demo":  # no attack, no defense acted: no "0 rejected" line
        assert "sys/rejected" not in text
    if family == "eevit":  # a row per policy, a column per metric
        line = next(x for x in text.splitlines() if _whole(x, "global_resource") and "│" in x)
        assert _whole(line, fmt(s["route/global_resource/acc"]))
        assert _whole(line, fmt(s["route/global_resource/depth_saving"]))


@pytest.mark.parametrize("width", WIDTHS)
def test_a_table_of_runs_fits_by_transposing_or_splitting(width, monkeypatch) -> None:
    """A sweep or report of several runs: one row per run where it fits; transposed, split
    or one line per value where it does not, never a column folded into letters."""
    demo = [_summary(f"demo-lr{i}", ["comm/cum_gib"], 0.8 + 0.01 * i) for i in range(6)]
    eevit = [_summary(f"eevit-beta{b}", EEVIT, 0.5 + 0.05 * i)
             for i, b in enumerate((0.1, 0.5, 1.0))]  # fmt: skip
    eevit[1].update(status="diverged", diverged_round=3)
    for runs in (demo, eevit):
        text = _print_summaries(runs, width, monkeypatch)
        keys = headline_keys(runs)
        words = [s["name"] for s in runs] + keys + ["final acc", "best acc", "to target"]
        words += [fmt(s[k]) for s in runs for k in keys]
        words += [fmt(s[k]) for s in runs for k in ("final_test_acc", "best_test_acc")]
        if runs is eevit:
            words += ["diverged at round 3"]
        _check(text, width or 80, words)


@pytest.mark.parametrize("width", WIDTHS)
def test_sweep_cells_with_intervals_fit(width, monkeypatch) -> None:
    metrics = ["final_test_acc", "route/robust/acc", "route_adv/pgd/0.01/robust/acc"]
    params = [{"data.beta": b, "seed": s} for b in (0.1, 0.5, 1.0) for s in (0, 1, 2)]
    runs = [{m: 0.3 + 0.011 * i + 0.001 * j for j, m in enumerate(metrics)}
            for i in range(len(params))]  # fmt: skip
    cells = seed_cells(runs, params, metrics)
    table = text_table("cells (mean over seeds)", cells, ["data.beta", "n_seeds", *metrics],
                       PM_NOTE)  # fmt: skip
    console, buf = _console(width, monkeypatch)
    console.print(table.rich())
    words = [*metrics, "data.beta", "n_seeds", PM_NOTE, *[c[m] for c in cells for m in metrics]]
    assert all(" ± " in c["final_test_acc"] for c in cells)
    _check(buf.getvalue(), width or 80, words)


@pytest.mark.parametrize("width", WIDTHS)
def test_the_bench_worst_case_table_fits(tmp_path, width, monkeypatch) -> None:
    from fedshield.bench.render import worst_table

    defenses = ["fedavg", "krum", "multikrum", "median", "trimmed_mean", "centered_clipping",
                "norm_clip", "rfa", "brdrag", "signguard", "flame", "dnc"]  # fmt: skip
    settings = ["20%", "40%", "60%", "80%"]
    cells = ["0.579 ± 0.296 (ipm_opt)", "0.134 ± 0.131 (adaptive_root_est)",
             "diverged (alie_opt)", "infeasible"]  # fmt: skip
    rows = [[d, *[cells[(i + j) % 4] for j in range(4)]] for i, d in enumerate(defenses)]
    with (tmp_path / "worst.csv").open("w", newline="") as fh:
        csv.writer(fh).writerows([["defense", *settings], *rows])
    console, buf = _console(width, monkeypatch)
    console.print(worst_table(tmp_path))
    text = buf.getvalue()
    _check(text, width or 80, [*defenses, *settings, *cells, PM_NOTE])
    # a defense's first worst case is on its line (as a row, split, or one line per cell)
    for d, first, *_ in rows:
        lines = [x for x in text.splitlines() if _whole(x, d)]
        assert lines and _whole(lines[0], first), (d, text)


def test_an_attacked_run_names_its_attack_and_its_defenses_events(
    tmp_path, small_cfg, capsys, monkeypatch
) -> None:
    """summary.json and the console: the attack, and each defense counter summed over the
    rounds (what metrics.jsonl holds round by round); report.md says the same."""
    import json

    import tomli_w

    monkeypatch.setenv("COLUMNS", "80")
    small_cfg |= {"rounds": 2, "attack": {"name": "sign_flip", "fraction": 0.34}}
    small_cfg["server"] |= {"round_defenses": ["consistency"], "aggregator": "median"}
    cfg = tmp_path / "c.toml"
    cfg.write_text(tomli_w.dumps(small_cfg))
    out = tmp_path / "a"
    assert cli.main(["run", str(cfg), "--out", str(out), "-q"]) == 0
    summary = json.loads((out / "summary.json").read_text())
    records = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert summary["attack"] == "sign_flip"
    for key in ("sys/rejected", "defense/consistency/flagged"):
        assert summary["events"][key] == sum(r[key] for r in records)
    printed = capsys.readouterr().out
    words = ["sign_flip", "defense/consistency/flagged (total)", "sys/rejected (total)"]
    _check(printed, 80, [*words, "report.md"])  # (the tmp path may be wider than 80)
    report = (out / "report.md").read_text()
    assert "- **attack**: sign_flip" in report and "defense/consistency/flagged" in report
