"""The Flower app without Ray: codec, attack placement, node mapping, and strategy +
ClientApp parity with the in-process simulator over an in-process Grid."""

from __future__ import annotations

import json
import re
from typing import Any

import pytest
import torch

pytest.importorskip("flwr")

from flwr.app import MessageType, RecordDict

from fedshield import config
from fedshield.attacks.base import ATTACKS
from fedshield.core.context import ClientUpdate, Payload
from fedshield.errors import ConfigError
from fedshield.flower import client_app, codec
from fedshield.flower.byzantine import local_update_attack, runs_on_client
from fedshield.flower.experiment import FedshieldStrategy, FlowerRunError
from fedshield.flower.local import LocalGrid
from fedshield.flower.server_app import prepare, serve, settings_from_run_config
from fedshield.sim.builder import build, load_plugins
from fedshield.sim.engine import Simulator


def raw_config(**sections: Any) -> dict[str, Any]:
    """A seconds-long config on bundled digits (4 clients, 3 per round, mlp)."""
    raw: dict[str, Any] = {
        "name": "flower-test",
        "seed": 0,
        "rounds": 2,
        "data": {"dataset": "digits", "num_clients": 4, "partition": "iid"},
        "model": {"name": "mlp", "params": {"hidden": 32}},
        "client": {"lr": 0.1, "batch_size": 16, "local_steps": 3},
        "server": {"clients_per_round": 3},
        "eval": {"every": 1},
        "checkpoint": {"every": 1},
        "run": {"progress": False, "device": "cpu"},
    }
    for key, value in sections.items():
        if isinstance(value, dict):
            raw.setdefault(key, {}).update(value)
        else:
            raw[key] = value
    return raw


def simulate(raw: dict[str, Any]) -> list[dict[str, Any]]:
    sim = Simulator(build(config.validate(raw)))
    sim.run()
    return sim.records


def on_flower(raw: dict[str, Any], out=None, grid: LocalGrid | None = None):
    sim = prepare(config.validate(raw), out)
    grid = grid or LocalGrid(raw["data"]["num_clients"])
    summary = serve(grid, sim)
    return sim.records, summary, grid


def train_tasks(grid: LocalGrid) -> list[tuple[int, codec.Task]]:
    """(destination node, task) of every train instruction the strategy sent."""
    return [
        (m.metadata.dst_node_id, codec.Task.from_record(m.content.config_records[codec.TASK]))
        for m in grid.sent
        if m.metadata.message_type == MessageType.TRAIN
    ]


def assert_same(a: list[dict[str, Any]], b: list[dict[str, Any]], rel: float = 1e-6) -> None:
    """Per-round metrics agree: same rounds and keys, floats within ``rel``."""
    assert [r["round"] for r in a] == [r["round"] for r in b]
    for ra, rb in zip(a, b):
        assert set(ra) == set(rb), (sorted(ra), sorted(rb))
        for k, v in ra.items():
            if isinstance(v, float):
                assert rb[k] == pytest.approx(v, rel=rel, abs=1e-9), (ra["round"], k)
            else:
                assert rb[k] == v, (ra["round"], k)


# -- codec ------------------------------------------------------------------------------


def test_payload_and_update_roundtrip_exactly():
    g = torch.Generator().manual_seed(0)
    payload = Payload(
        torch.randn(7, generator=g), torch.randn(3, generator=g), {"h": torch.randn(7)}
    )
    back = codec.decode_payload(codec.encode_payload(payload))
    assert torch.equal(back.params, payload.params) and torch.equal(back.buffers, payload.buffers)
    assert set(back.extras) == {"h"} and torch.equal(back.extras["h"], payload.extras["h"])

    update = ClientUpdate(
        client_id=3,
        delta=torch.randn(7, generator=g, dtype=torch.float64),
        num_examples=42,
        buffers=torch.zeros(0),
        mask=torch.tensor([True, False] * 3 + [True]),
        extras={"dh": torch.randn(7), "proto/3": torch.randn(2, 5)},
        metrics={"train/loss": 0.25, "comm/bytes": 96.0},
    )
    u = codec.decode_update(codec.encode_update(update))
    assert (u.client_id, u.num_examples, u.metrics) == (3, 42, update.metrics)
    assert u.delta.dtype == torch.float64 and torch.equal(u.delta, update.delta)
    assert torch.equal(u.mask, update.mask) and u.buffers.shape == (0,)
    assert all(torch.equal(u.extras[k], v) for k, v in update.extras.items())


