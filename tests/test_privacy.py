"""Differential privacy (docs/privacy.md): DP-FedAvg's clipping, sensitivity, noise and accounting,
and Opacus DP-SGD on the clients — against Opacus' own accountant, optimizer and
``torch.func`` per-sample gradients."""

from __future__ import annotations

import functools
import json
import math
import re

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from fedshield import aggregators, config
from fedshield.algorithms.client import CLIENT_ALGORITHMS, ClientContext, ClientRound, LocalSpec
from fedshield.algorithms.client.base import batch_indices
from fedshield.algorithms.server import ServerRound
from fedshield.algorithms.server.fedavg import FedAvg
from fedshield.core.context import ClientUpdate, Payload, RoundContext, derive_seed, make_generator
from fedshield.core.flat import get_params
from fedshield.core.params import parse_params
from fedshield.data.bundle import TensorData
from fedshield.errors import ConfigError
from fedshield.privacy import CentralDP, LocalDPSGD, clip_rows, epsilon, sensitivity
from fedshield.privacy.local import NOISE_PURPOSE, model_problems
from fedshield.privacy.sensitivity import MEDIAN_RADIUS, trimmed_mean_radius
from fedshield.sim.builder import build
from fedshield.sim.privacy import attach_privacy, participations

opacus = pytest.importorskip("opacus")
from opacus.accountants import RDPAccountant  # noqa: E402
from opacus.accountants.utils import get_noise_multiplier  # noqa: E402

C = 1.0

# -- clipping ---------------------------------------------------------------------------


def test_clipping_bounds_every_row_and_keeps_small_rows():
    g = torch.Generator().manual_seed(0)
    x = (
        torch.randn(8, 500, generator=g)
        * torch.tensor([1e-3, 0.01, 0.1, 1, 10, 1e3, 0, 1])[:, None]
    )
    x[7] = 3e37  # finite float32 row whose float32 norm overflows
    out, norms = clip_rows(x, C)
    out_norms = torch.linalg.vector_norm(out.double(), dim=1)
    assert torch.all(out_norms <= C * (1 + 1e-6))
    small = norms <= C
    torch.testing.assert_close(out[small], x[small])  # rows inside the ball are untouched
    big = ~small
    assert torch.allclose(out_norms[big], torch.full_like(out_norms[big], C), rtol=1e-6)
    cos = F.cosine_similarity(out[big].double(), x[big].double(), dim=1)
    assert torch.allclose(cos, torch.ones_like(cos))  # same direction
    assert not torch.isnan(out).any()


# -- sensitivity: the aggregate moves by at most Δ₂ when one client is added/removed -----

RULES = [
    ("mean", {}),
    ("drag", {"c": 0.2}),
    ("drag", {"c": 0.9}),
    ("brdrag", {"c": 0.5}),
    ("brdrag", {"c": 0.8}),
    ("fltrust", {}),
    ("krum", {"f": 1}),
    ("multikrum", {"f": 1}),
    ("geomed", {}),
    ("rfa", {}),
    ("raga", {}),
    ("median", {}),
    ("trimmed_mean", {"f": 1}),
    ("trimmed_mean", {"f": 2}),
    ("centered_clipping", {"tau": 0.3, "iters": 2}),
    ("centered_clipping", {"tau": 5.0, "iters": 1}),
]


class _Root:
    """Server services whose root-data reference has a norm far above C (must be clipped)."""

    def __init__(self, ref: torch.Tensor) -> None:
        self.ref = ref

    def root_update(self, params, buffers, ctx):
        return ClientUpdate(-1, self.ref.clone(), 100, buffers)


def _dp_server(name: str, args: dict, z: float = 0.0) -> FedAvg:
    rule = aggregators.build(name, **args)
    server = FedAvg(rule, weighting="uniform")
    server.central_dp = CentralDP(rule, clip=C, noise_multiplier=z, delta=1e-5, sample_rate=0.5)
    return server


def _aggregate(server: FedAvg, rows: torch.Tensor, s: int, services, state=None, rnd: int = 1):
    ups = [ClientUpdate(i, r.clone(), 10, torch.zeros(0)) for i, r in enumerate(rows)]
    ctx = RoundContext(rnd, tuple(range(s)), (), 0, 2 * s, torch.device("cpu"))
    d = rows.shape[1]
    return server.aggregate(
        ServerRound(torch.zeros(d), torch.zeros(0), state or {}, ups, ctx, services)
    )


