"""The fedshield ClientApp: any registered client algorithm on a Flower SuperNode.

A SuperNode serves one fedshield client, the one whose index is its node config's
``partition-id`` (set by the simulation engine, or ``--node-config "partition-id=K
num-partitions=M"`` on a real SuperNode). It receives the fully resolved experiment config
with every train message and rebuilds the experiment from it (cached per process): the same
dataset, root/validation carve-out and seeded partition as the server, so partition ``K``
is exactly the simulator's client ``K``. Node config ``data-root`` (where this host keeps
the datasets) and ``device`` override the config's ``data.root`` and ``run.device``.

Per-client state (SCAFFOLD's h_m, ...) lives in the node's ``Context.state`` across rounds,
never on the server; with node config ``state-dir`` also in a file on the node's disk that
survives a SuperNode restart (:mod:`fedshield.flower.node_state`). Malicious nodes apply
data attacks and row-local update attacks here (:mod:`fedshield.flower.byzantine`).

torch and the experiment code are imported on the first train message only: on a real
SuperNode every message runs in a fresh ``flwr-clientapp`` process, and the discovery
query needs none of it.
"""

from __future__ import annotations

import hashlib
import tomllib
from collections import OrderedDict
from pathlib import Path
from typing import TYPE_CHECKING

from flwr.app import ConfigRecord, Context, Message, RecordDict, UserConfig
from flwr.clientapp import ClientApp

from fedshield.errors import ConfigError
from fedshield.flower import keys
from fedshield.threads import set_threads

if TYPE_CHECKING:
    from torch import Tensor

    from fedshield.core.context import ClientUpdate, Payload
    from fedshield.flower.codec import Task
    from fedshield.sim.engine import Simulator

app = ClientApp()

_LOCAL_ATTACK = 0xA77  # purpose tag of the generator a SuperNode hands its own attack
_CACHE_SIZE = 2  # experiments kept per process (a sweep switches configs between runs)
_runtimes: OrderedDict[str, Simulator] = OrderedDict()


def node_partition(node_config: UserConfig) -> tuple[int, int | None]:
    """(partition-id, num-partitions or None) of this SuperNode."""
    if "partition-id" not in node_config:
        raise ConfigError(
            "this SuperNode has no partition-id; start it with "
            "--node-config 'partition-id=K num-partitions=M' (K = its fedshield client index)"
        )
    n = node_config.get("num-partitions")
    return int(node_config["partition-id"]), None if n is None else int(n)


def state_dir(node_config: UserConfig) -> Path | None:
    """The node's ``state-dir`` (client state files), or None."""
    from fedshield.flower.node_state import STATE_DIR

    value = node_config.get(STATE_DIR)
    if value is None:
        return None
    if not isinstance(value, str) or not value:
        raise ConfigError(f"node config {STATE_DIR}={value!r}: expected a directory path")
    return Path(value).expanduser()


def runtime(config_toml: str, node_config: UserConfig) -> Simulator:
    """The experiment of ``config_toml`` as this node sees it (data path and device are
    the node's), built once per process and config."""
    from fedshield import config as config_mod
    from fedshield.sim.builder import build
    from fedshield.sim.engine import Simulator

    overrides = {k: str(node_config[k]) for k in ("data-root", "device") if k in node_config}
    key = hashlib.sha256((config_toml + repr(sorted(overrides.items()))).encode()).hexdigest()
    if key in _runtimes:
        _runtimes.move_to_end(key)
        return _runtimes[key]
    raw = tomllib.loads(config_toml)
    if "data-root" in overrides:
        raw.setdefault("data", {})["root"] = overrides["data-root"]
    if "device" in overrides:
        raw.setdefault("run", {})["device"] = overrides["device"]
    cfg = config_mod.validate(raw, "config sent by the ServerApp")
    # run.threads as the simulator's CLI does, else the runtime's default (Ray: 1); capped
    # by $FEDSHIELD_MAX_THREADS like every run
    set_threads(cfg.run.threads, default=None)
    sim = Simulator(build(cfg))
    _runtimes[key] = sim
    while len(_runtimes) > _CACHE_SIZE:
        _runtimes.popitem(last=False)
    return sim


