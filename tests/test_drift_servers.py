"""Server/client algorithms of seed 000 on worked examples (SPEC §2–§5)."""

import pytest
import torch

from fedshield import aggregators, config
from fedshield.algorithms.client import CLIENT_ALGORITHMS, ClientContext, LocalSpec
from fedshield.algorithms.server import SERVER_ALGORITHMS
from fedshield.core.context import ClientUpdate, Payload, RoundContext
from fedshield.core.flat import get_params
from fedshield.core.params import parse_params
from fedshield.data.bundle import TensorData
from fedshield.errors import ConfigError
from fedshield.sim.builder import build, build_components
from fedshield.sim.engine import Simulator

CTX = RoundContext(1, (0, 1), (), 0, 4, torch.device("cpu"))


def _updates(rows):
    return [ClientUpdate(i, torch.tensor(r), 10, torch.zeros(0)) for i, r in enumerate(rows)]


def _server(name, agg="mean", **params):
    cls = SERVER_ALGORITHMS.get(name)
    return cls(
        aggregators.build(agg),
        weighting="uniform",
        params=parse_params(cls.params_schema, params, "server.params"),
    )


def test_fedexp_step_is_at_least_one_and_matches_formula():
    srv = _server("fedexp", eps=1e-3)
    ups = _updates([[1.0, 0.0], [-1.0, 0.2]])  # nearly cancelling updates → large step
    step = srv.update(torch.zeros(2), torch.zeros(0), {}, ups, CTX, None)
    mean = torch.tensor([0.0, 0.1])
    eta = (1.0 + 1.04) / (2 * 2 * (0.01 + 1e-3))
    assert step.metrics["agg/eta_g"] == pytest.approx(eta, rel=1e-5)
    torch.testing.assert_close(step.params, eta * mean)
    aligned = srv.update(
        torch.zeros(2), torch.zeros(0), {}, _updates([[1.0, 0], [1.0, 0]]), CTX, None
    )
    assert aligned.metrics["agg/eta_g"] == 1.0


def test_drag_reference_momentum():
    srv = _server("drag", agg="drag", alpha=0.25)
    ups = _updates([[1.0, 0.0], [0.0, 1.0]])
    assert "ref" not in srv.broadcast(torch.zeros(2), torch.zeros(0), {}, CTX).extras
    step = srv.update(torch.zeros(2), torch.zeros(0), {}, ups, CTX, None)
    r0 = torch.tensor([0.5, 0.5])  # r^0 = (1/S) Σ g^0
    v, _, _ = aggregators.drag_calibrate(torch.tensor([[1.0, 0.0], [0.0, 1.0]]), r0, 0.2)
    delta = v.mean(0)
    torch.testing.assert_close(step.params, delta)
    torch.testing.assert_close(step.state["ref"], 0.75 * r0 + 0.25 * delta)
    payload = srv.broadcast(step.params, torch.zeros(0), step.state, CTX)
    torch.testing.assert_close(payload.extras["ref"], step.state["ref"])


def test_fedacg_lookahead_and_momentum():
    srv = _server("fedacg", lam=0.5)
    theta = torch.tensor([1.0, 1.0])
    state = {"m": torch.tensor([2.0, 0.0])}
    assert torch.equal(
        srv.broadcast(theta, torch.zeros(0), state, CTX).params, torch.tensor([2.0, 1.0])
    )
    step = srv.update(theta, torch.zeros(0), state, _updates([[0.0, 1.0], [0.0, 3.0]]), CTX, None)
    m = torch.tensor([1.0, 2.0])  # λ m + mean g
    torch.testing.assert_close(step.state["m"], m)
    torch.testing.assert_close(step.params, theta + m)


def test_scaffold_server_control_variate():
    srv = _server("scaffold")
    state = srv.init_state(torch.zeros(2))
    ups = _updates([[1.0, 1.0], [1.0, 1.0]])
    ups[0].extras["dh"] = torch.tensor([4.0, 0.0])
    ups[1].extras["dh"] = torch.tensor([0.0, 8.0])
    step = srv.update(torch.zeros(2), torch.zeros(0), state, ups, CTX, None)
    torch.testing.assert_close(step.state["h"], torch.tensor([1.0, 2.0]))  # (1/M) Σ Δh, M = 4


def _tiny():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(4, 3))
    x = torch.rand(12, 1, 2, 2)
    y = torch.arange(12) % 3
    return model, TensorData(x, y)


