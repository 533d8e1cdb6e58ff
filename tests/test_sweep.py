import csv
import json

import pytest
import tomli_w

from fedshield.cli import main
from fedshield.errors import ConfigError
from fedshield.sweep import expand


def _grid(tmp_path, small_cfg, **extra):
    (tmp_path / "base.toml").write_text(tomli_w.dumps(small_cfg))
    spec = {
        "name": "g",
        "file": "base.toml",
        "set": ["rounds=2"],
        "grid": {"client.lr": [0.05, 0.1]},
        "variant": [
            {"name": "mean", "set": []},
            {"name": "median", "set": ['server.aggregator="median"']},
        ],
        **extra,
    }
    p = tmp_path / "grid.toml"
    p.write_text(tomli_w.dumps(spec))
    return p, spec


def test_expand_is_variants_times_grid(tmp_path, small_cfg):
    _, spec = _grid(tmp_path, small_cfg)
    name, runs = expand(spec, tmp_path)
    assert name == "g"
    assert [r.name for r in runs] == [
        "mean_lr=0.05",
        "mean_lr=0.1",
        "median_lr=0.05",
        "median_lr=0.1",
    ]
    assert runs[3].raw["server"]["aggregator"] == "median" and runs[3].raw["client"]["lr"] == 0.1
    assert all(r.raw["rounds"] == 2 for r in runs)


def test_bad_grid_entries(tmp_path, small_cfg):
    _, spec = _grid(tmp_path, small_cfg)
    with pytest.raises(ConfigError, match="grid: unknown key 'grids'"):
        expand(dict(spec, grids={}), tmp_path)
    with pytest.raises(ConfigError, match=r"client\.lrr: unknown key"):
        expand(dict(spec, grid={"client.lrr": [1]}), tmp_path)


def test_sweep_writes_table_and_resumes(tmp_path, small_cfg, capsys):
    grid, _ = _grid(tmp_path, small_cfg)
    out = tmp_path / "out"
    assert main(["sweep", str(grid), "--out", str(out), "-q"]) == 0
    table = (out / "comparison.md").read_text().splitlines()
    assert table[0].startswith("| label | variant | client.lr |") and len(table) == 6
    assert (out / "comparison.csv").exists() and (out / "accuracy.png").exists()
    before = (out / "mean_lr=0.1" / "metrics.jsonl").read_text()
    summary = json.loads((out / "median_lr=0.05" / "summary.json").read_text())
    assert main(["sweep", str(grid), "--out", str(out), "-q"]) == 0  # finished runs are kept
    assert (out / "mean_lr=0.1" / "metrics.jsonl").read_text() == before
    assert json.loads((out / "median_lr=0.05" / "summary.json").read_text()) == summary


@pytest.mark.parametrize(
    "grid", ["demo", "drag-baselines-cpu", "brdrag-attacks-20-cpu", "drag-c-cpu"]
)
def test_bundled_grids_expand(grid):
    from fedshield.sweep import read_grid

    spec, where = read_grid(grid=grid)
    _, runs = expand(spec, where)
    assert runs


def test_parallel_runs_get_their_share_of_the_cores(tmp_path, small_cfg, monkeypatch):
    """A preset's run.threads = 2 under `sweep -j 2` on 2 cores would oversubscribe them:
    each parallel run is capped at its share, and its config.toml says so."""
    import tomllib

    import torch

    from fedshield import config
    from fedshield.sweep import run_one

    raw = tomllib.loads(config.dump(config.validate(small_cfg | {"rounds": 1})))
    raw["run"]["threads"] = 2
    monkeypatch.delenv("FEDSHIELD_MAX_THREADS", raising=False)  # conftest's cap for workers
    before = torch.get_num_threads()
    try:
        run_one(raw, str(tmp_path / "capped"), 1, cap_threads=True)
        assert torch.get_num_threads() == 1
        run_one(raw, str(tmp_path / "alone"), 1)  # one run at a time: run.threads wins
        assert torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(before)
    saved = tomllib.loads((tmp_path / "capped" / "config.toml").read_text())
    assert saved["run"]["threads"] == 1
    alone = tomllib.loads((tmp_path / "alone" / "config.toml").read_text())
    assert alone["run"]["threads"] == 2