def test_fedcart_extras_roundtrip_exactly():
    """FedCART's real payload and upload (prototypes [C, C·D + C], counts [C], head shape,
    the 0-d prototype request) come out of the codec bit for bit."""
    sim = Simulator(build(config.validate(raw_config(**FEDCART))))
    plan = sim.begin_round(1)
    payload = codec.decode_payload(codec.encode_payload(plan.payload))
    sent = plan.payload.extras["fedcart/proto_head"]
    assert payload.extras["fedcart/proto_head"].shape == sent.shape == ()
    assert torch.equal(payload.extras["fedcart/proto_head"], sent)
    update = sim.client_update(plan, plan.ctx.cohort[0])
    assert {"fedcart/prototypes", "fedcart/counts", "fedcart/head_shape"} <= set(update.extras)
    back = codec.decode_update(codec.encode_update(update))
    assert set(back.extras) == set(update.extras)
    for name, value in update.extras.items():
        got = back.extras[name]
        assert got.dtype == value.dtype and got.shape == value.shape, name
        assert torch.equal(got, value), name
    c, d = (int(v) for v in update.extras["fedcart/head_shape"])
    assert update.extras["fedcart/prototypes"].shape == (c, c * d + c)


def test_task_roundtrip():
    task = codec.Task(5, 2, True, False, True, "seed = 1\n", "abc")
    assert codec.Task.from_record(task.to_record()) == task
    assert task.state_key.endswith(".abc")


# -- where attacks run ------------------------------------------------------------------


def test_attack_placement():
    load_plugins()
    placement = {name: runs_on_client(ATTACKS.build(name)) for name in ATTACKS.package_names()}
    # Data and own-update attacks on the malicious SuperNode; omniscient ones in the strategy.
    assert placement["label_flip"] and placement["sign_flip"] and placement["scaling"]
    for name in ("min_max", "min_sum", "alie", "ipm", "noise"):
        assert not placement[name], name
    # Defense-aware attacks need the server's rule and every row: in the strategy.
    for name in ("alie_opt", "ipm_opt", "fang_krum", "fang_trim", "agr_tailored", "mimic",
                 "adaptive_root", "adaptive_root_est"):  # fmt: skip
        assert not placement[name] and not local_update_attack(ATTACKS.build(name)), name
    # model_replacement: poisoned on the SuperNode, its boost (γ = S/f) in the strategy.
    mr = ATTACKS.build("model_replacement")
    assert runs_on_client(mr) and not local_update_attack(mr)
    assert not runs_on_client(None)


# -- parity with the simulator ----------------------------------------------------------

# FedCART (FedCART paper): prototypes, class counts and the head shape travel as update extras,
# the prototype request as a payload extra; long-tailed digits so class counts differ.
FEDCART: dict[str, Any] = {
    "data": {"partition": "dirichlet", "beta": 0.5, "long_tail": {"rho": 10}},
    "model": {"name": "dual_head", "params": {"backbone": "mlp", "hidden": 16}},
    "client": {"algorithm": "fedcart", "batch_size": 32, "params": {"steps": 2}},
    "server": {
        "algorithm": "fedcart",
        "params": {"match_iters": 10, "retrain_steps": 20, "num_virtual": 10},
    },
}

