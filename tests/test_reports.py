"""Reports show what each method measures; seeds give intervals; sweeps over two keys pivot."""

from __future__ import annotations

import json
import math

import pytest
import tomli_w
from scipy import stats

from fedshield.cli import main
from fedshield.report import headline_keys, label_runs, pivot, seed_cells, t_interval
from fedshield.sweep import expand


def test_t_interval_is_the_student_t_half_width() -> None:
    mean, std, half = t_interval([1.0, 2.0, 3.0])
    assert (mean, std) == (2.0, 1.0)
    assert half == pytest.approx(stats.t.ppf(0.975, 2) / math.sqrt(3))  # 2.484
    assert math.isnan(t_interval([0.5])[2])


def test_seed_cells_group_runs_that_differ_only_by_their_seed() -> None:
    params = [{"variant": v, "seed": s} for v in ("a", "b") for s in (0, 1, 2)]
    summaries = [{"final_test_acc": x} for x in (0.5, 0.6, 0.7, 0.9, 0.9, 0.9)]
    cells = seed_cells(summaries, params, ["final_test_acc"])
    assert [c["variant"] for c in cells] == ["a", "b"]
    assert cells[0]["n_seeds"] == 3 and cells[0]["final_test_acc_mean"] == pytest.approx(0.6)
    assert cells[0]["final_test_acc_std"] == pytest.approx(0.1)
    assert cells[1]["final_test_acc_ci95"] == 0.0
    # ± is the 95 % half-width (t_{0.975,2} · 0.1 / √3), as in the README's tables; one seed
    # shows the value alone (no "± 0.0000" / "nan")
    assert cells[0]["final_test_acc"] == "0.6000 ± 0.2484"
    one = seed_cells([{"final_test_acc": 0.5}], [{"variant": "a", "seed": 0}], ["final_test_acc"])
    assert one[0]["final_test_acc"] == "0.5000"
    # Per-seed values next to the interval: a collapsed seed shows.
    assert (cells[0]["final_test_acc_min"], cells[0]["final_test_acc_max"]) == (0.5, 0.7)
    assert cells[0]["final_test_acc_seeds"] == "0:0.5 1:0.6 2:0.7"


def test_headline_metrics_and_labels() -> None:
    finals = [{"test_acc": 0.9, "robust/pgd20": 0.4, "robust/aa_n": 100.0, "comm/cum_gib": 0.1}]
    assert headline_keys(finals) == ["robust/pgd20", "comm/cum_gib"]  # aa_n is bookkeeping
    runs = [{"name": "demo", "out": "runs/a"}, {"name": "demo", "out": "runs/b"}, {"name": "x"}]
    label_runs(runs)
    assert [r["label"] for r in runs] == ["runs/a", "runs/b", "x"]


def test_pivot_of_two_keys() -> None:
    rows = [
        {"variant": "fedavg", "attack": "noise", "acc": 0.5},
        {"variant": "brdrag", "attack": "noise", "acc": 0.875},
        {"variant": "brdrag", "attack": "ipm", "acc": 0.9},
    ]
    assert pivot(rows, "variant", "attack", "acc").splitlines() == [
        "| variant \\ attack | noise | ipm |",
        "|---|---|---|",
        "| fedavg | 0.500 | - |",
        "| brdrag | 0.875 | 0.900 |",
    ]


def test_grid_seeds_repeat_every_run_and_the_flag_overrides(tmp_path, small_cfg) -> None:
    (tmp_path / "base.toml").write_text(tomli_w.dumps(small_cfg))
    spec = {"name": "g", "file": "base.toml", "seeds": [0, 1], "grid": {"client.lr": [0.1]}}
    _, runs = expand(spec, tmp_path)
    assert [r.name for r in runs] == ["lr=0.1_seed=0", "lr=0.1_seed=1"]
    assert [r.raw["seed"] for r in runs] == [0, 1] and runs[1].params["seed"] == 1
    _, runs = expand(spec, tmp_path, seeds=[3])
    assert [r.raw["seed"] for r in runs] == [3]
    from fedshield.errors import ConfigError

    with pytest.raises(ConfigError, match="grid.seeds"):
        expand(dict(spec, seeds=[1, 1]), tmp_path)
    with pytest.raises(ConfigError, match="did you mean 'seeds'"):
        expand(dict(spec, seed=[1]), tmp_path)


