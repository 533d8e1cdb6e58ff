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