PARITY = {
    "fedavg": {},
    "brdrag": {"server": {"algorithm": "brdrag"}, "data": {"root_size": 100}},
    "fedprox": {"client": {"algorithm": "fedprox"}},
    "scaffold": {
        "client": {"algorithm": "scaffold"},
        "server": {"algorithm": "scaffold"},
        "rounds": 3,  # a client meets its own h_m again: state must survive on the node
    },
    "fedacg": {"client": {"algorithm": "fedacg"}, "server": {"algorithm": "fedacg"}},
    "feddyn": {  # α broadcast as a payload extra, ∇L_k(θ_k^{t−1}) kept on the node
        "client": {"algorithm": "feddyn"},
        "server": {"algorithm": "feddyn", "clients_per_round": 2},
        "rounds": 4,
    },
    "drag": {"server": {"algorithm": "drag"}},
    "median+sign_flip": {
        "server": {"aggregator": "median"},
        "attack": {"name": "sign_flip", "fraction": 0.25},
    },
    "min_max": {"attack": {"name": "min_max", "fraction": 0.5, "mode": "per_round"}},
    "noise": {"attack": {"name": "noise", "fraction": 0.25}},
    "label_flip": {"attack": {"name": "label_flip", "fraction": 0.25}},
    # Defense-aware, known r^t: the strategy computes the root update for the attack too.
    "adaptive_root": {
        "server": {"algorithm": "brdrag"},
        "data": {"root_size": 100},
        "attack": {"name": "adaptive_root", "fraction": 0.5, "mode": "per_round"},
    },
    # Poisoned on the SuperNode, boosted (γ = S/f) in the strategy.
    "model_replacement": {"attack": {"name": "model_replacement", "fraction": 0.25}},
    "fedcart": FEDCART,
}


# The three (FedAvg, BR-DRAG, a client-side method) and one attack per placement
# run by default; the rest of the matrix is marked slow to keep the default suite short.
FAST = {
    "fedavg", "brdrag", "scaffold", "median+sign_flip", "min_max", "label_flip", "fedcart",
    "adaptive_root", "model_replacement",
}  # fmt: skip


@pytest.mark.parametrize(
    "name", [n if n in FAST else pytest.param(n, marks=pytest.mark.slow) for n in PARITY]
)
def test_flower_matches_simulator(name):
    raw = raw_config(**PARITY[name])
    flower, _, _ = on_flower(raw)
    assert_same(simulate(raw), flower)


@pytest.mark.parametrize("name", ["fedavg", "brdrag", "fedcart"])
def test_flower_equals_the_sequential_simulator_exactly(name):
    # Flower's clients train one at a time; against the simulator's sequential trainer every
    # metric, train/loss included, is bit-identical (the vectorised trainer agrees with both
    # to float32 rounding of the per-client losses, docs/vectorized.md).
    raw = raw_config(**PARITY[name])
    raw["run"]["vectorize"] = False
    flower, _, _ = on_flower(raw)
    assert simulate(raw) == flower


def test_outputs_match_simulator_files(tmp_path):
    raw = raw_config()
    Simulator(build(config.validate(raw)), tmp_path / "sim").run()
    on_flower(raw, tmp_path / "flower")
    for name in ("config.toml", "summary.json", "checkpoint.pt", "report.md", "timing.jsonl"):
        assert (tmp_path / "flower" / name).exists(), name
    assert_same(
        [json.loads(x) for x in (tmp_path / "sim" / "metrics.jsonl").read_text().splitlines()],
        [json.loads(x) for x in (tmp_path / "flower" / "metrics.jsonl").read_text().splitlines()],
    )
    summary = json.loads((tmp_path / "flower" / "summary.json").read_text())
    assert summary["rounds"] == 2 and "final_test_acc" in summary


def test_resume_on_flower_matches_uninterrupted(tmp_path):
    raw = raw_config(rounds=4)
    on_flower(dict(raw, rounds=2), tmp_path / "run")
    sim = prepare(config.validate(raw), tmp_path / "run", resume=True)
    strategy = FedshieldStrategy(sim)
    assert (strategy.first_round, strategy.num_rounds) == (3, 2)
    serve(LocalGrid(4), sim)
    resumed = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert_same(simulate(raw), resumed)


