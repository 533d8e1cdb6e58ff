"""A real deployment loses a SuperNode and a ClientApp mid-round and finishes its run
(docs/deployment.md, "Missing rows"): the secure deployment of docs/deployment.md
(``test_flower_deployment``'s harness) with three SuperNodes on 127.0.0.1, two rounds of all three
clients, ``round-timeout`` 120 s. When round 1 is recorded, SuperNode 2 is SIGKILLed with its
children (a dead host) and, once SuperNode 1's ClientApp process trains round 2, that process is
SIGKILLed (as an OOM kill would).

Flower 1.42 has no option for its heartbeats (30 s, two missed ones expire a node or a
ClientApp's task), so Flower reports both losses ~60 s after the kills: the round timeout is
set above that, and the round ends on Flower's two error replies — the SuperLink's "Node
Unavailable" for the dead SuperNode (sent from the SuperLink's own node id, which was counted
a second time as an unsampled reply before) and SuperNode 1's "ClientApp stopped responding"
(which failed the whole run before). A timeout below 60 s ends such a round at the timeout
instead (``no_reply``); the test takes ~2 minutes either way.

Asserted: the run exits 0 with ``status: ok``; round 2 counts each lost client once
(``sys/dropped = 2``, nothing in ``sys/rejected``) with Flower's reasons and ends before the
round timeout; summary.json and report.md name the two clients; the ServerApp's log names
both clients and their nodes.
"""

from __future__ import annotations

import json
import os
import signal
import time
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

import pytest

pytest.importorskip("flwr")

from test_flower_deployment import Federation, deployment_config, run_experiment, start_secure

# starts processes: one worker with the other such modules (tests/test_suite_setup.py)
pytestmark = pytest.mark.xdist_group("processes")

T = TypeVar("T")
ROUND_TIMEOUT = 120.0  # above Flower's heartbeat expiry (60 s): the round ends on its reports


def group_processes(pgid: int, name: str) -> list[int]:
    """Pids of the processes of group ``pgid`` whose command line contains ``name``."""
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:  # gone meanwhile
            continue
        # the fields after the parenthesised command: state ppid pgrp ...
        if int(stat.rsplit(")", 1)[1].split()[2]) == pgid and name in cmdline:
            pids.append(int(entry.name))
    return pids


def wait_until(condition: Callable[[], T], what: str, fed: Federation, timeout: float = 240) -> T:
    """``condition()``'s first true value, polled every 10 ms for ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while not (value := condition()):
        assert time.monotonic() < deadline, f"{what} after {timeout}s\n{fed.logs()}"
        time.sleep(0.01)
    return value


def loaded_torch(pid: int) -> bool:
    try:
        return "libtorch" in Path(f"/proc/{pid}/maps").read_text()
    except OSError as err:  # it exited: it replied before it could be killed
        raise AssertionError(f"ClientApp {pid} exited before it was killed") from err


@pytest.mark.slow
def test_killed_supernode_and_clientapp_are_missing_rows(tmp_path):
    fed = Federation(tmp_path)
    try:
        start_secure(fed, nodes=3)
        raw = deployment_config(rounds=2)
        raw["data"]["num_clients"] = raw["server"]["clients_per_round"] = 3
        proc = run_experiment(fed, raw, "faults", round_timeout=ROUND_TIMEOUT)
        metrics = fed.root / "faults" / "metrics.jsonl"
        wait_until(lambda: metrics.exists() and metrics.read_text().strip(), "no round 1", fed)
        node1 = fed.procs["supernode1"].pid
        # Round 1's ClientApp processes may linger after replying; round 2's is a new one.
        before = set(group_processes(node1, "flwr-clientapp"))
        os.killpg(fed.procs["supernode2"].pid, signal.SIGKILL)  # a dead host, mid-round 2

        def round2_app() -> list[int]:
            return sorted(set(group_processes(node1, "flwr-clientapp")) - before)

        app = wait_until(round2_app, "no round-2 ClientApp on SuperNode 1", fed)[0]
        # Killed once it trains: it has pulled its message and loads torch (a ClientApp
        # killed before it pulls is started again by the SuperNode).
        wait_until(lambda: loaded_torch(app), "the ClientApp never loaded torch", fed)
        os.kill(app, signal.SIGKILL)
        assert proc.wait(timeout=500) == 0, fed.logs()
    finally:
        fed.stop_all()

    out = fed.root / "faults"
    records = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["round"] for r in records] == [1, 2]
    assert "sys/dropped" not in records[0], fed.log("run-faults")[-3000:]  # a healthy round
    assert records[1]["sys/dropped"] == 2, fed.log("supernode1")[-3000:]
    assert records[1]["sys/rejected"] == 0  # Flower's answers for the lost nodes: not replies
    timing = [json.loads(x) for x in (out / "timing.jsonl").read_text().splitlines()]
    assert timing[1]["wall_s"] < ROUND_TIMEOUT - 5  # ended on Flower's two reports
    summary = json.loads((out / "summary.json").read_text())
    assert summary["status"] == "ok"
    dropped = summary["dropped"]
    assert dropped["total"] == 2 and dropped["rounds"] == 1
    assert dropped["by_client"] == {"1": 1, "2": 1}
    assert dropped["by_reason"] == {"clientapp_crashed": 1, "node_unavailable": 1}
    assert "- **dropped**: 2 missing rows in 1 rounds" in (out / "report.md").read_text()
    log = fed.log("run-faults")
    assert "round 2: 2 of 3 sampled clients sent no row" in log, log[-3000:]
    assert "client 1 (node " in log and "client 2 (node " in log
