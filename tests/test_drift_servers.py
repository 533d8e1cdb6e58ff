"""Server/client algorithms of the DRAG paper on worked examples (DRAG paper, Secs. III–VI)."""

import pytest
import torch

from fedshield import aggregators, config
from fedshield.algorithms.client import CLIENT_ALGORITHMS, ClientContext, ClientRound, LocalSpec
from fedshield.algorithms.server import SERVER_ALGORITHMS, ServerRound
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
    step = srv.update(ServerRound(torch.zeros(2), torch.zeros(0), {}, ups, CTX))
    mean = torch.tensor([0.0, 0.1])
    eta = (1.0 + 1.04) / (2 * 2 * (0.01 + 1e-3))
    assert step.metrics["agg/eta_g"] == pytest.approx(eta, rel=1e-5)
    torch.testing.assert_close(step.params, eta * mean)
    aligned = srv.update(
        ServerRound(torch.zeros(2), torch.zeros(0), {}, _updates([[1.0, 0], [1.0, 0]]), CTX)
    )
    assert aligned.metrics["agg/eta_g"] == 1.0


def test_drag_reference_momentum():
    srv = _server("drag", agg="drag", alpha=0.25)
    ups = _updates([[1.0, 0.0], [0.0, 1.0]])
    assert "ref" not in srv.broadcast(torch.zeros(2), torch.zeros(0), {}, CTX).extras
    step = srv.update(ServerRound(torch.zeros(2), torch.zeros(0), {}, ups, CTX))
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
    ups = _updates([[0.0, 1.0], [0.0, 3.0]])
    step = srv.update(ServerRound(theta, torch.zeros(0), state, ups, CTX))
    m = torch.tensor([1.0, 2.0])  # λ m + mean g
    torch.testing.assert_close(step.state["m"], m)
    torch.testing.assert_close(step.params, theta + m)


def test_scaffold_server_control_variate():
    srv = _server("scaffold")
    state = srv.init_state(torch.zeros(2))
    ups = _updates([[1.0, 1.0], [1.0, 1.0]])
    ups[0].extras["dh"] = torch.tensor([4.0, 0.0])
    ups[1].extras["dh"] = torch.tensor([0.0, 8.0])
    step = srv.update(ServerRound(torch.zeros(2), torch.zeros(0), state, ups, CTX))
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
    return algo.local_update(model, ClientRound(payload, data, state, ctx)), model, data, theta


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


# -- DRAG's calibration under FedACG's look-ahead momentum (drag_acg) --------------


def test_drag_acg_with_lambda_zero_is_drag():
    ups = _updates([[1.0, 0.0], [0.0, 1.0]])
    drag = _server("drag", agg="drag", alpha=0.25)
    both = _server("drag_acg", agg="drag", alpha=0.25, lam=0.0)
    a = drag.update(ServerRound(torch.zeros(2), torch.zeros(0), {}, ups, CTX))
    b = both.update(ServerRound(torch.zeros(2), torch.zeros(0), {}, ups, CTX))
    torch.testing.assert_close(a.params, b.params)
    torch.testing.assert_close(a.state["ref"], b.state["ref"])
    ups2 = _updates([[0.5, -1.0], [2.0, 0.0]])
    a2 = drag.update(ServerRound(a.params, torch.zeros(0), a.state, ups2, CTX))
    b2 = both.update(ServerRound(b.params, torch.zeros(0), b.state, ups2, CTX))
    torch.testing.assert_close(a2.params, b2.params)


def test_drag_acg_with_c_zero_is_fedacg_and_broadcasts_the_lookahead():
    theta = torch.tensor([1.0, 1.0])
    state = {"m": torch.tensor([2.0, 0.0]), "ref": torch.tensor([1.0, 0.0])}
    acg = _server("fedacg", lam=0.5)
    both = _server("drag_acg", agg="drag", lam=0.5)
    both.aggregator = aggregators.build("drag", c=0.0)
    payload = both.broadcast(theta, torch.zeros(0), state, CTX)
    torch.testing.assert_close(payload.params, torch.tensor([2.0, 1.0]))  # θ + λ m
    torch.testing.assert_close(payload.extras["ref"], state["ref"])
    ups = _updates([[0.0, 1.0], [0.0, 3.0]])
    a = acg.update(ServerRound(theta, torch.zeros(0), state, ups, CTX))
    b = both.update(ServerRound(theta, torch.zeros(0), state, ups, CTX))
    torch.testing.assert_close(a.params, b.params)  # θ + λ m + mean g
    torch.testing.assert_close(b.state["m"], torch.tensor([1.0, 2.0]))