def load_state(
    store: RecordDict, task: Task, sim: Simulator, d: int, disk: Path | None = None
) -> dict[str, Tensor]:
    """This run's client state: from the state file in ``disk`` when it holds this run's
    (it is written after the Context's, so never older, and it is the only copy after a
    SuperNode restart), else from the node's ``Context.state``, else initialised as the
    simulator does on first participation. Other runs' states are dropped from the
    Context."""
    from fedshield.core.state_check import check_table
    from fedshield.flower import codec, node_state

    for key in list(store.array_records):
        if key.startswith(keys.CLIENT_STATE) and key != task.state_key:
            del store[key]
    # Read back, so untrusted: the client algorithm's declared keys, θ's shape and dtype,
    # finite (one checker, fedshield.core.state_check); a wrong shape was a raw RuntimeError.
    spec = sim.comp.client.state_spec(sim.state.params)
    if disk is not None:
        saved = node_state.load(disk, task.client_id, task.run_key, sim.device)
        if saved is not None:
            where = f"{node_state.state_path(disk, task.client_id)}: client state"
            return check_table(where, saved.tensors, spec)
    if task.state_key in store.array_records:
        tensors = codec.record_to_tensors(store.array_records[task.state_key], sim.device)
        return check_table(f"Context.state[{task.state_key!r}]", tensors, spec)
    return sim.comp.client.init_state(d)


def save_state(
    store: RecordDict, task: Task, state: dict[str, Tensor], disk: Path | None = None
) -> None:
    """Keep the state after training: the node's ``Context.state`` and, with
    ``state-dir``, the state file (before the reply leaves, so a reply the server
    aggregated always has its state on disk)."""
    from fedshield.flower import codec, node_state

    store[task.state_key] = codec.tensors_to_record(state)
    if disk is not None:
        saved = node_state.SavedState(task.run_key, task.client_id, task.round, state)
        node_state.save(disk, saved)


def local_update(
    sim: Simulator, task: Task, payload: Payload, store: RecordDict, disk: Path | None = None
) -> ClientUpdate:
    """This client's upload, exactly as :meth:`Simulator.client_update` computes it, with
    the client state kept in ``store`` (the node's ``Context.state``) and in ``disk``."""
    import torch

    from fedshield.attacks.base import UpdateAttack
    from fedshield.core.context import ClientUpdate, make_generator

    k = task.client_id
    if not task.train:  # the strategy overwrites this attacker's row: report the size only
        zeros = torch.zeros_like(payload.params)
        return ClientUpdate(k, zeros, len(sim.exp.clients[k]), payload.buffers)
    state = load_state(store, task, sim, payload.params.numel(), disk)
    update = sim.train_client(k, payload, task.round, task.byzantine, state)
    save_state(store, task, state, disk)
    if task.byzantine and task.local_attack:
        attack = sim.comp.attack
        assert isinstance(attack, UpdateAttack)  # the strategy sets local_attack for one only
        gen = make_generator(sim.cfg.seed, task.round, k, _LOCAL_ATTACK, device=sim.device)
        own = torch.ones(1, dtype=torch.bool, device=update.delta.device)
        update.delta = attack(update.delta[None], own, generator=gen)[0]
    return update


@app.query()
def hello(msg: Message, context: Context) -> Message:
    """Discovery: tell the strategy which fedshield client this node serves."""
    k, n = node_partition(context.node_config)
    m = int(msg.content.config_records[keys.HELLO]["num-clients"])  # type: ignore[arg-type]
    if n is not None and n != m:
        raise ConfigError(f"node has num-partitions={n} but the run has data.num_clients={m}")
    if not 0 <= k < m:
        raise ConfigError(f"node partition-id={k} outside 0..{m - 1} (data.num_clients={m})")
    return Message(RecordDict({keys.NODE: ConfigRecord({"partition-id": k})}), reply_to=msg)


@app.train()
def train(msg: Message, context: Context) -> Message:
    """One round of local training with the configured client algorithm."""
    from fedshield.flower import codec

    task = codec.Task.from_record(msg.content.config_records[keys.TASK])
    k, _ = node_partition(context.node_config)
    if task.client_id != k:
        raise ConfigError(f"message for client {task.client_id} reached partition-id={k}")
    disk = state_dir(context.node_config)
    sim = runtime(task.config_toml, context.node_config)
    payload = codec.decode_payload(msg.content.array_records[keys.PAYLOAD], sim.device)
    update = local_update(sim, task, payload, context.state, disk)
    return Message(codec.encode_update(update), reply_to=msg)
