"""On Flower a dead node, a crashed ClientApp and a late reply are one event — a missing
row — counted once, named in the log and summary.json, never fatal. In
process over :class:`~fedshield.flower.local.LocalGrid`, whose lost nodes answer the way
a SuperLink does: an error reply from the SuperLink's own node id (1) carrying the lost
instruction's id (``Node Unavailable``), a node's own error (``ClientApp stopped
responding``), or nothing. ``test_flower_deployment_faults`` kills real processes."""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable

import pytest

pytest.importorskip("flwr")

from flwr.app import Error, Message
from flwr.common.constant import SUPERLINK_NODE_ID, ErrorCode
from test_flower import on_flower, raw_config

from fedshield import config
from fedshield.flower import codec
from fedshield.flower.experiment import FedshieldStrategy, FlowerRunError
from fedshield.flower.local import LocalGrid
from fedshield.flower.replies import match_replies
from fedshield.flower.server_app import prepare


def superlink_error(instruction: Message, code: int = ErrorCode.NODE_UNAVAILABLE) -> Message:
    """What a SuperLink answers for a node it lost: its own node id, the lost instruction."""
    out = Message(Error(code=code, reason="Error: Node Unavailable"), reply_to=instruction)
    out.metadata.__dict__["_src_node_id"] = SUPERLINK_NODE_ID
    return out


class LossyGrid(LocalGrid):
    """From round ``since`` on, the SuperLink reports the node of partition ``dead[0]``
    unavailable, partition ``dead[1]``'s ClientApp crashes, ``dead[2]`` never answers (a
    late reply); with ``stale``, a listed node 77 without a partition is a SuperNode killed
    before the run, which the SuperLink answers for."""

    STALE = 77

    def __init__(self, n: int, dead: tuple[int, ...] = (), since: int = 2, stale: bool = False):
        super().__init__(n)
        part = {c.node_config["partition-id"]: node for node, c in self.contexts.items()}
        kinds = ("unavailable", "crashed", "silent")
        self.fate = {part[k]: kind for k, kind in zip(dead, kinds, strict=False)}
        self.since = since
        self.stale = stale

    def get_node_ids(self) -> Iterable[int]:
        return [*self.contexts, *([self.STALE] if self.stale else [])]

    def push_messages(self, messages: Iterable[Message]) -> Iterable[str]:
        ids = []
        for msg in messages:
            fate = self._fate(msg)
            if fate is None:
                ids += super().push_messages([msg])
                continue
            mid = f"local-{len(self.sent)}"
            msg.metadata.__dict__["_message_id"] = mid
            self.sent.append(msg)
            ids.append(mid)
            if fate == "unavailable":
                self._replies[mid] = superlink_error(msg)
            elif fate == "crashed":
                crashed = Error(code=ErrorCode.CLIENT_APP_CRASHED, reason="ClientApp stopped")
                self._replies[mid] = Message(crashed, reply_to=msg)
        return ids

    def _fate(self, msg: Message) -> str | None:
        node = msg.metadata.dst_node_id
        if node == self.STALE:
            return "unavailable"
        records = msg.content.config_records
        if codec.TASK not in records or node not in self.fate:
            return None
        task = codec.Task.from_record(records[codec.TASK])
        return self.fate[node] if task.round >= self.since else None


def test_flower_error_for_a_lost_node_is_that_nodes_missing_row_counted_once():
    grid = LocalGrid(4)
    nodes = list(grid.contexts)
    sent = [Message(_hello(), dst_node_id=n, message_type="query") for n in nodes]
    ok = list(grid.send_and_receive(sent))  # every node answered; now lose some answers
    crashed = Message(Error(code=ErrorCode.CLIENT_APP_CRASHED, reason="x"), reply_to=sent[3])
    replies = [ok[0], superlink_error(sent[1]), crashed, superlink_error(sent[0])]
    m = match_replies(replies, sent)
    # node 0 answered: the SuperLink's word does not override it; node 2: nothing came
    assert [r.metadata.src_node_id for r in m.replies] == [nodes[0]]
    assert m.missing == dict(
        sorted(
            {
                nodes[1]: "node_unavailable",
                nodes[2]: "no_reply",
                nodes[3]: "clientapp_crashed",
            }.items()
        )
    )
    assert not m.rejected  # the SuperLink's replies are not strangers' (was: unsampled = 1)
    assert set(m.failures) == {nodes[1], nodes[3]}