def test_drag_acg_calibrates_before_the_momentum():
    """m^t = λ m + Δ with Δ the calibrated mean (eq. 11), r updated with the same Δ."""
    theta, r = torch.zeros(2), torch.tensor([1.0, 0.0])
    state = {"m": torch.tensor([1.0, 1.0]), "ref": r}
    both = _server("drag_acg", agg="drag", lam=0.5, alpha=0.25)
    rows = torch.tensor([[0.0, 2.0], [-1.0, 0.0]])
    ups = _updates(rows.tolist())
    step = both.update(ServerRound(theta, torch.zeros(0), state, ups, CTX))
    v, _, _ = aggregators.drag_calibrate(rows, r, 0.2)
    delta = v.mean(0)
    torch.testing.assert_close(step.state["m"], 0.5 * state["m"] + delta)
    torch.testing.assert_close(step.params, 0.5 * state["m"] + delta)
    torch.testing.assert_close(step.state["ref"], 0.75 * r + 0.25 * delta)


# -- DRAG's component along r (docs/results/drag.md) ------------------------------------------


def test_drag_component_along_the_reference_is_cos_plus_c_one_minus_cos_squared():
    """v = (1 − λ) g + λ (‖g‖/‖r‖) r with λ = c(1 − cos): ⟨v, r̂⟩ = ‖g‖ (cos + c (1 − cos)²).
    Worked example: g = 2·(cos 120°, sin 120°), r = e₁, c = 0.5: cos = −½, λ = ¾,
    ⟨v, r̂⟩ = 2 (−½ + ½ · (3/2)²) = 1.25 > 0 — the client's reversal is turned around."""
    g = 2 * torch.tensor([[-0.5, 3**0.5 / 2]], dtype=torch.float64)
    r = torch.tensor([1.0, 0.0], dtype=torch.float64)
    v, lam, cos = aggregators.drag_calibrate(g, r, 0.5)
    assert float(cos[0]) == pytest.approx(-0.5) and float(lam[0]) == pytest.approx(0.75)
    assert float(v[0, 0]) == pytest.approx(1.25)
    # For every cosine the sign is that of cos + c(1 − cos)²: ≥ 0 for all cos iff c ≥ 1/4.
    angles = torch.linspace(0, torch.pi, 181, dtype=torch.float64)
    rows = torch.stack([angles.cos(), angles.sin()], 1)
    for c, ok in ((0.2, False), (0.25, True), (0.3, True), (1.0, True)):
        v, _, cos = aggregators.drag_calibrate(rows, r, c)
        torch.testing.assert_close(v[:, 0], cos + c * (1 - cos) ** 2)
        assert bool((v[:, 0] >= -1e-12).all()) == ok, c


# -- BR-DRAG with the theorem's per-round c^t (brdrag_ct) -------------------------------------


def test_theorem_c_worked_example():
    from fedshield.algorithms.server.brdrag_ct import theorem_c

    cos = torch.tensor([0.9, 0.8, -1.0, -0.2])
    flag = torch.tensor([False, False, True, True])
    # w = 2/4, x = (−1 − 0.2)/4 = −0.3: c = 0.5 / 0.8 = 0.625
    assert theorem_c(cos, flag) == pytest.approx(0.625)
    assert theorem_c(cos, torch.zeros(4, dtype=torch.bool)) == 0.5  # no attacker: c_min
    assert theorem_c(torch.tensor([-1.0, -1.0]), torch.tensor([True, True])) == 0.5
    assert theorem_c(torch.tensor([0.5, 0.1]), torch.tensor([True, False])) == 1.0  # x > 0


class _Root:
    """Services whose root-data direction is a fixed r (the server's U root steps)."""

    def __init__(self, r: torch.Tensor) -> None:
        self.r = r

    def root_update(self, params, buffers, ctx):
        return ClientUpdate(-1, self.r, 1, torch.zeros(0))


def test_brdrag_ct_calibrates_with_the_rounds_c():
    r = torch.tensor([1.0, 0.0])
    rows = [[2.0, 0.0], [0.0, 1.0], [-1.0, 0.0], [-1.0, 1.0]]
    ctx = RoundContext(1, (0, 1, 2, 3), (2,), 0, 4, torch.device("cpu"))
    x = torch.tensor(rows)
    for rule, c_t in (("estimate", 0.5 / (0.5 + (1 + 2**-0.5) / 4)), ("oracle", 0.25 / 0.5)):
        srv = _server("brdrag_ct", agg="brdrag", c_rule=rule)
        rnd_in = ServerRound(torch.zeros(2), torch.zeros(0), {}, _updates(rows), ctx, _Root(r))
        step = srv.update(rnd_in)
        assert step.metrics["agg/c_t"] == pytest.approx(c_t)
        v, _, _ = aggregators.brdrag_calibrate(x, r, c_t)
        torch.testing.assert_close(step.params, v.mean(0))
        assert srv.aggregator.c == 0.5  # the configured rule is left as it was


def test_brdrag_ct_needs_the_brdrag_rule():
    with pytest.raises(ConfigError, match="'brdrag'"):
        _server("brdrag_ct", agg="fltrust")
