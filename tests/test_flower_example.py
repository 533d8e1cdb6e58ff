"""examples/flower-brdrag: a plain Flower app with fedshield's BR-DRAG strategy reproduces
the fedshield simulator on the same config.

The reference is a fedshield ``Simulator`` run configured to match the example: the same
partition, root and test splits, the same model and initialisation, the same local SGD
(fedshield's ``sgd`` client) and the same server (``server.algorithm = "brdrag"``, its root
update seeded by ``seed``). The only piece the config cannot say is the example's own
mini-batch order (``task.batch_generator``), which the reference's client draws from.
Tolerance: 1e-6 on every parameter after 5 rounds (3e-8 measured: the replies arrive in
node order, so float sums run in another order), one test sample on the accuracy.
"""

from __future__ import annotations

import os
import sys
import tomllib
from dataclasses import replace
from pathlib import Path

import pytest
import torch

pytest.importorskip("flwr")
pytest.importorskip("sklearn")

import torch.nn.functional as F
from flwr.app import ArrayRecord, Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp
from flwr.serverapp import Grid, ServerApp

from fedshield import config
from fedshield.data.bundle import DataBundle, TensorData
from fedshield.flower.client_tools import SCAFFOLD_STATE, ScaffoldClient, flat_params
from fedshield.flower.local import LocalGrid
from fedshield.flower.strategies import SCAFFOLD
from fedshield.sim.builder import Experiment, build_components
from fedshield.sim.engine import Simulator

REPO = Path(__file__).resolve().parents[1]
EXAMPLE = REPO / "examples" / "flower-brdrag"
sys.path.insert(0, str(EXAMPLE))

from brdrag_app import client_app, server_app, task  # noqa: E402

# starts processes: one worker with the other such modules (tests/test_suite_setup.py)
pytestmark = pytest.mark.xdist_group("processes")


def example_order(cls: type) -> type:
    """fedshield client algorithm ``cls`` drawing its mini-batches in the example's order."""

    class ExampleOrder(cls):
        def local_update(self, model, rnd):
            g = task.batch_generator(SEED, rnd.ctx.round, rnd.ctx.client_id)
            return super().local_update(model, rnd.replace(ctx=replace(rnd.ctx, generator=g)))

    return ExampleOrder


SEED = task.DEFAULTS["seed"]


def fedshield_reference(
    cfg: dict, server: dict | None = None, client: str = "sgd", client_params: dict | None = None
) -> Simulator:
    """The example's config on the fedshield simulator (see the module docstring);
    ``server`` / ``client``: other server and client sections (default: BR-DRAG, sgd)."""
    m = int(cfg["num-clients"])
    raw = {
        "name": "flower-brdrag",
        "seed": int(cfg["seed"]),
        "rounds": int(cfg["num-server-rounds"]),
        "data": {"dataset": "digits", "num_clients": m, "root_size": int(cfg["root-size"])},
        "model": {"name": "mlp", "params": {"hidden": int(cfg["hidden"])}},
        "client": {
            "algorithm": client,
            "params": client_params or {},
            "lr": float(cfg["lr"]),
            "batch_size": int(cfg["batch-size"]),
            "local_steps": int(cfg["local-steps"]),
        },
        "server": {"clients_per_round": m}
        | (server or {"algorithm": "brdrag", "aggregator_args": {"c": float(cfg["c"])}}),
        "eval": {"every": 1},
        "run": {"progress": False, "device": "cpu", "vectorize": False},
    }
    exp_cfg = config.validate(raw)
    comp = build_components(exp_cfg)
    spec, params = comp.client.spec, comp.client.params
    comp = replace(comp, client=example_order(type(comp.client))(spec, params))
    train = TensorData(*task.load_split("train", cfg))
    bundle = DataBundle(
        "digits-example",
        train,
        TensorData(*task.load_split("test", cfg)),
        10,
        (1, 8, 8),
        tuple(str(i) for i in range(10)),
    )
    torch.manual_seed(int(cfg["seed"]))  # the example's ServerApp initialises the same way
    exp = Experiment(
        cfg=exp_cfg,
        components=comp,
        bundle=bundle,
        clients=[TensorData(*task.load_partition(k, m, cfg)) for k in range(m)],
        train=train,
        root=TensorData(*task.load_split("root", cfg)),
        val=None,
        model=task.Net(int(cfg["hidden"])),
        byzantine=(),
        device=torch.device("cpu"),
    )
    sim = Simulator(exp)
    sim.run()
    return sim


def assert_matches_simulator(result, cfg: dict) -> None:
    sim = fedshield_reference(cfg)
    final = result.arrays.to_torch_state_dict()
    flat = torch.cat([final[n].reshape(-1) for n, _ in task.Net().named_parameters()])
    torch.testing.assert_close(flat, sim.state.params, atol=1e-6, rtol=0)
    rounds = int(cfg["num-server-rounds"])
    accs = [result.evaluate_metrics_serverapp[r]["test_acc"] for r in range(1, rounds + 1)]
    want = [rec["test_acc"] for rec in sim.records]
    assert accs == pytest.approx(want, abs=1.0 / int(cfg["test-size"]) + 1e-9)
    assert accs[-1] > 0.7  # it learns: the chance level is 0.1
    for r in range(1, rounds + 1):
        metrics = result.train_metrics_clientapp[r]
        assert metrics["sys/rejected"] == 0 and metrics["sys/kept"] == cfg["num-clients"]


