"""FedCART as a Flower-native strategy: fedshield.flower.strategies.FedCART on the server,
fedshield.flower.client_tools.FedCARTTrainer in a plain ClientApp, served in process.

The same experiment on the fedshield simulator is the reference: the final model, the
server's prototypes and virtual features, and the CART metrics must agree."""

from __future__ import annotations

import copy
import math

import numpy as np
import pytest
import torch

pytest.importorskip("flwr")

from flwr.app import Array, ArrayRecord, Context, Message, RecordDict
from flwr.clientapp import ClientApp

from fedshield import config
from fedshield.core.flat import get_params
from fedshield.errors import ConfigError
from fedshield.flower import strategies as S
from fedshield.flower.client_tools import (
    PROTOTYPES_RECORD,
    FedCARTTrainer,
)
from fedshield.flower.local import LocalGrid
from fedshield.sim.builder import build
from fedshield.sim.engine import Simulator

CLIENT = {"lr": 0.1, "batch_size": 32, "local_steps": 3}
CLIENT_PARAMS = {"steps": 2}
SERVER_PARAMS = {"match_iters": 10, "retrain_steps": 20, "num_virtual": 10}


def raw_config(rounds: int = 2) -> dict:
    return {
        "name": "fedcart-flower",
        "seed": 0,
        "rounds": rounds,
        "data": {
            "dataset": "digits", "num_clients": 3, "partition": "dirichlet", "beta": 0.5,
            "long_tail": {"rho": 10},
        },
        "model": {"name": "dual_head", "params": {"backbone": "mlp", "hidden": 16}},
        "client": {"algorithm": "fedcart", **CLIENT, "params": CLIENT_PARAMS},
        "server": {"algorithm": "fedcart", "clients_per_round": 3, "params": SERVER_PARAMS},
        "eval": {"every": rounds},
        "run": {"progress": False, "vectorize": False},
    }  # fmt: skip


def flower_run(sim: Simulator, rounds: int, forge=None, **strategy_kwargs):
    """The simulator's data and initial model, trained by FedCART on Flower's side."""
    model0 = copy.deepcopy(sim.model)
    trainer = FedCARTTrainer(**CLIENT, seed=0, **CLIENT_PARAMS)
    app = ClientApp()

    @app.train()
    def _train(msg: Message, context: Context) -> Message:
        k = int(context.node_config["partition-id"])
        model = copy.deepcopy(model0)
        model.load_state_dict(msg.content["arrays"].to_torch_state_dict())
        data = sim.exp.clients[k]
        content = trainer.train(model, msg, data.x, data.y, k)
        if forge is not None:
            forge(k, content)
        return Message(content, reply_to=msg)

    strategy = S.FedCART(
        model_fn=lambda: copy.deepcopy(model0),
        server_args=SERVER_PARAMS,
        seed=0,
        fraction_evaluate=0.0,
        **strategy_kwargs,
    )
    result = strategy.start(LocalGrid(3, app), ArrayRecord(model0.state_dict()), num_rounds=rounds)
    return strategy, result


def test_fedcart_strategy_and_trainer_equal_the_simulator():
    rounds = 2
    ref = Simulator(build(config.validate(raw_config(rounds))))
    sim = Simulator(build(config.validate(raw_config(rounds))))  # its data and θ⁰ only
    ref.run()
    strategy, result = flower_run(sim, rounds)
    model = copy.deepcopy(sim.model)
    model.load_state_dict(result.arrays.to_torch_state_dict())
    torch.testing.assert_close(get_params(model), get_params(ref.model), rtol=0, atol=1e-5)
    for key in ("proto", "proto_seen", "zv", "head_shape"):
        torch.testing.assert_close(
            strategy.state[key], ref.state.server_state[key], rtol=0, atol=1e-5
        )
    metrics = result.train_metrics_clientapp[rounds]
    last = ref.records[-1]
    for key in ("cart/match_end", "cart/retrain_loss", "cart/classes"):
        assert metrics[key] == pytest.approx(last[key], rel=1e-4), key
    assert metrics["sys/rejected"] == 0 and metrics["sys/kept"] == 3


def test_bad_prototypes_are_rejected_and_the_cart_step_stays_finite():
    sim = Simulator(build(config.validate(raw_config(1))))

    def forge(k: int, content: RecordDict) -> None:
        if k == 0:  # NaN prototypes
            arr = content.array_records[PROTOTYPES_RECORD]["value"].numpy().copy()
            arr[0, 0] = np.nan
            content[PROTOTYPES_RECORD] = ArrayRecord({"value": Array(arr)})
        if k == 1:  # the wrong shape
            content[PROTOTYPES_RECORD] = ArrayRecord({"value": Array(np.zeros((2, 3), "f4"))})

    strategy, result = flower_run(sim, 1, forge)
    metrics = result.train_metrics_clientapp[1]
    assert metrics["sys/rejected"] == 2 and metrics["sys/kept"] == 1
    assert metrics["sys/rejected/extra_fedcart/prototypes"] == 2
    final = result.arrays.to_torch_state_dict()
    assert all(bool(torch.isfinite(v).all()) for v in final.values() if v.is_floating_point())
    assert math.isfinite(metrics["cart/match_end"])


def test_fedcart_strategy_needs_the_dual_head_model():
    with pytest.raises(ConfigError, match="needs model_fn"):
        S.FedshieldRule(server="fedcart")
    with pytest.raises(ConfigError, match="dual_head"):
        S.FedCART(model_fn=lambda: torch.nn.Linear(4, 2))


def test_a_huge_prototype_is_kept_out_of_the_cart_step_by_a_robust_rule():
    """One of three clients uploads finite prototypes scaled by 1e30 (they pass the checks):
    the median keeps them out class by class, so the prototypes the CART step matches stay
    at the honest clients' scale (the mean would carry 1e30 / 3), and nothing is
    non-finite."""
    sim = Simulator(build(config.validate(raw_config(1))))

    def forge(k: int, content: RecordDict) -> None:
        if k == 0:
            arr = content.array_records[PROTOTYPES_RECORD]["value"].numpy() * np.float32(1e30)
            content[PROTOTYPES_RECORD] = ArrayRecord({"value": Array(arr)})

    clean, _ = flower_run(sim, 1, aggregator="median")
    attacked, result = flower_run(sim, 1, forge, aggregator="median")
    honest_scale = float(clean.state["proto"].abs().max())
    assert float(attacked.state["proto"].abs().max()) <= 2 * honest_scale
    final = result.arrays.to_torch_state_dict()
    assert all(bool(torch.isfinite(v).all()) for v in final.values() if v.is_floating_point())
    assert result.train_metrics_clientapp[1]["sys/rejected"] == 0