def test_byzantine_rows_are_forged_where_documented():
    raw = raw_config(attack={"name": "min_max", "fraction": 0.5, "mode": "per_round"})
    _, _, grid = on_flower(raw)
    attackers = [t for _, t in train_tasks(grid) if t.byzantine]
    assert attackers and not any(t.train or t.local_attack for t in attackers)

    raw = raw_config(attack={"name": "sign_flip", "fraction": 0.25})
    _, _, grid = on_flower(raw)
    assert any(t.byzantine and t.train and t.local_attack for _, t in train_tasks(grid))


# -- node mapping and failures ----------------------------------------------------------


def test_node_mapping_is_by_partition_id_not_node_id():
    raw = raw_config()
    grids = [LocalGrid(4, seed=s) for s in (1, 2)]
    for grid in grids:
        on_flower(raw, grid=grid)
    for grid in grids:
        by_node = {n: c.node_config["partition-id"] for n, c in grid.contexts.items()}
        assert all(by_node[node] == task.client_id for node, task in train_tasks(grid))
    cohorts = [[task.client_id for _, task in train_tasks(g)] for g in grids]
    assert cohorts[0] == cohorts[1]  # random node ids, same clients selected


def test_duplicate_or_missing_partitions_fail_clearly():
    sim = prepare(config.validate(raw_config()), None)
    grid = LocalGrid(4)
    for ctx in grid.contexts.values():
        ctx.node_config["partition-id"] = 0
    with pytest.raises(FlowerRunError, match="both hold partition-id=0"):
        FedshieldStrategy(sim).connect(grid, timeout=1)
    grid = LocalGrid(4)
    next(iter(grid.contexts.values())).node_config.pop("partition-id")
    with pytest.raises(FlowerRunError, match="--node-config 'partition-id=K"):
        FedshieldStrategy(sim).connect(grid, timeout=1)
    with pytest.raises(FlowerRunError, match="3 SuperNodes connected.*num_clients=4"):
        FedshieldStrategy(sim).connect(LocalGrid(3), timeout=0.1)


def test_client_failure_fails_the_run_naming_the_client(monkeypatch):
    def boom(*args, **kwargs):
        raise RuntimeError("disk on fire")

    monkeypatch.setattr(client_app, "local_update", boom)
    with pytest.raises(FlowerRunError, match=r"round 1: client \d \(node \d+\) failed.*disk"):
        on_flower(raw_config())


def test_client_state_is_kept_per_run_on_the_node():
    raw = raw_config(client={"algorithm": "scaffold"}, server={"algorithm": "scaffold"})
    grid = LocalGrid(4)
    on_flower(raw, grid=grid)
    keys = [set(c.state.array_records) for c in grid.contexts.values()]
    assert all(len(k) <= 1 for k in keys) and any(keys)
    first = set().union(*keys)
    on_flower(raw, grid=grid)  # a second run on the same federation replaces the state
    second = set().union(*(set(c.state.array_records) for c in grid.contexts.values()))
    assert second and not first & second


def test_node_config_overrides_data_root_and_checks_sizes(tmp_path):
    sim = client_app.runtime(
        config.dump(config.validate(raw_config())), {"partition-id": 0, "data-root": str(tmp_path)}
    )
    assert sim.cfg.data.root == str(tmp_path)
    grid = LocalGrid(4, node_config={"num-partitions": 5})
    with pytest.raises(FlowerRunError, match="num-partitions=5.*num_clients=4"):
        FedshieldStrategy(prepare(config.validate(raw_config()), None)).connect(grid, 1)


def test_local_update_without_training_reports_size_only():
    sim = client_app.runtime(config.dump(config.validate(raw_config())), {"partition-id": 1})
    payload = Payload(torch.ones(5), torch.zeros(0))
    task = codec.Task(1, 1, True, False, False, "", "k")
    u = client_app.local_update(sim, task, payload, RecordDict())
    assert u.num_examples == len(sim.exp.clients[1]) and not u.delta.any()