def _neighbours(
    g: torch.Generator, d: int, s: int, trial: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """(X with S − 1 rows, X' = X plus one row), rows of norm up to 10·C (clipped inside);
    some trials put every row on a few extreme directions (worst cases of the order
    statistics and of the selections)."""
    scale = 10.0 if trial % 2 else 1.0
    if trial % 3 == 0:
        base = torch.eye(d)[: min(d, 3)]
        if trial % 2:
            base = (base + base.roll(1, dims=1)) / math.sqrt(2)
        pick = torch.randint(0, base.shape[0], (s,), generator=g)
        signs = torch.where(torch.rand(s, generator=g) < 0.5, -1.0, 1.0)
        x = base[pick] * signs[:, None] * scale
    else:
        x = torch.randn(s, d, generator=g) * scale
    return x[:-1], x


@pytest.mark.parametrize(("name", "args"), RULES, ids=lambda v: str(v))
def test_aggregate_moves_at_most_the_stated_sensitivity(name, args):
    g = torch.Generator().manual_seed(1)
    d, s = 4, 7
    worst = 0.0
    for trial in range(40):
        x, x2 = _neighbours(g, d, s, trial)
        services = _Root(torch.randn(d, generator=g) * 50)  # ‖r‖ ≫ C
        state = {}
        if name == "centered_clipping":  # a public centre (the previous noised aggregate)
            state = {"center": torch.randn(d, generator=g) * (3.0 if trial % 2 else 0.2)}
        server = _dp_server(name, args)
        a = _aggregate(server, x, s, services, state)
        b = _aggregate(server, x2, s, services, state)
        bound = a.metrics["privacy/sensitivity"]
        assert bound == b.metrics["privacy/sensitivity"]
        dist = float(torch.linalg.vector_norm((a.delta - b.delta).double()))
        assert dist <= bound * (1 + 1e-5), (trial, dist, bound)
        worst = max(worst, dist / bound)
    assert worst > 0.05  # the neighbours do move the aggregate: the check is not vacuous


def test_mean_sensitivity_is_c_over_s_and_attained():
    """DP-FedAvg's fixed denominator: adding a client of norm C moves Σ/S by exactly C/S
    (a mean over the rows received would move by 2C/S here)."""
    s = 5
    x2 = torch.zeros(s, 3)
    x2[:-1, 0] = -C
    x2[-1, 0] = C
    server = _dp_server("mean", {})
    a = _aggregate(server, x2[:-1], s, None)
    b = _aggregate(server, x2, s, None)
    assert a.metrics["privacy/sensitivity"] == pytest.approx(C / s)
    assert float((a.delta - b.delta).norm()) == pytest.approx(C / s, rel=1e-6)


def test_coordinate_median_leaves_the_c_ball_but_not_sqrt2():
    a = C / math.sqrt(2)
    x = torch.tensor([[a, a, 0.0], [a, 0.0, a], [0.0, a, a]])
    med = aggregators.build("median")(x)
    assert float(med.norm()) == pytest.approx(math.sqrt(1.5) * C)  # > C: 2C would be unsafe
    assert float(med.norm()) <= MEDIAN_RADIUS * C
    assert sensitivity(aggregators.build("median"), C, 3).value == pytest.approx(2 * math.sqrt(2))
    # the trimmed-mean radius √((3f+1)/(f+1)) is reached in the limit; f = 0 is the mean's 1
    assert trimmed_mean_radius(0) == 1.0 and trimmed_mean_radius(1) == pytest.approx(math.sqrt(2))


def test_brdrag_reference_is_clipped():
    """BR-DRAG rescales every row to ‖r‖: without clipping r the aggregate would be ~‖r‖."""
    server = _dp_server("brdrag", {"c": 0.5})
    out = _aggregate(server, torch.randn(4, 6), 4, _Root(torch.full((6,), 100.0)))
    assert float(out.delta.norm()) <= C * (1 + 1e-6)


# -- noise ------------------------------------------------------------------------------


@pytest.mark.parametrize(("name", "args"), [("mean", {}), ("median", {}), ("krum", {"f": 1})])
def test_noise_std_is_z_times_sensitivity_and_seeded(name, args):
    z, s, d = 1.3, 5, 200_000
    server = _dp_server(name, args, z=z)
    rows = torch.zeros(s, d)
    a = _aggregate(server, rows, s, None)
    sens = sensitivity(server.aggregator, C, s).value
    assert a.metrics["privacy/noise_std"] == pytest.approx(z * sens)
    noise = a.delta.double()  # the rule's output on zero rows is 0: all of it is noise
    assert float(noise.std()) == pytest.approx(z * sens, rel=0.01)
    assert abs(float(noise.mean())) < 4 * z * sens / math.sqrt(d)
    again = _aggregate(server, rows, s, None)
    torch.testing.assert_close(again.delta, a.delta)  # seeded by (seed, round)
    other = _aggregate(server, rows, s, None, rnd=2)
    assert not torch.equal(other.delta, a.delta)


# -- accounting -------------------------------------------------------------------------


@functools.lru_cache
def _opacus_eps(z: float, q: float, steps: int, delta: float) -> float:
    acc = RDPAccountant()
    acc.history = [(z, q, steps)]
    return acc.get_epsilon(delta)


@pytest.mark.parametrize(("z", "q", "steps"), [(1.1, 0.5, 7), (0.8, 0.01, 300), (2.0, 1.0, 3)])
def test_epsilon_equals_opacus_rdp_accountant(z, q, steps):
    assert epsilon(z, q, steps, 1e-5) == pytest.approx(_opacus_eps(z, q, steps, 1e-5), rel=1e-12)
    assert epsilon(z, q, 0, 1e-5) == 0.0 and epsilon(0.0, q, steps, 1e-5) == math.inf


def _cfg(rounds: int = 6, per_round: int = 4, **privacy) -> config.ExperimentConfig:
    return config.validate(
        {
            "name": "dp",
            "seed": 3,
            "rounds": rounds,
            "data": {"dataset": "digits", "num_clients": 8, "partition": "iid"},
            "model": {"name": "mlp", "params": {"hidden": 16}},
            "client": {"lr": 0.1, "batch_size": 16, "local_steps": 2},
            "server": {"clients_per_round": per_round, "weighting": "uniform"},
            "run": {"progress": False},
            "privacy": privacy,
        }
    )


def test_run_reports_opacus_epsilon_per_round_for_central_and_local():
    cfg = _cfg(
        rounds=3,
        central={"clip": 0.5, "noise_multiplier": 1.1, "delta": 1e-4},
        local={"clip": 1.0, "noise_multiplier": 0.9, "delta": 1e-5},
    )
    exp = build(cfg)
    setup = attach_privacy(exp)
    (acct,) = setup.callbacks
    sizes = [len(c) for c in exp.clients]
    for t in range(1, cfg.rounds + 1):
        rec = {"round": t}
        acct.after_round(None, rec, {})
        assert rec["privacy/epsilon"] == pytest.approx(_opacus_eps(1.1, 4 / 8, t, 1e-4), rel=1e-12)
        counts = participations(cfg, t)
        want = [
            _opacus_eps(0.9, 16 / n, 2 * int(r), 1e-5) if r else 0.0 for n, r in zip(sizes, counts)
        ]
        assert rec["privacy/local_epsilon_max"] == pytest.approx(max(want), rel=1e-12)
        assert rec["privacy/local_epsilon_mean"] == pytest.approx(sum(want) / len(want))
    report = acct.report()
    assert report["local"]["epsilon"] == pytest.approx(want)


def test_resumed_run_composes_the_noise_multipliers_of_both_sessions():
    """Extending a target-ε run changes z; rounds 1–2 ran with the old z (in their records)."""
    from types import SimpleNamespace

    from fedshield.sim.privacy import PrivacyAccounting, PrivacySetup

    cfg = _cfg(rounds=3)
    rule = aggregators.build("mean")

    def accounting(z):
        central = CentralDP(rule, clip=1.0, noise_multiplier=z, delta=1e-5, sample_rate=0.5)
        return PrivacyAccounting(PrivacySetup(central=central), cfg, [100] * 8)

    first = accounting(1.0)
    records = [{"round": t} for t in (1, 2)]
    for r in records:
        first.after_round(None, r, {})
    resumed = accounting(2.0)
    rec = {"round": 3}
    resumed.after_round(SimpleNamespace(records=records), rec, {})
    acc = RDPAccountant()
    acc.history = [(1.0, 0.5, 2), (2.0, 0.5, 1)]
    assert rec["privacy/epsilon"] == pytest.approx(acc.get_epsilon(1e-5), rel=1e-12)
    assert resumed.report()["central"]["rounds_per_noise_multiplier"] == {"1.0": 2, "2.0": 1}


def test_target_epsilon_gives_opacus_noise_multiplier_within_target():
    target, delta = 3.0, 1e-4
    # full participation (q = 1): Opacus' RDP is closed-form there, which keeps the two
    # bisections (ours, Opacus') fast; the subsampled case is covered by the tests above
    cfg = _cfg(per_round=8, central={"clip": 0.7, "target_epsilon": target, "delta": delta})
    exp = build(cfg)
    setup = attach_privacy(exp)
    z = setup.central.noise_multiplier
    want = get_noise_multiplier(
        target_epsilon=target, target_delta=delta, sample_rate=1.0, steps=cfg.rounds
    )
    assert z == pytest.approx(want)
    eps = _opacus_eps(z, 1.0, cfg.rounds, delta)
    assert target - 0.05 < eps <= target
    # and the noise the server adds is that z times the rule's sensitivity C/S
    server = exp.components.server
    out = _aggregate(server, torch.zeros(8, 100_000), 8, None)
    assert out.metrics["privacy/noise_std"] == pytest.approx(z * 0.7 / 8)
    assert float(out.delta.std()) == pytest.approx(z * 0.7 / 8, rel=0.02)


def test_local_target_epsilon_holds_for_every_client():
    target, delta = 4.0, 1e-5
    cfg = _cfg(local={"clip": 1.0, "target_epsilon": target, "delta": delta})
    exp = build(cfg)
    setup = attach_privacy(exp)
    z = setup.local.noise_multiplier
    counts = participations(cfg, cfg.rounds)
    eps = [_opacus_eps(z, 16 / len(c), 2 * int(r), delta) for c, r in zip(exp.clients, counts)]
    assert max(eps) <= target
    assert max(eps) > target - 0.1  # not more noise than the worst client needs


# -- refused combinations ---------------------------------------------------------------


def _raw(**over):
    raw = {
        "name": "dp",
        "rounds": 2,
        "data": {"dataset": "digits", "num_clients": 6, "partition": "iid", "root_size": 50},
        "model": {"name": "mlp", "params": {"hidden": 16}},
        "client": {"lr": 0.1, "batch_size": 16, "local_steps": 2},
        "server": {"clients_per_round": 3, "weighting": "uniform"},
        "run": {"progress": False},
    }
    for k, v in over.items():
        raw = config.apply_overrides(raw, [f"{k}={json.dumps(v)}"])
    return raw


@pytest.mark.parametrize(
    ("over", "words"),
    [
        (
            {"server.algorithm": "drag", "server.aggregator": "drag"},
            ["privacy.central", "server.algorithm='drag'"],
        ),
        ({"server.algorithm": "fedexp"}, ["privacy.central", "server.algorithm='fedexp'"]),
        ({"server.weighting": "samples"}, ["privacy.central", "server.weighting='uniform'"]),
    ],
)
def test_central_dp_refuses_what_it_cannot_cover(over, words):
    raw = _raw(**over)
    raw["privacy"] = {"central": {"noise_multiplier": 1.0}}
    with pytest.raises(ConfigError) as err:  # by build_components, before the data
        build(config.validate(raw))
    for w in words:
        assert w in str(err.value)


@pytest.mark.parametrize("declared", [False, True])
def test_a_plugin_declares_its_dp_compatibility_with_tags(monkeypatch, declared):
    """Compatibility is read from the registry tags (``central_dp``, ``local_dp``), so a
    plugin's subclass of a compatible component is refused until it declares them."""
    from fedshield.algorithms.client.sgd import LocalSGD
    from fedshield.algorithms.server import SERVER_ALGORITHMS

    for reg in (SERVER_ALGORITHMS, CLIENT_ALGORITHMS):  # registrations undone after the test
        monkeypatch.setattr(reg, "_entries", dict(reg._entries))
    server_tags, client_tags = (["central_dp"], ["local_dp"]) if declared else ([], [])
    SERVER_ALGORITHMS.register("_dp_plugin", tags=server_tags)(type("S", (FedAvg,), {}))
    CLIENT_ALGORITHMS.register("_dp_plugin", tags=client_tags)(type("C", (LocalSGD,), {}))
    raw = _raw(**{"server.algorithm": "_dp_plugin", "client.algorithm": "_dp_plugin"})
    for key, words in [
        ("central", "server.algorithm='_dp_plugin' computes more than the noised aggregate"),
        ("local", "client.algorithm='_dp_plugin' runs its own training loop"),
    ]:
        raw["privacy"] = {key: {"noise_multiplier": 1.0}}
        if declared:
            attach_privacy(build(config.validate(raw)))
        else:
            with pytest.raises(ConfigError, match=re.escape(f"privacy.{key}: {words}")):
                attach_privacy(build(config.validate(raw)))


def test_local_dp_refuses_attacks_in_training_mode():
    raw = _raw(**{"client.algorithm": "fedpgd", "client.params.attack_eval_mode": False})
    raw["privacy"] = {"local": {"noise_multiplier": 1.0}}
    with pytest.raises(ConfigError, match=r"privacy.local.*client.params.attack_eval_mode"):
        attach_privacy(build(config.validate(raw)))


def test_local_dp_refuses_batchnorm():
    problems = model_problems(nn.Sequential(nn.Conv2d(1, 2, 3), nn.BatchNorm2d(2)))
    assert problems and "BatchNorm" in " ".join(problems)


def test_config_needs_exactly_one_noise_source():
    with pytest.raises(ConfigError, match=r"privacy.central.*exactly one"):
        config.validate(_raw(**{"privacy.central.clip": 1.0}))
    with pytest.raises(ConfigError, match="privacy.local"):
        config.validate(
            _raw(**{"privacy.local.noise_multiplier": 1.0, "privacy.local.target_epsilon": 2.0})
        )


# -- local DP-SGD against Opacus --------------------------------------------------------


def _net() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Flatten(), nn.Linear(64, 12), nn.ReLU(), nn.Linear(12, 10))