def test_example_pyproject_declares_the_apps_and_the_task_defaults():
    """``flwr run`` reads the same defaults as a run without a run config."""
    from flwr.cli.config_utils import load_and_validate

    load_and_validate(EXAMPLE / "pyproject.toml", check_module=False)  # raises if invalid
    flwr = tomllib.loads((EXAMPLE / "pyproject.toml").read_text())["tool"]["flwr"]
    assert flwr["app"]["components"] == {
        "serverapp": "brdrag_app.server_app:app",
        "clientapp": "brdrag_app.client_app:app",
    }
    assert flwr["app"]["config"] == task.DEFAULTS


def test_example_imports_only_flwr_and_one_fedshield_strategy():
    for module in (client_app, server_app, task):
        text = Path(module.__file__).read_text()
        fedshield_imports = [ln for ln in text.splitlines() if "fedshield" in ln and "import" in ln]
        expected = (
            ["from fedshield.flower.strategies import BRDRAG"] if module is server_app else []
        )
        assert fedshield_imports == expected, module.__name__


def test_example_in_process_matches_the_simulator():
    """The example's ServerApp and ClientApp over an in-process Grid (no Ray)."""
    cfg = task.settings(None)
    grid = LocalGrid(int(cfg["num-clients"]), client_app.app)
    assert_matches_simulator(server_app.run(grid, cfg), cfg)


@pytest.mark.slow  # Ray's start-up: 15-45 s on 2 busy cores
def test_example_on_flower_simulation_engine_matches_the_simulator(monkeypatch):
    from flwr.simulation import run_simulation

    cfg = task.settings(None)
    results = {}
    app = ServerApp()

    @app.main()
    def _main(grid: Grid, context: Context) -> None:
        results["result"] = server_app.run(grid, cfg)

    # Ray's workers import the ClientApp by module: they need the example on their path.
    path = os.pathsep.join([str(EXAMPLE), str(REPO / "src"), os.environ.get("PYTHONPATH", "")])
    monkeypatch.setenv("PYTHONPATH", path)
    monkeypatch.setenv("RAY_ACCEL_ENV_VAR_OVERRIDE_ON_ZERO", "0")
    run_simulation(
        server_app=app,
        client_app=client_app.app,
        num_supernodes=int(cfg["num-clients"]),
        backend_config={
            "client_resources": {"num_cpus": 1, "num_gpus": 0.0},
            "init_args": {"num_cpus": 2, "logging_level": "ERROR"},
        },
    )
    assert "result" in results, "the ServerApp did not finish (see the log above)"
    assert_matches_simulator(results["result"], cfg)


# -- SCAFFOLD end to end: a user's ClientApp with fedshield's client helper ------------------
def scaffold_app(variant: str) -> ClientApp:
    """The example's client with SCAFFOLD's correction in its training loop."""
    app = ClientApp()

    @app.train()
    def _train(msg: Message, context: Context) -> Message:
        cfg = task.settings(context.run_config)
        pid = int(context.node_config["partition-id"])
        x, y = task.load_partition(pid, int(context.node_config["num-partitions"]), cfg)
        net = task.Net(int(cfg["hidden"]))
        net.load_state_dict(msg.content["arrays"].to_torch_state_dict())
        lr, bs, steps = float(cfg["lr"]), int(cfg["batch-size"]), int(cfg["local-steps"])
        scaffold = ScaffoldClient(net, msg, context, variant=variant, lr=lr)
        gen = task.batch_generator(SEED, int(msg.content["config"]["server-round"]), pid)
        opt = torch.optim.SGD(net.parameters(), lr=lr)
        net.train()
        perm = torch.randperm(len(y), generator=gen)  # steps <= one epoch (asserted)
        for i in range(steps):
            idx = perm[i * bs : (i + 1) * bs]
            opt.zero_grad(set_to_none=True)
            F.cross_entropy(net(x[idx]), y[idx]).backward()
            scaffold.correct()
            opt.step()
        content = RecordDict(
            {
                "arrays": ArrayRecord(net.state_dict()),
                "metrics": MetricRecord({"num-examples": len(y)}),
                **scaffold.reply(),
            }
        )
        return Message(content, reply_to=msg)

    return app


@pytest.mark.parametrize("variant", ["seed", "option2"])
def test_scaffold_with_the_client_helper_matches_the_simulator(variant):
    cfg = task.settings({"num-server-rounds": 3})
    m = int(cfg["num-clients"])
    assert int(cfg["local-steps"]) * int(cfg["batch-size"]) <= len(
        task.load_partition(0, m, cfg)[1]
    )
    grid = LocalGrid(m, scaffold_app(variant))
    strategy = SCAFFOLD(fraction_evaluate=0.0, min_available_nodes=m)
    torch.manual_seed(int(cfg["seed"]))
    result = strategy.start(grid, ArrayRecord(task.Net(int(cfg["hidden"])).state_dict()), 3)
    sim = fedshield_reference(
        cfg, server={"algorithm": "scaffold"}, client="scaffold", client_params={"variant": variant}
    )
    final = result.arrays.to_torch_state_dict()
    flat = torch.cat([final[n].reshape(-1) for n, _ in task.Net().named_parameters()])
    torch.testing.assert_close(flat, sim.state.params, atol=1e-6, rtol=0)
    torch.testing.assert_close(strategy.state["h"], sim.state.server_state["h"], atol=1e-6, rtol=0)
    net = task.Net(int(cfg["hidden"]))
    for context in grid.contexts.values():
        k = int(context.node_config["partition-id"])
        h_k = flat_params(context.state.array_records[SCAFFOLD_STATE], net)
        torch.testing.assert_close(h_k, sim.state.client_states[k]["h"], atol=1e-6, rtol=0)
    assert float(strategy.state["h"].norm()) > 0