def test_run_config_resolves_experiment(tmp_path):
    s = settings_from_run_config(
        {"preset": "demo", "overrides": "rounds=3 data.num_clients=12", "out": str(tmp_path)}
    )
    assert (s.cfg.rounds, s.cfg.data.num_clients, s.out, s.resume) == (3, 12, tmp_path, False)
    path = tmp_path / "exp.toml"
    path.write_text(config.dump(config.validate(raw_config())))
    s = settings_from_run_config({"config": str(path), "preset": "demo", "resume": True})
    assert s.cfg.name == "flower-test" and s.resume and s.out.name == "flower-test-flower"


# -- client state across SuperNode restarts ---------------------------------------------


class RestartingGrid(LocalGrid):
    """Every SuperNode restarts (loses its Context) before every training round."""

    def send_and_receive(self, messages, *, timeout=None):
        messages = list(messages)
        if any(m.metadata.message_type == MessageType.TRAIN for m in messages):
            self.restart()
        return super().send_and_receive(messages, timeout=timeout)


SCAFFOLD_PARTIAL = {
    "client": {"algorithm": "scaffold"},
    "server": {"algorithm": "scaffold", "clients_per_round": 2},
    "rounds": 4,  # partial participation: clients come back to their h_m rounds later
}


def test_scaffold_state_survives_supernode_restarts_via_state_dir(tmp_path):
    from fedshield.flower import node_state

    raw = raw_config(**SCAFFOLD_PARTIAL)
    # Bit-identical h_m only where the same kernels compute both sides: the ClientApp trains
    # client by client, so the reference does too (the batched trainer rounds differently).
    raw["run"]["vectorize"] = False
    ref = Simulator(build(config.validate(raw)))
    ref.run()
    grid = RestartingGrid(4, node_config={"state-dir": str(tmp_path / "state")})
    sim = prepare(config.validate(raw), None)
    strategy = FedshieldStrategy(sim)
    strategy.run(grid)
    assert_same(ref.records, sim.records)
    # Every client that trained has its h_m on disk, bit-identical to the simulator's.
    assert len(ref.state.client_states) == 4
    for k, expected in ref.state.client_states.items():
        saved = node_state.load(tmp_path / "state", k, strategy.run_key)
        assert saved is not None and saved.round <= raw["rounds"]
        assert set(saved.tensors) == set(expected) == {"h"}
        assert torch.equal(saved.tensors["h"], expected["h"]), k


def test_restart_without_state_dir_loses_scaffold_state():
    """What ``state-dir`` prevents: a restarted node starts again from h_m = 0."""
    raw = raw_config(**SCAFFOLD_PARTIAL)
    ref = simulate(raw)
    records, _, _ = on_flower(raw, grid=RestartingGrid(4))
    assert records[0]["test_acc"] == pytest.approx(ref[0]["test_acc"])  # no state yet
    assert any(a["test_loss"] != pytest.approx(b["test_loss"]) for a, b in zip(ref, records))


def test_state_file_is_per_run_and_atomic(tmp_path):
    from fedshield.flower import node_state

    h = torch.randn(5, dtype=torch.float64)
    node_state.save(tmp_path, node_state.SavedState("run-a", 2, 3, {"h": h}))
    assert [p.name for p in tmp_path.iterdir()] == ["client-2.pt"]  # no temporary left
    saved = node_state.load(tmp_path, 2, "run-a")
    assert saved.round == 3 and torch.equal(saved.tensors["h"], h)
    assert node_state.load(tmp_path, 2, "run-b") is None  # another run's state is ignored
    assert node_state.load(tmp_path, 1, "run-a") is None
    with pytest.raises(ConfigError, match="state-dir=3"):
        client_app.state_dir({"state-dir": 3})