def _data(n: int = 24, dtype: torch.dtype = torch.float32) -> TensorData:
    g = torch.Generator().manual_seed(5)
    x = torch.rand(n, 1, 8, 8, generator=g).to(dtype)
    return TensorData(x, torch.randint(0, 10, (n,), generator=g))


def _client(name: str, z: float, clip: float, local_steps: int = 3, **params):
    cls = CLIENT_ALGORITHMS.get(name)
    spec = LocalSpec(lr=0.3, batch_size=8, steps=local_steps)
    client = cls(spec, parse_params(cls.params_schema, params, "client.params"))
    client.dp_sgd = LocalDPSGD(clip=clip, noise_multiplier=z, delta=1e-5)
    return client


def _ctx(rnd: int = 2, k: int = 1) -> ClientContext:
    return ClientContext(k, rnd, make_generator(0, rnd, k, 4), torch.device("cpu"))


def _batches(ctx_seed_parts, n: int, steps: int) -> list[torch.Tensor]:
    return list(batch_indices(n, 8, steps, make_generator(*ctx_seed_parts)))


def test_dp_sgd_client_equals_opacus_make_private():
    """Our client's DP-SGD update = Opacus' PrivacyEngine on the same batches and noise seed."""
    from opacus import PrivacyEngine

    z, clip, data = 0.7, 0.5, _data()
    model = _net()
    start = get_params(model)
    client = _client("sgd", z, clip)
    ctx = _ctx()
    up = client.local_update(model, ClientRound(Payload(start, torch.zeros(0)), data, {}, ctx))

    ref = _net()
    batches = _batches((0, 2, 1, 4), len(data), 3)
    loader = torch.utils.data.DataLoader(
        torch.utils.data.TensorDataset(data.x, data.y), batch_sampler=[b.tolist() for b in batches]
    )
    noise = torch.Generator().manual_seed(derive_seed(ctx.generator.initial_seed(), NOISE_PURPOSE))
    opt = torch.optim.SGD(ref.parameters(), lr=0.3)
    engine = PrivacyEngine()
    ref, opt, loader = engine.make_private(
        module=ref, optimizer=opt, data_loader=loader, noise_multiplier=z, max_grad_norm=clip,
        poisson_sampling=False, noise_generator=noise,
    )  # fmt: skip
    for x, y in loader:
        opt.zero_grad()
        F.cross_entropy(ref(x), y).backward()
        opt.step()
    torch.testing.assert_close(start + up.delta, get_params(ref._module), atol=1e-6, rtol=1e-5)
    assert not hasattr(model[1], "activations")  # Opacus' hooks and state are gone again