def test_a_cell_made_with_another_config_is_run_again_not_reused(tmp_path, small_cfg, caplog):
    """Only `rounds` was compared, so a sweep re-run with `--set client.lr=...`
    on the same --out reported the old runs (exit 0, every run still at the old value)."""
    import logging
    import tomllib

    grid, _ = _grid(tmp_path, small_cfg)
    out = tmp_path / "out"
    assert main(["sweep", str(grid), "--out", str(out), "-q"]) == 0
    before = (out / "mean_lr=0.1" / "metrics.jsonl").read_text()
    (out / "mean_lr=0.1" / "stale.txt").write_text("from the old config")
    with caplog.at_level(logging.WARNING, logger="fedshield"):
        code = main(["sweep", str(grid), "--out", str(out), "-q", "--set", "client.local_steps=1"])
    assert code == 0
    lines = [r.getMessage() for r in caplog.records if "another config" in r.getMessage()]
    assert len(lines) == 1 and "client.local_steps: 3 → 1" in lines[0], lines
    assert "4 runs" in lines[0]
    for run in ("mean_lr=0.05", "mean_lr=0.1", "median_lr=0.05", "median_lr=0.1"):
        saved = tomllib.loads((out / run / "config.toml").read_text())
        assert saved["client"]["local_steps"] == 1, run
    assert (out / "mean_lr=0.1" / "metrics.jsonl").read_text() != before
    assert not (out / "mean_lr=0.1" / "stale.txt").exists()  # no stale file survives
    rows = {r["label"]: r for r in csv.DictReader((out / "comparison.csv").open())}
    summary = json.loads((out / "mean_lr=0.1" / "summary.json").read_text())
    assert float(rows["mean_lr=0.1"]["final_test_acc"]) == pytest.approx(
        summary["final_test_acc"], abs=1e-3
    )
    caplog.clear()
    again = ["sweep", str(grid), "--out", str(out), "-q", "--set", "client.local_steps=1"]
    with caplog.at_level(logging.WARNING, logger="fedshield"):  # same config: all kept
        assert main(again) == 0
    assert not caplog.records


def test_an_unfinished_cell_of_another_config_is_not_continued(tmp_path, small_cfg):
    """An interrupted cell's checkpoint holds the old config: it starts over under the new
    one (it was a --resume error in the middle of the sweep, after the runs before it)."""
    import tomllib

    from fedshield.sweep_cells import cell_changes

    grid, spec = _grid(tmp_path, small_cfg, variant=[{"name": "mean", "set": []}])
    out = tmp_path / "out"
    assert main(["sweep", str(grid), "--out", str(out), "-q"]) == 0
    cell = out / "mean_lr=0.05"
    (cell / "summary.json").unlink()  # as if killed after its last checkpoint
    _, runs = expand(dict(spec, set=["rounds=2", "client.batch_size=8"]), tmp_path)
    assert cell_changes(runs[0].raw, cell) == {"client.batch_size": (16, 8)}
    assert main(["sweep", str(grid), "--out", str(out), "-q", "--set", "client.batch_size=8"]) == 0
    assert tomllib.loads((cell / "config.toml").read_text())["client"]["batch_size"] == 8
    rounds = [json.loads(line)["round"] for line in (cell / "metrics.jsonl").open()]
    assert rounds == [1, 2]


def test_kept_runs_of_other_code_are_reported(tmp_path, small_cfg, caplog):
    """The code version is reported, not enforced (fedshield.sweep_cells): a kept run of
    another commit is named in one warning line and kept."""
    import logging

    grid, _ = _grid(tmp_path, small_cfg, variant=[{"name": "mean", "set": []}])
    out = tmp_path / "out"
    assert main(["sweep", str(grid), "--out", str(out), "-q"]) == 0
    path = out / "mean_lr=0.1" / "summary.json"
    summary = json.loads(path.read_text())
    summary["provenance"]["fedshield"] = "0.0.1"
    path.write_text(json.dumps(summary))
    with caplog.at_level(logging.WARNING, logger="fedshield"):
        assert main(["sweep", str(grid), "--out", str(out), "-q"]) == 0
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 1 and "1 by fedshield 0.0.1 (mean_lr=0.1)" in lines[0], lines
    assert json.loads(path.read_text())["provenance"]["fedshield"] == "0.0.1"  # kept


def test_provenance_names_the_grid_not_the_last_run(tmp_path, small_cfg):
    """A reused loop variable made provenance.json's `grid` the last run to
    finish."""
    grid, _ = _grid(tmp_path, small_cfg)
    out = tmp_path / "out"
    assert main(["sweep", str(grid), "--out", str(out), "-q"]) == 0
    prov = json.loads((out / "provenance.json").read_text())
    assert prov["grid"] == "g" and len(prov["runs"]) == 4


def test_fedshield_max_threads_caps_run_threads_and_a_bad_value_names_the_variable(
    small_cfg, monkeypatch
):
    """A process sharing the cores (a test worker, a job beside others) caps every run's
    run.threads with $FEDSHIELD_MAX_THREADS; a value that is not a whole number is one clear
    error naming the variable."""
    import torch

    from fedshield import config
    from fedshield.errors import ConfigError
    from fedshield.runner import set_threads  # fedshield.threads, for a run config

    cfg = config.validate(small_cfg | {"run": {"threads": 2, "progress": False}})
    before = torch.get_num_threads()
    try:
        monkeypatch.setenv("FEDSHIELD_MAX_THREADS", "1")
        set_threads(cfg)
        assert torch.get_num_threads() == 1
        monkeypatch.setenv("FEDSHIELD_MAX_THREADS", "4")
        set_threads(cfg)
        assert torch.get_num_threads() == 2
        monkeypatch.setenv("FEDSHIELD_MAX_THREADS", "two")
        with pytest.raises(ConfigError, match=r"FEDSHIELD_MAX_THREADS='two'"):
            set_threads(cfg)
    finally:
        torch.set_num_threads(before)