def test_a_seeded_two_key_sweep_writes_cells_and_a_pivot(tmp_path, small_cfg, capsys) -> None:
    small_cfg["rounds"] = 2
    (tmp_path / "base.toml").write_text(tomli_w.dumps(small_cfg))
    spec = {
        "name": "g",
        "file": "base.toml",
        "grid": {"client.lr": [0.05, 0.1]},
        "variant": [
            {"name": "mean", "set": []},
            {"name": "median", "set": ['server.aggregator="median"']},
        ],
    }
    grid = tmp_path / "grid.toml"
    grid.write_text(tomli_w.dumps(spec))
    out = tmp_path / "out"
    assert main(["sweep", str(grid), "--out", str(out), "--seeds", "0,1", "-q"]) == 0
    cells = (out / "cells.md").read_text().splitlines()
    assert len(cells) == 2 + 4 + 2 and "n_seeds" in cells[0]
    assert cells[2].startswith("| mean | 0.05 | 2 |")
    assert cells[-1].startswith("± : half-width of the 95 % Student-t interval")  # labelled
    piv = (out / "pivot.md").read_text().splitlines()
    assert piv[0] == "| variant \\ client.lr | 0.05 | 0.1 |" and len(piv) == 4
    printed = capsys.readouterr().out
    assert "variant \\ client.lr" in printed  # the pivot is printed too
    summary = json.loads((out / "mean_lr=0.1_seed=1" / "summary.json").read_text())
    assert summary["rounds"] == 2


def test_report_and_console_show_evaluator_metrics(
    tmp_path, small_cfg, capsys, monkeypatch
) -> None:
    import tomli_w as tw

    monkeypatch.setenv("COLUMNS", "200")  # a wide terminal: headers on one line
    small_cfg |= {"rounds": 1}
    small_cfg["eval"] |= {"per_client": True}
    cfg = tmp_path / "c.toml"
    cfg.write_text(tw.dumps(small_cfg))
    assert main(["run", str(cfg), "--out", str(tmp_path / "a"), "-q"]) == 0
    assert main(["run", str(cfg), "--out", str(tmp_path / "b"), "-q"]) == 0
    capsys.readouterr()
    assert (
        main(["report", str(tmp_path / "a"), str(tmp_path / "b"), "--out", str(tmp_path / "r")])
        == 0
    )
    table = (tmp_path / "r" / "comparison.md").read_text()
    assert "client/worst_acc" in table.splitlines()[0]
    assert str(tmp_path / "a") in table and str(tmp_path / "b") in table  # names clash: dirs
    assert "worst_acc" in capsys.readouterr().out


def test_a_runs_own_report_and_summary_hold_its_evaluators_headline_metrics(
    tmp_path, small_cfg, capsys, monkeypatch
) -> None:
    """`fedshield run` itself (not only `fedshield report`): report.md, summary.json and
    the console table show the evaluator's headline metrics, from the round it ran in."""
    monkeypatch.setenv("COLUMNS", "250")
    small_cfg |= {"rounds": 2}
    small_cfg["eval"] = {"every": 2, "metrics": ["robust"], "params": {"robust": {
        "max_samples": 50, "cw": False, "autoattack": False, "pgd_steps": 2}}}  # fmt: skip
    cfg = tmp_path / "c.toml"
    cfg.write_text(tomli_w.dumps(small_cfg))
    out = tmp_path / "a"
    assert main(["run", str(cfg), "--out", str(out)]) == 0
    summary = json.loads((out / "summary.json").read_text())
    assert 0.0 <= summary["robust/natural"] <= 1.0 and "robust/fgsm" in summary
    report = (out / "report.md").read_text()
    assert f"- **robust/natural**: {summary['robust/natural']:.4f}" in report
    printed = capsys.readouterr().out  # the robust/<column> table: a column per metric
    assert "robust/<column>" in printed and "natural" in printed
    assert f"{summary['robust/natural']:.4f}" in printed
