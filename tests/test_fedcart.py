"""FedCART pieces (FedCART paper): dual-head model, client loss and prototypes, server CART
step, and one test per ablation switch showing it changes the behaviour it names."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.func import grad, vmap

from fedshield.adversarial import pgd
from fedshield.algorithms.client.base import ClientContext, ClientRound, LocalSpec
from fedshield.algorithms.client.fedcart import (
    COUNTS,
    HEAD_SHAPE,
    PROTO_HEAD,
    PROTOTYPES,
    FedCARTClient,
    FedCARTParams,
)
from fedshield.algorithms.server import ServerRound
from fedshield.algorithms.server.fedcart import (
    FedCARTServer,
    FedCARTServerParams,
    aggregate_prototypes,
)
from fedshield.core.context import ClientUpdate, Payload, RoundContext
from fedshield.core.flat import get_buffers, get_params
from fedshield.core.params import parse_params
from fedshield.data.bundle import TensorData
from fedshield.errors import ConfigError
from fedshield.losses import align_loss, trades_loss
from fedshield.models import build_model
from fedshield.models.dual_head import DualHead

C, SHAPE = 4, (1, 8, 8)


@pytest.fixture(autouse=True)
def _one_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def model(seed: int = 0) -> DualHead:
    torch.manual_seed(seed)
    return build_model("dual_head", SHAPE, C, backbone="cnn_small", width=4, hidden=8)


def data(n: int = 24, seed: int = 0, signal: bool = False) -> TensorData:
    """Uniform noise images; ``signal``: class c also lights up quadrant c (learnable)."""
    g = torch.Generator().manual_seed(seed)
    x, y = torch.rand(n, *SHAPE, generator=g), torch.arange(n) % C
    if signal:
        x = 0.3 * x
        for c in range(C):
            r, q = divmod(c, 2)
            x[y == c, :, 4 * r : 4 * r + 4, 4 * q : 4 * q + 4] += 0.7
    return TensorData(x, y)


def client(**params) -> FedCARTClient:
    spec = LocalSpec(lr=0.05, batch_size=8, steps=2)
    return FedCARTClient(spec, parse_params(FedCARTParams, {"steps": 2, **params}, "p"))


def ctx(rnd: int = 1) -> ClientContext:
    return ClientContext(0, rnd, torch.Generator().manual_seed(rnd), torch.device("cpu"))


def rctx(rnd: int = 1) -> RoundContext:
    return RoundContext(rnd, (0, 1), (), 0, 2, torch.device("cpu"))


# -- the model ---------------------------------------------------------------------------


def test_dual_head_layout_and_heads():
    m = model()
    names = [n for n, _ in m.named_parameters()]
    assert names[-4:] == ["main_head.weight", "main_head.bias", "head.weight", "head.bias"]
    x = torch.rand(3, *SHAPE)
    z = m.forward_features(x)
    for mode in (True, False):  # inference = r + h' in both modes
        m.train(mode)
        torch.testing.assert_close(m(x), m.head(z))
    torch.testing.assert_close(m.forward_main(x), m.main_head(z))
    assert m.aux_head is m.head and m.num_features == 8


def test_main_path_restores_the_models_mode():
    m = model().eval()
    view = m.main_path()
    view.train()  # what an eval-mode attack does when it restores "the" mode
    view.train(view.training)
    m.eval()
    path = m.main_path()
    assert not path.training
    torch.testing.assert_close(path(torch.ones(1, *SHAPE)), m.forward_main(torch.ones(1, *SHAPE)))


def test_dual_head_rejects_non_classifier_backbone():
    from fedshield.models.dual_head import DualHead as DH

    with pytest.raises(ConfigError, match="linear head"):
        DH(nn.Sequential(nn.Flatten(), nn.Linear(64, 4)), 4)


# -- client loss and its ablation switches ---------------------------------------------


def _fixed_adv(cl: FedCARTClient, x_adv: torch.Tensor) -> None:
    """Make the client's attacks deterministic, so loss differences isolate one term."""
    cl.pgd_examples = lambda model, x, y, steps=None, draws=None: x_adv  # type: ignore[method-assign]
    cl.trades_examples = lambda model, x, draws=None, transform=None: x_adv  # type: ignore[method-assign]