def _local(name, params, payload_extras, state, steps=3):
    model, data = _tiny()
    spec = LocalSpec(lr=0.1, batch_size=12, steps=steps)
    cls = CLIENT_ALGORITHMS.get(name)
    algo = cls(spec, parse_params(cls.params_schema, params, "client.params"))
    theta = get_params(model)
    payload = Payload(theta.clone(), torch.zeros(0), payload_extras)
    ctx = ClientContext(0, 1, torch.Generator().manual_seed(0), torch.device("cpu"))
    return algo.local_update(model, payload, data, ctx, state), model, data, theta


def test_scaffold_client_seed_form_stores_first_gradient():
    h = torch.zeros(15)
    state: dict = {}
    up, model, data, theta = _local("scaffold", {}, {"h": h}, state)
    from fedshield.core.flat import set_params

    set_params(model, theta)
    model.zero_grad()
    torch.nn.functional.cross_entropy(model(data.x), data.y).backward()  # full batch = z^{t,0}
    first = torch.cat([p.grad.reshape(-1) for p in model.parameters()])
    torch.testing.assert_close(state["h"], first)
    torch.testing.assert_close(up.extras["dh"], first)


def test_scaffold_option2():
    h = torch.full((15,), 0.01)
    state = {"h": torch.full((15,), 0.03)}
    up, *_ = _local("scaffold", {"variant": "option2"}, {"h": h}, state)
    expected = 0.03 - 0.01 - up.delta / (3 * 0.1)
    torch.testing.assert_close(state["h"], expected)


def test_fedprox_pulls_towards_start():
    plain, *_ = _local("sgd", {}, {}, {}, steps=20)
    prox, *_ = _local("fedprox", {"mu": 5.0}, {}, {}, steps=20)
    assert prox.delta.norm() < 0.8 * plain.delta.norm()


@pytest.mark.parametrize(
    "overrides,message",
    [
        (["server.algorithm=drag", 'server.aggregator="mean"'], "tagged .needs_reference."),
        (["server.algorithm=brdrag"], "needs a root dataset: set data.root_size"),
        (['server.aggregator="krum"', "server.aggregator_args.f=1"], "krum"),
        (['server.aggregator="trimmed_mean"', "server.aggregator_args.f=2"], "trimmed_mean"),
        (['server.aggregator="krum"', "server.aggregator_args.q=1"], "server.aggregator_args"),
        (['client.algorithm="fedprox"', "client.params.nu=1"], "client.params.nu: unknown key"),
    ],
)
def test_impossible_settings_are_config_errors(small_cfg, overrides, message):
    raw = config.apply_overrides(small_cfg, overrides)
    with pytest.raises(ConfigError, match=message):
        build_components(config.validate(raw))


def test_server_default_aggregator_is_resolved(small_cfg):
    small_cfg["server"]["algorithm"] = "drag"
    cfg = config.validate(small_cfg)
    comps = build_components(cfg)
    assert cfg.server.aggregator == "drag" and type(comps.aggregator).__name__ == "Drag"
    assert 'aggregator = "drag"' in config.dump(cfg)


def _robust_run(small_cfg, server, aggregator, attack):
    raw = config.apply_overrides(
        small_cfg,
        [
            "rounds=15",
            "client.local_steps=10",
            "client.lr=0.3",
            "data.num_clients=10",
            "data.root_size=100",
            "server.clients_per_round=10",
            f"server.algorithm={server}",
            f'server.aggregator="{aggregator}"',
            'client.algorithm="sgd"',
        ],
    )
    if attack:
        raw["attack"] = {"name": attack, "fraction": 0.4}
    sim = Simulator(build(config.validate(raw)))
    return sim.run()["final_test_acc"]


@pytest.mark.slow
def test_brdrag_survives_noise_where_fedavg_collapses(small_cfg):
    clean = _robust_run(small_cfg, "fedavg", "mean", None)
    fedavg = _robust_run(small_cfg, "fedavg", "mean", "noise")
    brdrag = _robust_run(small_cfg, "brdrag", "brdrag", "noise")
    assert clean > 0.8
    assert fedavg < clean - 0.3
    assert brdrag > clean - 0.1


def test_fig10_diagnostics_cover_benign_rows_only():
    from fedshield.algorithms.server.fedavg import benign_geometry

    ups = _updates([[2.0, 0.0], [0.0, 4.0], [-100.0, 0.0]])
    ctx = RoundContext(1, (0, 1, 2), (2,), 0, 3, torch.device("cpu"))
    deltas = torch.stack([u.delta for u in ups])
    out = benign_geometry(deltas, torch.tensor([1.0, 0.0]), ups, ctx)
    assert out["agg/benign_rho_min"] == pytest.approx(0.25)
    assert out["agg/benign_rho_max"] == pytest.approx(0.5)
    assert out["agg/benign_mean_cos"] == pytest.approx(0.5)
