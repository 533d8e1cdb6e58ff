"""What a person reads: readable console tables, a start-up line, the report's
own folder, help for every option, whole-round ticks, one labelled meaning of ±."""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path

import pytest
import tomli_w

from fedshield.cli import build_parser, main


def _fake_run(root: Path, name: str, accs: list[float]) -> Path:
    run = root / name
    run.mkdir()
    rows = [{"round": i + 1, "test_acc": a, "test_loss": 1.0} for i, a in enumerate(accs)]
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return run


def test_sweep_tables_are_printed_as_tables_not_raw_markdown(
    tmp_path, small_cfg, capsys, monkeypatch
) -> None:
    monkeypatch.setenv("COLUMNS", "80")
    small_cfg["rounds"] = 1
    (tmp_path / "base.toml").write_text(tomli_w.dumps(small_cfg))
    spec = {
        "name": "g",
        "file": "base.toml",
        "grid": {"client.lr": [0.05, 0.1]},
        "variant": [{"name": "mean"}, {"name": "median", "set": ['server.aggregator="median"']}],
    }
    grid = tmp_path / "grid.toml"
    grid.write_text(tomli_w.dumps(spec))
    assert main(["sweep", str(grid), "--out", str(tmp_path / "s"), "--seeds", "0,1", "-q"]) == 0
    printed = capsys.readouterr().out
    assert "|---" not in printed and "| variant" not in printed  # no raw Markdown
    assert "cells (mean over seeds)" in printed and "variant \\ client.lr" in printed
    assert "half-width of the 95 % Student-t interval" in printed  # ± is labelled
    assert not re.search(r"\bnan\b", printed)


def test_a_start_up_line_before_the_data_is_loaded(tmp_path, small_cfg, capsys) -> None:
    small_cfg["rounds"] = 1
    cfg = tmp_path / "c.toml"
    cfg.write_text(tomli_w.dumps(small_cfg))
    assert main(["run", str(cfg), "--out", str(tmp_path / "o")]) == 0
    out = capsys.readouterr().out
    start = out.index("starting t: digits over 6 clients, mlp, 1 rounds")
    assert start < out.index("results")
    assert main(["run", str(cfg), "--out", str(tmp_path / "q"), "-q"]) == 0
    assert "starting" not in capsys.readouterr().out  # -q: quiet


def test_report_prints_its_own_output_folder(tmp_path, capsys, monkeypatch) -> None:
    """``report --out cmp`` printed the inputs' folder ("outputs under: runs")."""
    monkeypatch.setenv("COLUMNS", "300")
    runs = tmp_path / "runs"
    runs.mkdir()
    a, b = _fake_run(runs, "a", [0.5, 0.6]), _fake_run(runs, "b", [0.4, 0.7])
    cmp = tmp_path / "cmp"
    assert main(["report", str(a), str(b), "--out", str(cmp)]) == 0
    out = capsys.readouterr().out
    assert f"report in {cmp}" in out and str(cmp / "comparison.md") in out
    assert "outputs under" not in out


def test_every_option_of_every_subcommand_has_help() -> None:
    parser = build_parser()
    subs = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))

    def undocumented(name: str, sub: argparse.ArgumentParser) -> list[str]:
        """``sub``'s options without help, its own subcommands' too (``results page``)."""
        out = []
        for action in sub._actions:
            if isinstance(action, argparse._SubParsersAction):
                for n, p in action.choices.items():
                    out += undocumented(f"{name} {n}", p)
            if not isinstance(action, argparse._HelpAction) and not action.help:
                out.append(f"{name} {action.option_strings or action.dest}")
        return out

    missing = [x for name, sub in subs.choices.items() for x in undocumented(name, sub)]
    assert not missing, missing
    assert set(subs.choices) == {"run", "list", "report", "sweep", "bench", "results", "recommend"}


def _xticks(monkeypatch, draw) -> list[list[float]]:
    from matplotlib.figure import Figure

    ticks: list[list[float]] = []
    real = Figure.savefig

    def spy(self, *a, **k):
        self.canvas.draw()
        ticks.append([t for t in self.axes[0].get_xticks() if self.axes[0].get_xlim()[0] <= t])
        return real(self, *a, **k)

    monkeypatch.setattr(Figure, "savefig", spy)
    draw()
    return ticks


def test_round_axes_tick_at_whole_rounds(tmp_path, monkeypatch) -> None:
    from fedshield.report import plot_overlay
    from fedshield.sim.outputs import plot_curves

    records = [{"round": r, "test_acc": 0.1 * r, "test_loss": 1.0 / r} for r in (1, 2, 3)]

    def draw() -> None:
        plot_curves(records, tmp_path, "t")  # test_acc.png, test_loss.png
        plot_overlay([("a", [records, records])], tmp_path / "o.png")

    ticks = _xticks(monkeypatch, draw)
    assert len(ticks) == 3
    for axis in ticks:
        assert axis and all(float(t).is_integer() for t in axis), axis


@pytest.mark.parametrize("n", [1, 3])
def test_cells_say_what_plus_minus_is(n) -> None:
    from fedshield.report import PM_NOTE, seed_cells, text_table

    params = [{"variant": "a", "seed": s} for s in range(n)]
    cells = seed_cells([{"final_test_acc": 0.5 + 0.1 * s} for s in range(n)], params,
                       ["final_test_acc"])  # fmt: skip
    text = text_table("cells", cells, ["variant", "final_test_acc"], PM_NOTE).markdown()
    assert text.rstrip().endswith(PM_NOTE)
    assert ("±" in text.splitlines()[2]) == (n > 1)  # one seed: the value alone
