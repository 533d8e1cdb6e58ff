"""FedDyn (Acar et al., ICLR 2021, Algorithm 1): the client's gradient change and state,
the server's h and θ on a worked example of the paper's equations, the local problem's
first-order condition, and a run that trains. Batched = sequential is checked by
``tests/test_vectorized.py``'s generated grid, Flower = simulator by ``tests/test_flower.py``."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from fedshield import config
from fedshield.aggregators import AGGREGATORS
from fedshield.algorithms.client import CLIENT_ALGORITHMS, ClientContext, ClientRound, LocalSpec
from fedshield.algorithms.client.feddyn import ALPHA
from fedshield.algorithms.client.pieces import GradStep, Trained
from fedshield.algorithms.server import SERVER_ALGORITHMS, ServerRound
from fedshield.core.context import ClientUpdate, Payload, RoundContext
from fedshield.core.flat import get_params
from fedshield.data.bundle import TensorData
from fedshield.errors import ConfigError
from fedshield.sim.builder import build
from fedshield.sim.engine import Simulator


def _client(lr: float = 0.1, batch_size: int = 8, steps: int = 3):
    return CLIENT_ALGORITHMS.get("feddyn")(LocalSpec(lr=lr, batch_size=batch_size, steps=steps))


def _server(alpha: float, weighting: str = "uniform"):
    entry = SERVER_ALGORITHMS.entry("feddyn")
    params = entry.parse({"alpha": alpha}, "server.params")
    return entry.obj(AGGREGATORS.entry("mean").obj(), weighting=weighting, params=params)


def test_local_step_gradient_gains_alpha_times_drift_minus_the_kept_gradient():
    """∇R_k = ∇L_k(θ) − ∇L_k(θ_k^{t−1}) + α(θ − θ^{t−1}): α = 0.5, ∇L = (1, −1),
    θ = (2, 3), θ^{t−1} = (1, 1), g_k = (0.5, 0.5) → (1 + 0.5 − 0.5, −1 + 1 − 0.5)."""
    payload = Payload(torch.tensor([1.0, 1.0]), torch.zeros(0), {ALPHA: torch.tensor(0.5)})
    grads = [torch.tensor([1.0, -1.0])]
    step = GradStep(
        grads, [torch.tensor([2.0, 3.0])], [payload.params], payload,
        {"feddyn/grad": torch.tensor([0.5, 0.5])}, 0,
    )  # fmt: skip
    _client().adjust(step)
    assert grads[0].tolist() == [1.0, -0.5]


def test_state_follows_the_first_order_condition():
    """g_k ← g_k − α(θ_k^t − θ^{t−1}): α = 0.5, g_k = (0.5, 0.5), Δθ = (1, 2) → (0, −0.5);
    the first participation starts from g_k = 0."""
    payload = Payload(torch.zeros(2), torch.zeros(0), {ALPHA: torch.tensor(0.5)})
    states = [{"grad": torch.tensor([0.5, 0.5])}, {}]
    ups = [ClientUpdate(k, torch.tensor([1.0, 2.0]), 4, torch.zeros(0)) for k in (0, 1)]
    trained = Trained(nn.Linear(1, 1), payload, [], states, [3, 3], _client().spec,
                      torch.device("cpu"), lambda i: None)  # type: ignore[arg-type]  # fmt: skip
    _client().finish_clients(trained, ups)
    assert states[0]["grad"].tolist() == [0.0, -0.5]
    assert states[1]["grad"].tolist() == [-0.5, -1.0]
    assert all(not u.extras for u in ups)  # the upload is Δθ alone


def test_server_step_on_a_worked_example():
    """Algorithm 1's server with M = 4 clients, P_t = {θ_1, θ_2}, α = 0.5:
    θ^{t−1} = (1, 2), θ_1 = (2, 2), θ_2 = (1, 4), h^{t−1} = (0.2, −0.4) →
    h^t = h^{t−1} − α(1/M)Σ(θ_k − θ^{t−1}) = (0.2, −0.4) − 0.125·(1, 2) = (0.075, −0.65),
    θ^t = (1/|P_t|)Σθ_k − h^t/α = (1.5, 3) − (0.15, −1.3) = (1.35, 4.3)."""
    server = _server(alpha=0.5)
    theta = torch.tensor([1.0, 2.0])
    state = server.init_state(theta)
    assert state["h"].tolist() == [0.0, 0.0]
    ctx = RoundContext(1, (0, 1), (), 0, 4, torch.device("cpu"))
    payload = server.broadcast(theta, torch.zeros(0), state, ctx)
    assert float(payload.extras[ALPHA]) == 0.5 and torch.equal(payload.params, theta)
    state["h"] = torch.tensor([0.2, -0.4])
    ups = [
        ClientUpdate(0, torch.tensor([1.0, 0.0]), 10, torch.zeros(0)),
        ClientUpdate(1, torch.tensor([0.0, 2.0]), 30, torch.zeros(0)),
    ]
    step = server.update(ServerRound(theta, torch.zeros(0), state, ups, ctx))
    torch.testing.assert_close(step.state["h"], torch.tensor([0.075, -0.65]))
    torch.testing.assert_close(step.params, torch.tensor([1.35, 4.3]))


def test_local_optimum_state_is_the_true_gradient():
    """Solved to its optimum, R_k's stationarity ∇L_k(θ_k) − g_k + α(θ_k − θ^{t−1}) = 0
    makes the kept g_k⁺ = g_k − α(θ_k − θ^{t−1}) equal ∇L_k(θ_k^t) (Acar et al., eq. 3):
    full-batch local SGD on a convex model (softmax regression), two rounds in a row."""
    g = torch.Generator().manual_seed(0)
    data = TensorData(torch.randn(24, 4, generator=g), torch.arange(24) % 3)
    torch.manual_seed(0)
    model = nn.Linear(4, 3)
    client = _client(lr=1.0, batch_size=24, steps=150)
    state: dict[str, torch.Tensor] = {}
    theta = get_params(model)
    for rnd in (1, 2):
        payload = Payload(theta, torch.zeros(0), {ALPHA: torch.tensor(0.5)})
        ctx = ClientContext(0, rnd, torch.Generator().manual_seed(rnd), torch.device("cpu"))
        up = client.local_update(model, ClientRound(payload, data, state, ctx))
        model.zero_grad()
        F.cross_entropy(model(data.x), data.y).backward()
        true_grad = torch.cat([p.grad.reshape(-1) for p in model.parameters()])
        torch.testing.assert_close(state["grad"], true_grad, atol=1e-5, rtol=1e-4)
        theta = theta + up.delta + 0.1  # another start point for the next round


def test_client_without_the_servers_alpha_is_a_config_error():
    model = nn.Linear(4, 3)
    data = TensorData(torch.randn(8, 4), torch.arange(8) % 3)
    ctx = ClientContext(0, 1, torch.Generator(), torch.device("cpu"))
    with pytest.raises(ConfigError, match="server.algorithm='feddyn'"):
        payload = Payload(get_params(model), torch.zeros(0))
        _client().local_update(model, ClientRound(payload, data, {}, ctx))


def _raw(**sections):
    raw = {
        "name": "feddyn",
        "seed": 0,
        "rounds": 8,
        "data": {"dataset": "digits", "num_clients": 10, "partition": "dirichlet", "beta": 0.5},
        "model": {"name": "mlp", "params": {"hidden": 32}},
        "client": {"algorithm": "feddyn", "lr": 0.1, "batch_size": 16, "local_steps": 10},
        "server": {"algorithm": "feddyn", "clients_per_round": 5, "params": {"alpha": 0.01}},
        "eval": {"every": 8},
        "run": {"progress": False, "device": "cpu"},
    }
    for key, value in sections.items():
        raw[key] = {**raw.get(key, {}), **value}
    return raw


def test_feddyn_trains_beyond_fedavg_under_heterogeneity():
    """Dirichlet(0.5) digits, 5 of 10 clients per round, 8 rounds: FedDyn learns (chance is
    0.1) and, correcting the clients' drift, ends well above FedAvg on the same seed
    (measured: 0.79 vs 0.43; seed 1: 0.86 vs 0.64)."""
    dyn = Simulator(build(config.validate(_raw())))
    dyn.run()
    avg_raw = _raw(client={"algorithm": "sgd"}, server={"algorithm": "fedavg", "params": {}})
    avg = Simulator(build(config.validate(avg_raw)))
    avg.run()
    acc, base = dyn.records[-1]["test_acc"], avg.records[-1]["test_acc"]
    assert acc >= 0.7 and acc >= base + 0.1, (acc, base)
    assert float(dyn.state.server_state["h"].abs().max()) > 0
    sampled = set(dyn.state.client_states)
    assert sampled and all("grad" in dyn.state.client_states[k] for k in sampled)


def test_feddyn_needs_its_client():
    raw = _raw(client={"algorithm": "sgd"})
    with pytest.raises(ConfigError, match="needs client.algorithm='feddyn'"):
        build(config.validate(copy.deepcopy(raw)))
