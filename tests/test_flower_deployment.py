"""A real Flower deployment on 127.0.0.1: one SuperLink, two SuperNodes (subprocesses,
insecure mode, free ports), ``flwr run`` of the fedshield app for two rounds, clean
shutdown. The run's metrics must equal the in-process simulator's (SCAFFOLD, so the
client state kept by the SuperNodes between rounds is checked too)."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytest.importorskip("flwr")

from test_flower import assert_same, simulate  # noqa: E402

from fedshield import config  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
OVERRIDES = (
    "rounds=2 data.dataset='digits' data.num_clients=2 server.clients_per_round=2 "
    "model.name='mlp' model.params.hidden=32 client.local_steps=3 client.batch_size=16 "
    "client.lr=0.1 eval.every=1 run.device='cpu' "
    # SCAFFOLD: round 2 needs each node's h_m from round 1, kept in its Context.state.
    "client.algorithm='scaffold' server.algorithm='scaffold'"
)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for_port(port: int, proc: subprocess.Popen, timeout: float = 90.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"process exited with {proc.returncode} before listening")
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.5)
    raise TimeoutError(f"nothing listens on 127.0.0.1:{port} after {timeout}s")


def stop(proc: subprocess.Popen) -> None:
    """SIGTERM the process group we created for ``proc`` (its SuperExec and ClientApp
    children included), SIGKILL what is left after 20 s."""
    with contextlib.suppress(ProcessLookupError, subprocess.TimeoutExpired):
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=20)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)  # stragglers in the group (SuperExec, ClientApps)
    proc.wait(timeout=10)


def write_app(app: Path, out: Path) -> None:
    """A minimal Flower app directory whose components are fedshield's."""
    app.mkdir()
    (app / "pyproject.toml").write_text(
        f"""[project]
name = "fedshield-deploy-test"
version = "0.1.0"
description = "fedshield on a local SuperLink"
license = "Apache-2.0"
dependencies = []

[tool.flwr.app]
publisher = "fedshield"

[tool.flwr.app.components]
serverapp = "fedshield.flower.server_app:app"
clientapp = "fedshield.flower.client_app:app"

[tool.flwr.app.config]
preset = "demo"
overrides = "{OVERRIDES}"
out = "{out}"
"""
    )


@pytest.mark.slow
def test_superlink_two_supernodes_two_rounds(tmp_path):
    link, node_ports = free_port(), [free_port(), free_port()]
    out, home = tmp_path / "out", tmp_path / "flwr-home"
    write_app(tmp_path / "app", out)
    home.mkdir()
    (home / "config.toml").write_text(
        f'[superlink]\ndefault = "local-test"\n\n[superlink.local-test]\n'
        f'address = "127.0.0.1:{link}"\ninsecure = true\n'
    )
    env = {
        **os.environ,
        "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}",  # flower-superexec & co.
        "PYTHONPATH": str(REPO / "src"),
        "FLWR_HOME": str(home),
        "FLWR_TELEMETRY_ENABLED": "0",
        "FLWR_DISABLE_UPDATE_CHECK": "1",
    }
    procs: list[subprocess.Popen] = []

    def start(name: str, *args: str) -> subprocess.Popen:
        log = (tmp_path / f"{name}.log").open("w")
        proc = subprocess.Popen(
            [str(BIN / args[0]), *args[1:]],
            env=env,
            cwd=tmp_path,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # own process group: stop() reaches its children
        )
        procs.append(proc)
        return proc

    try:
        superlink = start(
            "superlink",
            "flower-superlink",
            "--insecure",
            "--port",
            str(link),
            "--disable-runtime-dependency-installation",
        )
        wait_for_port(link, superlink)
        for i, port in enumerate(node_ports):
            start(
                f"supernode{i}",
                "flower-supernode",
                "--insecure",
                "--superlink",
                f"127.0.0.1:{link}",
                "--port",
                str(port),
                "--node-config",
                f"partition-id={i} num-partitions=2",
            )
        run = subprocess.run(
            [str(BIN / "flwr"), "run", str(tmp_path / "app"), "local-test", "--stream"],
            env=env,
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=480,
        )
        logs = "\n".join(p.read_text()[-1500:] for p in sorted(tmp_path.glob("*.log")))
        assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:] + logs
        assert (out / "summary.json").exists(), run.stdout[-3000:] + logs
    finally:
        for proc in reversed(procs):
            stop(proc)

    assert all(p.returncode is not None for p in procs)
    records = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["round"] for r in records] == [1, 2] and "test_acc" in records[-1]
    assert (out / "checkpoint.pt").exists()
    # Same experiment in process: the deployment reproduces it.
    raw = config.load(preset="demo", overrides=OVERRIDES.split()).model_dump(mode="json")
    assert_same(simulate(raw), records)


def test_app_config_is_a_valid_flower_app():
    """pyproject.toml declares the fedshield components (``flwr run .`` works)."""
    import tomllib

    from flwr.cli.config_utils import load_and_validate

    load_and_validate(REPO / "pyproject.toml", check_module=False)  # raises if invalid
    cfg = tomllib.loads((REPO / "pyproject.toml").read_text())
    components = cfg["tool"]["flwr"]["app"]["components"]
    assert components == {
        "serverapp": "fedshield.flower.server_app:app",
        "clientapp": "fedshield.flower.client_app:app",
    }