def _hello():
    from flwr.app import ConfigRecord, RecordDict

    return RecordDict({"fs.hello": ConfigRecord({"num-clients": 4})})


def test_a_round_loses_three_clients_and_counts_each_once(tmp_path, caplog):
    raw = raw_config(rounds=2, server={"clients_per_round": 4, "aggregator": "median"})
    clean, _, _ = on_flower(raw)
    grid = LossyGrid(4, dead=(1, 2, 3))
    with caplog.at_level(logging.WARNING, logger="fedshield"):
        records, summary, _ = on_flower(raw, tmp_path, grid)
    # every instruction expires with its round (serve's default round timeout, 3600 s)
    assert {m.metadata.ttl for m in grid.sent} == {3600.0}
    assert [r["round"] for r in records] == [1, 2]  # every round ran
    assert "sys/dropped" not in records[0] and records[0]["test_acc"] == clean[0]["test_acc"]
    for r, c in zip(records[1:], clean[1:]):
        assert r["sys/dropped"] == 3 and r["sys/kept"] == 1  # each lost client once
        assert r["sys/rejected"] == 0 and "sys/rejected/unsampled" not in r
        assert r["sys/f"] == c["sys/f"]  # f of the sampled cohort, not of who answered
    assert summary["status"] == "ok"
    assert summary["dropped"] == {
        "total": 3,
        "rounds": 1,
        "by_client": {"1": 1, "2": 1, "3": 1},
        "by_reason": {"clientapp_crashed": 1, "no_reply": 1, "node_unavailable": 1},
    }
    assert json.loads((tmp_path / "summary.json").read_text())["dropped"] == summary["dropped"]
    report = (tmp_path / "report.md").read_text()
    assert "- **dropped**: 3 missing rows in 1 rounds (clientapp_crashed 1" in report
    line = next(x for x in caplog.messages if x.startswith("round 2: 3 of 4 sampled"))
    assert "client 1 (node " in line and "node_unavailable" in line
    assert "client 3 (node " in line and "no reply within round-timeout (3600 s)" in line


def test_a_clientapp_raising_after_rows_arrived_is_a_missing_row(monkeypatch):
    """Only a round in which every ClientApp raised before any row arrived stops the run
    (test_flower's test_client_failure_fails_the_run_naming_the_client); later it is a
    fault like any other."""
    from fedshield.flower import client_app

    real = client_app.local_update

    def flaky(sim, task, *args, **kwargs):
        if task.round >= 2 and task.client_id in (0, 2):
            raise RuntimeError("out of memory")
        return real(sim, task, *args, **kwargs)

    monkeypatch.setattr(client_app, "local_update", flaky)
    records, summary, _ = on_flower(raw_config(server={"clients_per_round": 4}))
    assert records[1]["sys/dropped"] == 2
    assert summary["dropped"]["by_reason"] == {"clientapp_error": 2}


def test_discovery_leaves_out_a_listed_node_flower_reports_unavailable():
    """A SuperNode killed and restarted within two heartbeats is listed twice (its dead
    id until the heartbeat expires): the run starts with the live nodes (it failed naming
    "node 1", the SuperLink's own id)."""
    sim = prepare(config.validate(raw_config()), None)
    grid = LossyGrid(4, stale=True)
    node_of = FedshieldStrategy(sim).connect(grid, timeout=5)
    assert sorted(node_of) == [0, 1, 2, 3] and grid.STALE not in node_of.values()
    # The stale node is the only one listed for partition 3: the error names it.
    (node3,) = (n for n, c in grid.contexts.items() if c.node_config["partition-id"] == 3)
    del grid.contexts[node3]
    want = r"partition-id\(s\) \[3\].*node\(s\) \[77\] are listed but unavailable"
    with pytest.raises(FlowerRunError, match=want):
        FedshieldStrategy(sim).connect(grid, timeout=0.5)