def test_a_wrong_shape_client_state_is_one_clear_error(tmp_path):
    """A SCAFFOLD client state of the wrong shape (in the state file or the
    node's Context) was a raw RuntimeError mid-training; it is checked when read back."""
    from fedshield.errors import DataError
    from fedshield.flower import node_state

    sim = Simulator(build(config.validate(raw_config(**SCAFFOLD_PARTIAL))))
    task = codec.Task(2, 1, False, True, False, sim.config_text, "run-a")
    d = sim.state.params.numel()
    node_state.save(tmp_path, node_state.SavedState("run-a", 1, 1, {"h": torch.zeros(3)}))
    with pytest.raises(DataError, match=r"client-1.pt: client state\['h'\] has shape \(3,\)"):
        client_app.load_state(RecordDict(), task, sim, d, tmp_path)
    store = RecordDict({task.state_key: codec.tensors_to_record({"x": torch.zeros(d)})})
    with pytest.raises(DataError, match="has a key 'x'"):
        client_app.load_state(store, task, sim, d)
    good = {"h": torch.ones(d)}
    node_state.save(tmp_path, node_state.SavedState("run-a", 1, 1, good))
    assert torch.equal(client_app.load_state(RecordDict(), task, sim, d, tmp_path)["h"], good["h"])


# -- progress display -------------------------------------------------------------------


def test_strategy_hands_round_wall_time_to_callbacks_that_take_it(tmp_path):
    got: list[tuple[int, float]] = []
    sim = prepare(config.validate(raw_config()), tmp_path / "run")
    serve(LocalGrid(4), sim, on_round=lambda m, wall_s: got.append((m["round"], wall_s)))
    timing = [json.loads(x) for x in (tmp_path / "run" / "timing.jsonl").read_text().splitlines()]
    assert got == [(t["round"], t["wall_s"]) for t in timing] and len(got) == 2
    plain: list[int] = []
    # A callback without ``wall_s`` gets the metrics only.
    serve(LocalGrid(4), prepare(config.validate(raw_config()), None), lambda m: plain.append(1))
    assert plain == [1, 1]


def test_progress_bar_shows_rounds_accuracy_round_time_and_eta():
    import io

    from rich.console import Console

    from fedshield.progress import RoundProgress

    buf = io.StringIO()
    raw = raw_config(rounds=3)
    sim = prepare(config.validate(raw), None)
    with RoundProgress("flower-test", 3, console=Console(file=buf, width=160)) as bar:
        serve(LocalGrid(4), sim, on_round=bar.on_round)
    line = buf.getvalue().strip().splitlines()[-1]
    assert line.startswith("flower-test") and "3/3" in line, line
    assert f"acc {sim.records[-1]['test_acc']:.4f}" in line, line
    assert re.search(r"last round \d+\.\ds", line) and "eta" in line, line


def test_discovery_query_needs_no_torch():
    """On a SuperNode every message is a fresh process: loading the ClientApp and answering
    the discovery query must not import torch (it costs seconds)."""
    import subprocess
    import sys
    from pathlib import Path

    code = (
        "import sys\n"
        "from flwr.app import ConfigRecord, Context, Message, MessageType, RecordDict\n"
        "from fedshield.flower import client_app, keys\n"
        "from fedshield.flower.local import set_task_identity\n"
        "set_task_identity()\n"
        "msg = Message(RecordDict({keys.HELLO: ConfigRecord({'num-clients': 4})}),\n"
        "              dst_node_id=1, message_type=MessageType.QUERY)\n"
        "ctx = Context(0, 1, {'partition-id': 2}, RecordDict(), {})\n"
        "reply = client_app.app(msg, ctx)\n"
        "print(reply.content.config_records[keys.NODE]['partition-id'], 'torch' in sys.modules)\n"
    )
    src = Path(__file__).resolve().parents[1] / "src"
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
        env={"PYTHONPATH": str(src), "PATH": ""},
    )  # fmt: skip
    assert proc.stdout.split() == ["2", "False"], proc.stderr[-2000:]


def test_serverapp_logs_each_round_for_flwr_log(caplog):
    from fedshield.flower.server_app import log_rounds

    sim = prepare(config.validate(raw_config()), None)
    with caplog.at_level("INFO", logger="flwr"):
        serve(LocalGrid(4), sim, log_rounds(2))
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("fedshield")]
    acc = f"acc {sim.records[-1]['test_acc']:.4f}"
    assert len(lines) == 2 and re.fullmatch(rf"fedshield round 2/2 {acc} \(\d+\.\d s\)", lines[1])