def _terms(m: DualHead, x, x_adv, y):
    z, za = m.forward_features(x), m.forward_features(x_adv)
    lo, la = m.main_head(z), m.main_head(za)
    gamma = 1.0 - (lo.argmax(1) == la.argmax(1)).float().mean()
    return {
        "nat": F.cross_entropy(lo, y),
        "at": F.cross_entropy(la, y),
        "align": gamma * align_loss(z, za, y, 0.1),
        "gamma": gamma,
        "trades": trades_loss(lo, la, y, 6.0),
    }


@pytest.fixture
def batch():
    m = model()
    d = data()
    x, y = d.x[:8], d.y[:8]
    noise = torch.randn(x.shape, generator=torch.Generator().manual_seed(1))
    x_adv = (x + 0.5 * noise).clamp(0, 1)
    with torch.no_grad():  # h(z) = W(z − z̄) with a large W, so predictions vary (γ > 0)
        zbar = m.forward_features(torch.cat([x, x_adv])).mean(0)
        w = 100 * torch.randn(C, zbar.numel(), generator=torch.Generator().manual_seed(2))
        m.main_head.weight.copy_(w)
        m.main_head.bias.copy_(-w @ zbar)
    return m, x, x_adv, y


def test_full_loss_is_nat_plus_at_plus_gamma_align(batch):
    m, x, x_adv, y = batch
    cl = client()
    _fixed_adv(cl, x_adv)
    t = _terms(m, x, x_adv, y)
    assert float(t["gamma"]) > 0
    full = cl.loss(m, x, y, Payload(get_params(m), get_buffers(m)))
    torch.testing.assert_close(full, t["nat"] + t["at"] + t["align"])


@pytest.mark.parametrize(("switch", "term"), [("nat", "nat"), ("at", "at"), ("align", "align")])
def test_each_loss_ablation_removes_exactly_its_term(batch, switch, term):
    m, x, x_adv, y = batch
    payload = Payload(get_params(m), get_buffers(m))
    full, ablated = client(), client(**{switch: False})
    _fixed_adv(full, x_adv), _fixed_adv(ablated, x_adv)
    t = _terms(m, x, x_adv, y)
    assert t[term].item() > 0
    diff = full.loss(m, x, y, payload) - ablated.loss(m, x, y, payload)
    torch.testing.assert_close(diff, t[term])


def test_taet_plus_fedcart_switch_follows_the_two_stages(batch):
    """at_loss = 'taet': natural CE (stage 1, rounds ≤ stabilize_rounds), then HARL on x'
    (stage 2), each plus γ·L_Align."""
    from fedshield.algorithms.client.adversarial_training import with_round
    from fedshield.losses import harl_loss

    m, x, x_adv, y = batch
    cl = client(at_loss="taet", stabilize_rounds=2)
    _fixed_adv(cl, x_adv)
    t = _terms(m, x, x_adv, y)
    base = Payload(get_params(m), get_buffers(m))
    stage1 = cl.loss(m, x, y, with_round(base, 2))
    torch.testing.assert_close(stage1, t["nat"] + t["align"])
    stage2 = cl.loss(m, x, y, with_round(base, 3))
    harl = harl_loss(m.main_head(m.forward_features(x_adv)), y)
    torch.testing.assert_close(stage2, harl + t["align"])


def test_trades_plus_fedcart_switch(batch):
    m, x, x_adv, y = batch
    cl = client(at_loss="trades")
    _fixed_adv(cl, x_adv)
    t = _terms(m, x, x_adv, y)
    got = cl.loss(m, x, y, Payload(get_params(m), get_buffers(m)))
    torch.testing.assert_close(got, t["trades"] + t["align"])