def _reference_dp_sgd(model, data, batches, loss_fn, z, clip, lr, noise_seed, prox_mu=0.0):
    """DP-SGD by hand: torch.func per-sample gradients, Opacus' clip factor
    min(1, C/(‖g_i‖ + 1e-6)), N(0, (zC)²) per parameter from the same generator, /B."""
    from torch.func import functional_call, grad, vmap

    start = {k: v.detach().clone() for k, v in model.named_parameters()}
    gen = torch.Generator().manual_seed(noise_seed)
    for idx in batches:
        x, y = data.x[idx], data.y[idx]
        params = {k: v.detach() for k, v in model.named_parameters()}
        extra = loss_fn.prepare(model, x, y)

        def one(p, xi, yi, *ei):
            return loss_fn(lambda inp: functional_call(model, p, (inp,)), xi[None], yi[None],
                           *[e[None] for e in ei])  # fmt: skip

        per = vmap(grad(one), in_dims=(None, 0, 0, *[0] * len(extra)))(params, x, y, *extra)
        norms = torch.stack([per[k].reshape(len(idx), -1).norm(dim=1) for k in params]).norm(dim=0)
        factor = (clip / (norms + 1e-6)).clamp(max=1.0)
        with torch.no_grad():
            for k, p in model.named_parameters():
                summed = torch.einsum("i,i...->...", factor, per[k])
                noise = torch.normal(0.0, z * clip, p.shape, generator=gen, dtype=p.dtype)
                g = (summed + noise) / 8 + prox_mu * (p - start[k])
                p -= lr * g
    return get_params(model)


