import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import tomli_w
import torch

from fedshield import config
from fedshield.attacks.base import ATTACKS, UpdateAttack
from fedshield.errors import ConfigError
from fedshield.sim.builder import build
from fedshield.sim.engine import Simulator, sample_cohort

REPO = Path(__file__).resolve().parents[1]


def run(raw, out=None, resume=False):
    sim = Simulator(build(config.validate(raw)), out, resume=resume)
    return sim.run(), sim


def test_same_config_same_metrics(small_cfg, tmp_path):
    run(small_cfg, tmp_path / "a")
    run(small_cfg, tmp_path / "b")
    a = (tmp_path / "a" / "metrics.jsonl").read_text()
    assert a and a == (tmp_path / "b" / "metrics.jsonl").read_text()
    for f in ("config.toml", "summary.json", "checkpoint.pt", "test_acc.png", "report.md"):
        assert (tmp_path / "a" / f).exists(), f


def test_different_seed_differs(small_cfg, tmp_path):
    run(small_cfg, tmp_path / "a")
    small_cfg["seed"] = 1
    run(small_cfg, tmp_path / "b")
    a = (tmp_path / "a" / "metrics.jsonl").read_text()
    assert a != (tmp_path / "b" / "metrics.jsonl").read_text()


def test_cohort_sampling_is_seeded_and_without_replacement():
    c = sample_cohort(0, 3, 40, 15)
    assert len(set(c)) == 15 and c == sample_cohort(0, 3, 40, 15)
    assert c != sample_cohort(0, 4, 40, 15)


def test_stop_and_resume_matches_uninterrupted(small_cfg, tmp_path):
    run(small_cfg, tmp_path / "full")
    part = dict(small_cfg, rounds=2)
    run(part, tmp_path / "resumed")
    run(small_cfg, tmp_path / "resumed", resume=True)
    full = (tmp_path / "full" / "metrics.jsonl").read_text()
    assert full == (tmp_path / "resumed" / "metrics.jsonl").read_text()


def test_existing_run_is_never_overwritten(small_cfg, tmp_path):
    run(small_cfg, tmp_path / "a")
    with pytest.raises(ConfigError, match="already holds a run; pass --resume"):
        run(small_cfg, tmp_path / "a")


def test_resume_with_changed_config_is_refused(small_cfg, tmp_path):
    run(dict(small_cfg, rounds=2), tmp_path / "a")
    small_cfg["client"]["lr"] = 0.2
    with pytest.raises(ConfigError, match=r"different config \(changed: client.lr\)"):
        run(small_cfg, tmp_path / "a", resume=True)


def test_torn_writes_are_recovered(small_cfg, tmp_path):
    """A crash mid-write leaves a temp checkpoint and half a metrics line: resume ignores both."""
    run(small_cfg, tmp_path / "full")
    out = tmp_path / "torn"
    run(dict(small_cfg, rounds=2), out)
    (out / ".checkpoint.pt.abc.tmp").write_bytes(b"\x80garbage")
    with (out / "metrics.jsonl").open("a") as f:
        f.write('{"round": 3, "test_acc": 0.')
    run(small_cfg, out, resume=True)
    assert (out / "metrics.jsonl").read_text() == (tmp_path / "full" / "metrics.jsonl").read_text()


def _write_cfg(raw, path):
    path.write_text(tomli_w.dumps(raw))
    return path


@pytest.mark.slow
def test_sigkill_mid_run_then_resume(small_cfg, tmp_path):
    raw = dict(small_cfg, rounds=12, run={"progress": False, "threads": 1})
    raw["client"] = dict(raw["client"], local_steps=40)
    cfg_file = _write_cfg(raw, tmp_path / "c.toml")
    cmd = [sys.executable, "-m", "fedshield", "run", str(cfg_file), "-q"]
    env = dict(os.environ, PYTHONPATH=str(REPO / "src"))
    subprocess.run([*cmd, "--out", str(tmp_path / "full")], check=True, env=env, timeout=300)
    out = tmp_path / "killed"
    proc = subprocess.Popen([*cmd, "--out", str(out)], env=env)
    deadline = time.time() + 120
    while not (out / "checkpoint.pt").exists() and time.time() < deadline:
        time.sleep(0.02)
    time.sleep(0.3)  # somewhere inside a later round or checkpoint write
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    subprocess.run([*cmd, "--out", str(out), "--resume"], check=True, env=env, timeout=300)
    full = (tmp_path / "full" / "metrics.jsonl").read_text()
    assert full == (out / "metrics.jsonl").read_text()


if "test_nan" not in ATTACKS:

    @ATTACKS.register("test_nan")
    class _NaNAttack(UpdateAttack):
        """Test-only: Byzantine rows become NaN."""

        def __call__(self, updates, byzantine, *, generator=None):
            out = updates.clone()
            out[byzantine] = float("nan")
            return out


def test_nonfinite_updates_never_reach_theta(small_cfg):
    small_cfg["attack"] = {"name": "test_nan", "fraction": 0.5}
    summary, sim = run(small_cfg)
    assert torch.isfinite(sim.state.params).all()
    assert sum(r["sys/rejected"] for r in sim.records) == sum(r["byz/count"] for r in sim.records)
    assert sum(r["byz/count"] for r in sim.records) > 0


def test_per_round_mode_selects_exactly_floor_ws(small_cfg):
    small_cfg["attack"] = {"name": "sign_flip", "fraction": 0.5, "mode": "per_round"}
    _, sim = run(small_cfg)
    assert all(r["byz/count"] == 1 for r in sim.records)  # floor(0.5 * 3)


def test_label_flip_poisons_only_byzantine_clients(small_cfg):
    small_cfg["attack"] = {"name": "label_flip", "fraction": 0.5}
    exp = build(config.validate(small_cfg))
    sim = Simulator(exp)
    byz = exp.byzantine[0]
    benign = next(k for k in range(6) if k not in exp.byzantine)
    assert len(exp.byzantine) == 3
    assert torch.equal(sim.client_data(byz, True).y, 9 - exp.clients[byz].y)
    assert sim.client_data(benign, False) is exp.clients[benign]


def test_attack_fraction_without_attack_is_config_error(small_cfg):
    small_cfg["attack"] = {"fraction": 0.2}
    with pytest.raises(ConfigError, match="attack.fraction=0.2 but attack.name='none'"):
        build(config.validate(small_cfg))


def _mnist(partition, beta=0.5):
    return {
        "name": f"fedavg-{partition}",
        "seed": 0,
        "rounds": 20,
        "data": {"dataset": "mnist5k", "num_clients": 20, "partition": partition, "beta": beta},
        "model": {"name": "cnn_small"},
        "client": {"lr": 0.1, "batch_size": 32, "local_steps": 10},
        "server": {"clients_per_round": 10},
        "eval": {"every": 20},
        "run": {"progress": False},
    }


@pytest.mark.slow
def test_fedavg_mnist5k_iid_reaches_90_and_dirichlet_is_lower():
    iid, _ = run(_mnist("iid"))
    skew, _ = run(_mnist("dirichlet", beta=0.1))
    assert iid["final_test_acc"] >= 0.90
    assert skew["final_test_acc"] < iid["final_test_acc"] - 0.05
