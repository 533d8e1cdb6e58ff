"""``fedshield sweep --backend ray`` on a local Ray instance with 2 CPUs (2 workers): the
same files as the local sweep, resumed exactly as the local sweep resumes."""

from __future__ import annotations

import json
import shutil

import pytest

pytest.importorskip("ray")

from test_sweep import _grid

from fedshield.cli import main
from fedshield.errors import ConfigError
from fedshield.sweep import RunTask
from fedshield.sweep_ray import TOKEN_FILE, RayBackend, _task

# starts processes: one worker with the other such modules (tests/test_suite_setup.py)
pytestmark = pytest.mark.xdist_group("processes")


@pytest.fixture(scope="module")
def local_ray():
    import os

    import ray

    os.environ.setdefault("RAY_ACCEL_ENV_VAR_OVERRIDE_ON_ZERO", "0")  # as RayBackend does
    ray.init(num_cpus=2, include_dashboard=False, logging_level="ERROR")
    yield ray
    ray.shutdown()


def _summary(path):
    """A run's results (wall times and provenance, which says where it ran, left out)."""
    drop = ("wall", "provenance")
    return {k: v for k, v in json.loads(path.read_text()).items() if not any(d in k for d in drop)}


@pytest.mark.slow
def test_ray_sweep_equals_local_sweep_and_resumes(tmp_path, small_cfg, local_ray):
    small_cfg["run"]["threads"] = 1  # both backends compute with one thread per run
    grid, _ = _grid(tmp_path, small_cfg)
    local, on_ray = tmp_path / "local", tmp_path / "ray"
    assert main(["sweep", str(grid), "--out", str(local), "-q"]) == 0
    names = sorted(p.parent.name for p in local.glob("*/summary.json"))
    assert len(names) == 4

    # An interrupted Ray sweep: every run stopped after round 1 (checkpoint on disk) ...
    ray_args = ["sweep", str(grid), "--out", str(on_ray), "-q", "--backend", "ray"]
    assert main([*ray_args, "--set", "rounds=1"]) == 0
    # ... except one that had finished.
    shutil.rmtree(on_ray / names[0])
    shutil.copytree(local / names[0], on_ray / names[0])
    kept = {p.name: p.stat().st_mtime_ns for p in (on_ray / names[0]).iterdir()}

    assert main([*ray_args, "--cpus-per-run", "1"]) == 0
    assert {p.name: p.stat().st_mtime_ns for p in (on_ray / names[0]).iterdir()} == kept
    for name in names:
        a, b = local / name, on_ray / name
        assert (a / "metrics.jsonl").read_bytes() == (b / "metrics.jsonl").read_bytes(), name
        assert _summary(a / "summary.json") == _summary(b / "summary.json"), name
    assert (local / "comparison.md").read_text() == (on_ray / "comparison.md").read_text()
    assert not (on_ray / TOKEN_FILE).exists()


@pytest.mark.slow
def test_ray_sweep_refuses_resources_no_node_has(tmp_path, small_cfg, local_ray):
    grid, _ = _grid(tmp_path, small_cfg)
    with pytest.raises(ConfigError, match="--cpus-per-run=3: no node .* largest has 2"):
        list(RayBackend(cpus=3).map([RunTask("r", small_cfg, str(tmp_path / "r"))]))
    args = ["sweep", str(grid), "--out", str(tmp_path / "out"), "--backend", "ray"]
    assert main([*args, "--gpus-per-run", "1", "-q"]) == 2
    assert not list((tmp_path / "out").glob("*/metrics.jsonl"))  # nothing ran


def test_ray_task_needs_the_drivers_output_directory(tmp_path, small_cfg):
    with pytest.raises(ConfigError, match="not the driver's on node .* --out must be"):
        _task(small_cfg, str(tmp_path / "run"), 1, "token")
    (tmp_path / TOKEN_FILE).write_text("another sweep")
    with pytest.raises(ConfigError, match="not the driver's"):
        _task(small_cfg, str(tmp_path / "run"), 1, "token")


def test_sweep_backend_flags_are_checked(tmp_path, small_cfg, capsys):
    grid, _ = _grid(tmp_path, small_cfg)
    args = ["sweep", str(grid), "--out", str(tmp_path / "out")]
    assert main([*args, "--address", "auto"]) == 2
    assert "--address needs --backend ray" in capsys.readouterr().err
    assert main([*args, "--backend", "ray", "-j", "2"]) == 2
    assert "-j/--jobs is for --backend local" in capsys.readouterr().err
    with pytest.raises(ConfigError, match="--cpus-per-run=0"):
        RayBackend(cpus=0)