class _CE:
    def prepare(self, model, x, y):
        return ()

    def __call__(self, f, x, y):
        return F.cross_entropy(f(x), y)


class _Trades:
    """FedTRADES' loss on fixed adversarial examples (generated exactly as the client does)."""

    def __init__(self, client):
        self.client = client

    def prepare(self, model, x, y):
        return (self.client.trades_examples(model, x),)

    def __call__(self, f, x, y, x_adv):
        from fedshield.losses import trades_loss

        return trades_loss(f(x), f(x_adv), y, 6.0)


class _FAT:
    def __init__(self, client):
        self.client = client

    def prepare(self, model, x, y):
        return (self.client.pgd_examples(model, x, y),)

    def __call__(self, f, x, y, x_adv):
        return F.cross_entropy(f(x), y) + F.cross_entropy(f(x_adv), y)


@pytest.mark.parametrize("name", ["fedprox", "fedtrades", "fedfat"])
def test_dp_sgd_matches_per_sample_reference(name):
    """FedProx's proximal term is added after the noise; the two-forward AT losses get the
    per-sample gradients of ℓ_i(x_i) + ℓ'_i(x'_i), the attack's passes contributing none.

    In float64: Opacus' hooks and the reference's vmap are different kernels, and in float32
    their last-bit differences can flip the sign of a near-zero input gradient inside PGD
    (x' then moves by 2α in that pixel: 1e-5 on a few parameters on an AVX-512 CPU). In
    float64 both sides agree to ~1e-16 here; 1e-12 leaves 10^4 ulps of room and is still
    far below any formula error (≥ 1e-3)."""
    z, clip, data = 0.6, 0.4, _data(dtype=torch.float64)
    params = {"mu": 0.5} if name == "fedprox" else {"steps": 2}
    client = _client(name, z, clip, **params)
    model = _net().double()
    start = get_params(model)
    ctx = _ctx()
    torch.manual_seed(11)  # the attacks' random starts (the engine seeds per client)
    up = client.local_update(model, ClientRound(Payload(start, start.new_zeros(0)), data, {}, ctx))

    ref = _net().double()
    loss = {"fedprox": _CE(), "fedtrades": _Trades(client), "fedfat": _FAT(client)}[name]
    torch.manual_seed(11)
    want = _reference_dp_sgd(
        ref, data, _batches((0, 2, 1, 4), len(data), 3), loss, z, clip, 0.3,
        derive_seed(ctx.generator.initial_seed(), NOISE_PURPOSE),
        prox_mu=0.5 if name == "fedprox" else 0.0,
    )  # fmt: skip
    torch.testing.assert_close(start + up.delta, want, atol=1e-12, rtol=0.0)