def test_loss_trains_h_not_h_prime(batch):
    m, x, _, y = batch
    client().loss(m, x, y, Payload(get_params(m), get_buffers(m))).backward()
    assert m.main_head.weight.grad is not None and m.head.weight.grad is None


def test_params_validation():
    with pytest.raises(ConfigError, match="leave them true"):
        parse_params(FedCARTParams, {"at_loss": "mart", "nat": False}, "client.params")
    with pytest.raises(ConfigError, match="empty"):
        parse_params(FedCARTParams, {"nat": False, "at": False, "align": False}, "p")
    with pytest.raises(ConfigError, match="unknown key"):
        parse_params(FedCARTParams, {"gama": 1.0}, "client.params")


def test_client_refuses_a_single_head_model():
    torch.manual_seed(0)
    m = build_model("cnn_small", SHAPE, C, width=4, hidden=8)
    with pytest.raises(ConfigError, match="model.name='dual_head'"):
        client().loss(m, torch.rand(2, *SHAPE), torch.tensor([0, 1]), None)  # type: ignore[arg-type]


# -- prototypes --------------------------------------------------------------------------


def _per_sample_grads(head: nn.Linear, z: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    def ce(w, b, zi, yi):
        return F.cross_entropy((zi @ w.T + b)[None], yi[None])

    gw, gb = vmap(grad(ce, argnums=(0, 1)), in_dims=(None, None, 0, 0))(
        head.weight.detach(), head.bias.detach(), z, y
    )
    return torch.cat([gw.flatten(1), gb], dim=1)


def _received_model_update(cl: FedCARTClient, m: DualHead, d: TensorData, flag: float):
    received = get_params(m).clone()
    payload = Payload(received, get_buffers(m), {PROTO_HEAD: torch.tensor(flag)})
    torch.manual_seed(7)
    up = cl.local_update(m, ClientRound(payload, d, {}, ctx()))
    return up, received


def test_prototype_is_mean_per_sample_gradient_at_the_received_model():
    """Natural view only (proto_steps = 0): g_c = mean_i ∇_{h'} CE(h'(r(x_i)), c)."""
    m, d = model(), data()
    cl = client(proto_steps=0)
    up, _ = _received_model_update(cl, m, d, 0.0)
    assert (get_params(m) - up.delta).abs().sum() > 0  # training moved the model...
    ref = model()  # ...but prototypes use the received one (same init seed)
    with torch.no_grad():
        z = ref.eval().forward_features(d.x)
    per = _per_sample_grads(ref.head, z, d.y)
    for c in range(C):
        torch.testing.assert_close(up.extras[PROTOTYPES][c], per[d.y == c].mean(0))
    assert up.extras[COUNTS].tolist() == [6.0] * C
    assert up.extras[HEAD_SHAPE].tolist() == [C, 8]


def test_prototype_averages_natural_and_adversarial_views():
    m, d = model(), data()
    cl = client(proto_steps=3, proto_batch=64)
    torch.manual_seed(11)
    protos, counts = cl.prototypes(m, m.head, d, torch.device("cpu"))
    ref = model()
    torch.manual_seed(11)  # the same random start as inside the client
    with torch.no_grad():
        ref.eval()
    x_adv = pgd(ref.main_path(), d.x, d.y, 0.1, 0.025, 3)
    with torch.no_grad():
        per = _per_sample_grads(ref.head, ref.forward_features(d.x), d.y)
        per_adv = _per_sample_grads(ref.head, ref.forward_features(x_adv), d.y)
    for c in range(C):
        expected = 0.5 * (per[d.y == c].mean(0) + per_adv[d.y == c].mean(0))
        torch.testing.assert_close(protos[c], expected)
    assert counts.tolist() == [6.0] * C
    # proto_views = "sum" (the first implementation) is twice the two-view mean.
    ref = model()
    torch.manual_seed(11)
    summed, _ = client(proto_steps=3, proto_batch=64, proto_views="sum").prototypes(
        ref, ref.head, d, torch.device("cpu")
    )
    torch.testing.assert_close(summed, 2 * protos)


def test_no_prototypes_unless_the_server_asks():
    m, d = model(), data()
    up = client().local_update(m, ClientRound(Payload(get_params(m), get_buffers(m)), d, {}, ctx()))
    assert PROTOTYPES not in up.extras and HEAD_SHAPE in up.extras


def test_proto_head_flag_selects_the_main_head():
    """``aux_head = false`` on the server ⇒ flag 1 ⇒ prototypes of h."""
    d = data()
    up, _ = _received_model_update(client(proto_steps=0), model(), d, 1.0)
    ref = model()
    with torch.no_grad():
        z = ref.eval().forward_features(d.x)
    per = _per_sample_grads(ref.main_head, z, d.y)
    torch.testing.assert_close(up.extras[PROTOTYPES][0], per[d.y == 0].mean(0))


# -- server ------------------------------------------------------------------------------


def _proto_update(k: int, protos: list[list[float]], counts: list[float]) -> ClientUpdate:
    u = ClientUpdate(k, torch.zeros(1), int(sum(counts)), torch.zeros(0))
    u.extras = {PROTOTYPES: torch.tensor(protos), COUNTS: torch.tensor(counts)}
    return u


def _aggregator(name: str):
    import fedshield.aggregators  # noqa: F401
    from fedshield.aggregators.base import AGGREGATORS

    return AGGREGATORS.get(name)()


def test_prototype_aggregation_is_count_weighted():
    ups = [
        _proto_update(0, [[1.0, 1.0], [0.0, 0.0]], [3, 0]),
        _proto_update(1, [[5.0, -3.0], [2.0, 4.0]], [1, 2]),
    ]
    for rule in (None, _aggregator("mean")):
        mean, total = aggregate_prototypes(ups, rule)
        torch.testing.assert_close(mean, torch.tensor([[2.0, 0.0], [2.0, 4.0]]))
        assert total.tolist() == [4.0, 2.0]
    assert aggregate_prototypes([ClientUpdate(0, torch.zeros(1), 1, torch.zeros(0))]) is None


def test_prototype_aggregation_by_client_sample_counts_is_seed_003s_formula():
    """ḡ_c = Σ_k N_k g_{k,c} / Σ_k N_k over the holders of c (FedCART paper), N_k the client's
    sample count: client 0 (N = 3) and client 1 (N = 3) weigh alike on class 0 although
    client 1 holds one class-0 sample against client 0's three."""
    ups = [
        _proto_update(0, [[1.0, 1.0], [0.0, 0.0]], [3, 0]),
        _proto_update(1, [[5.0, -3.0], [2.0, 4.0]], [1, 2]),
    ]
    mean, total = aggregate_prototypes(ups, None, weighting="client_samples")
    torch.testing.assert_close(mean, torch.tensor([[3.0, -1.0], [2.0, 4.0]]))
    assert total.tolist() == [4.0, 2.0]  # the class totals are still n_{k,c}
    srv = server(proto_weighting="client_samples")
    assert srv.p.proto_weighting == "client_samples"


class _RobustMedian:
    """A stand-in robust, reference-free rule (tags as a registered robust rule carries)."""

    registry_tags = {"robust": frozenset(), "reference_free": frozenset()}
    registry_name = "stub_median"
    calls = 0

    def validate(self, num_rows: int) -> None:
        pass

    def __call__(self, rows: torch.Tensor, weights: torch.Tensor | None = None) -> torch.Tensor:
        type(self).calls += 1
        return rows.median(0).values


def test_prototypes_go_through_the_robust_rule_class_by_class():
    """Class 0 is held by all three clients, one of which uploads a huge prototype: the
    robust rule gives the benign median; class 1 is held by one client only, so its row is
    that client's; class 2 by nobody: a zero row and a zero count, never NaN."""
    ups = [
        _proto_update(0, [[1.0, 2.0], [7.0, 7.0], [9.0, 9.0]], [5, 0, 0]),
        _proto_update(1, [[1.2, 2.2], [3.0, -1.0], [9.0, 9.0]], [5, 4, 0]),
        _proto_update(2, [[1e30, -1e30], [0.0, 0.0], [9.0, 9.0]], [5, 0, 0]),
    ]
    robust = _RobustMedian()
    mean, total = aggregate_prototypes(ups, robust)  # type: ignore[arg-type]
    torch.testing.assert_close(mean[0], torch.tensor([1.2, 2.0]))  # coordinate-wise
    torch.testing.assert_close(mean[1], torch.tensor([3.0, -1.0]))
    torch.testing.assert_close(mean[2], torch.zeros(2))
    assert total.tolist() == [15.0, 4.0, 0.0] and torch.isfinite(mean).all()
    assert _RobustMedian.calls == 2  # one call per class someone holds
    plain, _ = aggregate_prototypes(ups, _aggregator("mean"))
    assert plain[0].abs().max() > 1e28  # the mean follows the attacker


def test_malformed_prototype_rows_are_left_out():
    good = _proto_update(0, [[1.0, 2.0], [3.0, 4.0]], [1, 1])
    wrong_shape = _proto_update(1, [[5.0, 5.0, 5.0], [5.0, 5.0, 5.0]], [1, 1])
    nan = _proto_update(2, [[float("nan"), 0.0], [0.0, 0.0]], [1, 1])
    for order in ([good, wrong_shape, nan], [wrong_shape, nan, good]):
        mean, total = aggregate_prototypes(order, _aggregator("mean"), (2, 2))
        torch.testing.assert_close(mean, torch.tensor([[1.0, 2.0], [3.0, 4.0]]))
        assert total.tolist() == [1.0, 1.0]
    mean, _ = aggregate_prototypes([wrong_shape, good, good], _aggregator("mean"))
    assert mean.shape == (2, 2)  # unset shape: the one most rows have


def test_registry_tags_and_schemas():
    from fedshield.algorithms.client import CLIENT_ALGORITHMS
    from fedshield.algorithms.server import SERVER_ALGORITHMS

    srv = SERVER_ALGORITHMS.entry("fedcart")
    cl = CLIENT_ALGORITHMS.entry("fedcart")
    assert srv.tag_values("needs_client") == {"fedcart"}
    assert cl.tag_values("needs_model") == {"dual_head"}
    assert cl.tag_values("uploads") == {"prototypes"}
    assert srv.schema is FedCARTServerParams and cl.schema is FedCARTParams
    names = ["fedcart", "fedpgd", "fedfat", "fedtrades", "fedmart", "calfat", "fedtaet"]
    for entry in [srv] + [CLIENT_ALGORITHMS.entry(n) for n in names]:
        assert entry.declared and entry.help.endswith(".")
        for name, field in entry.schema.model_fields.items():
            assert field.description and field.description.endswith("."), (entry.name, name)


def server(**params) -> FedCARTServer:
    import fedshield.aggregators  # noqa: F401
    from fedshield.aggregators.base import AGGREGATORS

    agg = AGGREGATORS.get("mean")()
    base = {"match_iters": 20, "retrain_steps": 20, "num_virtual": 10}
    return FedCARTServer(agg, params=parse_params(FedCARTServerParams, {**base, **params}, "s"))


def _round(srv: FedCARTServer, rnd: int = 1, state=None, signal: bool = False):
    """One FedCART round on two clients; returns (θ before, step after post_step)."""
    m = model()
    theta, buffers = get_params(m), get_buffers(m)
    state = srv.init_state(theta) if state is None else state
    payload = srv.broadcast(theta, buffers, state, rctx(rnd))
    cl = client(proto_steps=0)
    ups = []
    for k in range(2):
        torch.manual_seed(k)
        c = ClientContext(k, rnd, torch.Generator().manual_seed(k), torch.device("cpu"))
        ups.append(cl.local_update(m, ClientRound(payload, data(seed=k, signal=signal), {}, c)))
    rnd_in = ServerRound(theta, buffers, state, ups, rctx(rnd))
    step = srv.update(rnd_in)
    return theta, step, srv.post_step(step, rnd_in), payload


P = C * 8 + C  # one head's entries (C = 4 classes, D = 8 features)


def test_cart_step_retrains_only_h_prime_and_keeps_virtual_features():
    theta, agg, out, payload = _round(server())
    assert float(payload.extras[PROTO_HEAD]) == 0.0
    main, aux = slice(-2 * P, -P), slice(-P, None)
    torch.testing.assert_close(out.params[:-P], agg.params[:-P])  # r and h as aggregated
    assert (out.params[aux] - agg.params[aux]).abs().max() > 0  # h' re-trained
    torch.testing.assert_close(agg.params[aux], theta[aux])  # clients never train h'
    assert out.state["zv"].shape == (C, 10, 8)
    assert out.metrics["cart/match_end"] < out.metrics["cart/match_start"]
    assert (out.params[main] - out.params[aux]).abs().max() > 0


def test_virtual_features_warm_start_across_rounds():
    srv = server()
    _, _, first, _ = _round(srv, 1)
    _, _, second, _ = _round(srv, 2, state=first.state)
    # Round 2 starts from round 1's Z_v: its starting distance is below a fresh draw's.
    _, _, fresh, _ = _round(server(warm_start_features=False), 2, state=first.state)
    assert second.metrics["cart/match_start"] < fresh.metrics["cart/match_start"]


def test_ablation_no_cart_copies_h_into_h_prime_and_asks_no_prototypes():
    _, agg, out, payload = _round(server(cart=False))
    assert PROTO_HEAD not in payload.extras
    torch.testing.assert_close(out.params[-P:], agg.params[-2 * P : -P])
    torch.testing.assert_close(out.params[:-P], agg.params[:-P])
    assert "zv" not in out.state and not any(k.startswith("cart/") for k in out.metrics)


def test_ablation_no_aux_head_retrains_h_and_infers_with_it():
    _, agg, out, payload = _round(server(aux_head=False))
    assert float(payload.extras[PROTO_HEAD]) == 1.0
    main, aux = slice(-2 * P, -P), slice(-P, None)
    assert (out.params[main] - agg.params[main]).abs().max() > 0  # h re-trained
    torch.testing.assert_close(out.params[aux], out.params[main])  # inference uses it
    torch.testing.assert_close(out.params[: -2 * P], agg.params[: -2 * P])


def test_server_needs_fedcart_clients():
    srv = server()
    m = model()
    theta = get_params(m)
    plain = [ClientUpdate(0, torch.zeros_like(theta), 4, get_buffers(m))]
    with pytest.raises(ConfigError, match="client.algorithm='fedcart'"):
        srv.update(ServerRound(theta, get_buffers(m), {}, plain, rctx()))


def test_cart_step_logs_its_losses_and_stops_each_phase_on_a_plateau():
    capped = _round(server(match_iters=25, retrain_steps=30, match_window=0, retrain_window=0))[
        2
    ].metrics
    assert capped["cart/match_steps"] == 25 and capped["cart/retrain_steps"] == 30
    assert capped["cart/match_end"] < capped["cart/match_start"]
    assert capped["cart/retrain_loss"] < capped["cart/retrain_start"]
    out = _round(
        server(
            match_iters=5000, match_optimizer="adam", match_lr=0.1, match_window=10,
            match_tol=1e-2, retrain_steps=100000, retrain_lr=0.1, retrain_window=5,
            retrain_tol=1e-2,
        ),
        signal=True,
    )[2]  # fmt: skip
    early = out.metrics
    assert 10 < early["cart/match_steps"] < 5000
    assert 0 < early["cart/retrain_steps"] < 100000
    assert early["cart/match_end"] < 0.05 * early["cart/match_start"]
    # The logged re-training loss is h''s full-data CE on the virtual features it ends with.
    zv = out.state["zv"]
    head = out.params[-P:]
    logits = zv.reshape(-1, 8) @ head[: C * 8].view(C, 8).T + head[C * 8 :]
    labels = torch.arange(C).repeat_interleave(zv.shape[1])
    ce = F.cross_entropy(logits, labels).item()
    assert early["cart/retrain_loss"] == pytest.approx(ce, rel=1e-5)


def test_extreme_finite_prototypes_never_make_theta_non_finite():
    """Prototypes of 1e30 (a non-robust rule lets one attacker set them) overflow the
    matching loss; the CART step then keeps h' and Z_v instead of writing NaN."""
    for optimizer in ("sgd", "adam"):
        srv = server(match_iters=5, match_optimizer=optimizer)
        _, agg, _, _ = _round(srv)
        agg.state["proto"] = torch.full_like(agg.state["proto"], 1e30)
        out = srv.post_step(agg, ServerRound(agg.params, agg.buffers, agg.state, [], rctx()))
        assert torch.isfinite(out.params).all() and torch.isfinite(out.state["proto"]).all()
        if optimizer == "sgd":  # SGD's step overflows: the phase is skipped, θ kept
            assert out.metrics["cart/skipped"] == 1.0
            torch.testing.assert_close(out.params, agg.params)


def test_head_shape_is_what_most_clients_upload():
    from fedshield.algorithms.server.fedcart import _head_shape

    def up(shape: list[float]) -> ClientUpdate:
        u = ClientUpdate(0, torch.zeros(1), 1, torch.zeros(0))
        u.extras = {HEAD_SHAPE: torch.tensor(shape)}
        return u

    ups = [up([4, 8]), up([4, 8]), up([1e6, 8]), up([2, 3])]
    assert _head_shape(ups, 200).tolist() == [4.0, 8.0]
    assert _head_shape([up([1e6, 8])], 200) is None  # two such heads cannot fit


def test_cold_start_retraining_is_seeded():
    a = _round(server(retrain_warm_start=False))[2].params
    b = _round(server(retrain_warm_start=False))[2].params
    warm = _round(server(retrain_warm_start=True))[2].params
    torch.testing.assert_close(a, b)
    assert (a[-P:] - warm[-P:]).abs().max() > 0


# -- FedTAET ---------------------------------------------------------------------------------


def test_fedtaet_client_is_natural_ce_then_harl_and_reads_the_round():
    from fedshield.algorithms.client.adversarial_training import (
        FedTAET,
        TAETParams,
        with_round,
    )
    from fedshield.losses import harl_loss

    torch.manual_seed(0)
    m = build_model("cnn_small", SHAPE, C, width=4, hidden=8)
    d = data()
    x, y = d.x[:8], d.y[:8]
    x_adv = (x + 0.05).clamp(0, 1)
    spec = LocalSpec(lr=0.05, batch_size=8, steps=1)
    cl = FedTAET(spec, parse_params(TAETParams, {"stabilize_rounds": 3}, "client.params"))
    cl.pgd_examples = lambda model, x, y, steps=None, draws=None: x_adv  # type: ignore[method-assign]
    base = Payload(get_params(m), get_buffers(m))
    torch.testing.assert_close(cl.loss(m, x, y, with_round(base, 3)), F.cross_entropy(m(x), y))
    torch.testing.assert_close(cl.loss(m, x, y, with_round(base, 4)), harl_loss(m(x_adv), y))
    seen = []
    real_loss = cl.loss
    cl.loss = lambda model, x, y, payload, consts=None: (  # type: ignore[method-assign]
        seen.append(float(payload.extras["taet/round"])) or real_loss(model, x, y, payload, consts)
    )
    cl.local_update(m, ClientRound(base, d, {}, ctx(rnd=5)))
    assert seen == [5.0]
