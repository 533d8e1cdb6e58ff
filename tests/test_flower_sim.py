"""Flower's simulation engine (Ray) vs the in-process simulator: same seed, same selected
clients ⇒ same per-round metrics. One Ray session serves all configs (run_many), so the
module pays Ray's start-up once."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("flwr")
pytest.importorskip("ray")

from test_flower import FEDCART, assert_same, raw_config, simulate

from fedshield import config

# starts processes: one worker with the other such modules (tests/test_suite_setup.py)
pytestmark = pytest.mark.xdist_group("processes")

REPO = Path(__file__).resolve().parents[1]

CONFIGS = {
    "fedavg": raw_config(),
    "brdrag": raw_config(server={"algorithm": "brdrag"}, data={"root_size": 100}),
    # Client-side method with per-client state that must survive on the Ray-backed nodes.
    "scaffold": raw_config(
        client={"algorithm": "scaffold"}, server={"algorithm": "scaffold"}, rounds=3
    ),
    # FedCART's extras (prototypes, counts, head shape) through the codec and Ray.
    "fedcart": raw_config(**FEDCART),
}


@pytest.fixture(scope="module")
def flower_runs(tmp_path_factory):
    from fedshield.flower.simulation import run_many

    base = tmp_path_factory.mktemp("flower")
    runs = [(config.validate(raw), base / name) for name, raw in CONFIGS.items()]
    summaries = run_many(runs, quiet=True)
    return {name: (base / name, s) for name, s in zip(CONFIGS, summaries)}


@pytest.mark.parametrize("name", list(CONFIGS))
def test_ray_simulation_matches_simulator(flower_runs, name):
    out, summary = flower_runs[name]
    records = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert_same(simulate(CONFIGS[name]), records)
    for f in ("summary.json", "checkpoint.pt", "config.toml"):
        assert (out / f).exists(), f
    assert summary["rounds"] == CONFIGS[name]["rounds"]


@pytest.mark.slow  # a fresh interpreter + its own Ray start: ~45 s on 2 busy cores
def test_cli_backend_flower(tmp_path):
    """``fedshield run --backend flower`` end to end (a separate process, its own Ray),
    with the simulator's progress bar: rounds, accuracy, last round's time, ETA."""
    cfg = tmp_path / "exp.toml"
    cfg.write_text(config.dump(config.validate(raw_config(rounds=1, run={"progress": True}))))
    out = tmp_path / "run"
    proc = subprocess.run(
        [sys.executable, "-m", "fedshield", "run", str(cfg), "--backend", "flower"]
        + ["--out", str(out)],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "PYTHONPATH": str(REPO / "src"), "COLUMNS": "160"},
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert json.loads((out / "summary.json").read_text())["rounds"] == 1
    assert "final acc" in proc.stdout
    acc = json.loads((out / "summary.json").read_text())["final_test_acc"]
    bar = re.search(r"flower-test .* 1/1 acc (\S+) last round \d+\.\ds .*eta", proc.stdout)
    assert bar and float(bar.group(1)) == pytest.approx(acc, abs=1e-4), proc.stdout[-2000:]