def test_dp_sgd_leaves_the_model_as_it_was():
    """In-place ReLUs restored, Opacus' hooks removed: plain training afterwards equals
    plain training of a model that never ran DP-SGD."""
    from fedshield.models import build_model

    def fresh():
        torch.manual_seed(0)
        return build_model("mlp", (1, 8, 8), 10, hidden=8)

    used, never = fresh(), fresh()
    payload = Payload(get_params(used), torch.zeros(0))
    _client("sgd", 1.0, 1.0).local_update(used, ClientRound(payload, _data(), {}, _ctx()))
    relus = [m for m in used.modules() if isinstance(m, nn.ReLU)]
    assert relus and all(m.inplace for m in relus)
    assert not any(m._forward_hooks or m._backward_hooks for m in used.modules())
    plain = CLIENT_ALGORITHMS.get("sgd")(LocalSpec(lr=0.3, batch_size=8, steps=3))
    a = plain.local_update(used, ClientRound(payload, _data(), {}, _ctx()))
    b = plain.local_update(never, ClientRound(payload, _data(), {}, _ctx()))
    torch.testing.assert_close(a.delta, b.delta)


# -- end to end --------------------------------------------------------------------------


@pytest.mark.slow
def test_dp_run_with_attack_robust_rule_and_adversarial_training(tmp_path):
    """Central DP + Median + sign-flip attackers + FedTRADES under DP-SGD, on both files."""
    from fedshield.sim.engine import Simulator

    raw = _raw(
        **{
            "server.aggregator": "median",
            "attack.name": "sign_flip",
            "attack.fraction": 0.34,
            "attack.mode": "per_round",
            "client.algorithm": "fedtrades",
            "client.params.steps": 1,
        }
    )
    raw["privacy"] = {
        # a small central z: Median's Δ₂ = 2√2·C with S = 3 would otherwise swamp θ
        "central": {"clip": 1.0, "noise_multiplier": 0.05, "delta": 1e-3},
        "local": {"clip": 1.0, "noise_multiplier": 0.5},
    }
    cfg = config.validate(raw)
    sim = Simulator(build(cfg), tmp_path / "run")
    sim.run()
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").open()]
    assert [r["round"] for r in rows] == [1, 2]
    for r in rows:
        assert r["privacy/epsilon"] == pytest.approx(_opacus_eps(0.05, 0.5, r["round"], 1e-3))
        assert r["privacy/noise_std"] == pytest.approx(0.05 * 2 * math.sqrt(2))
        assert r["privacy/local_epsilon_max"] > 0
        assert math.isfinite(r["test_acc"])
    report = json.loads((tmp_path / "run" / "privacy.json").read_text())
    assert report["central"]["epsilon"] == pytest.approx(rows[-1]["privacy/epsilon"])
    assert len(report["local"]["epsilon"]) == 6


@pytest.mark.parametrize(
    ("sets", "message"),
    [
        (
            ["privacy.central.clip=0.5", "privacy.central.noise_multiplier=1",
             'server.aggregator="bulyan"'],
            "no known L2 sensitivity",
        ),
        (
            ["privacy.local.clip=1.0", "privacy.local.noise_multiplier=1",
             'client.algorithm="fedtaet"'],
            "its own training loop",
        ),
    ],
)  # fmt: skip
def test_what_cannot_be_private_is_refused_before_any_data(
    tmp_path, capsys, monkeypatch, sets, message
) -> None:
    """These were refused by the Simulator, after the data was loaded and split."""
    import fedshield.sim.builder as builder
    from fedshield.testing.cli import one_line_error

    def refuse(*a, **k):
        raise AssertionError("data was loaded before the privacy check")

    monkeypatch.setattr(builder, "load_dataset", refuse)
    out = tmp_path / "run"
    argv = ["run", "--preset", "brdrag-digits-cpu", "--out", str(out), "-q",
            "--set", 'server.algorithm="fedavg"']  # fmt: skip
    for s in sets:
        argv += ["--set", s]
    one_line_error(capsys, argv, message)
    assert not out.exists()
