"""fedshield.flower.strategies: Flower-native strategies, without Ray.

Replies are scripted by a ClientApp served in process (``LocalGrid``): client k returns
θ_start + G_k^t (G seeded by (round, k)), its buffers and a count. Each strategy's model
is compared with the fedshield server algorithm run directly on the same updates, and
Krum / Median / FedAvg with Flower's own strategies on the same replies.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
import torch
from torch import nn

pytest.importorskip("flwr")

from flwr.app import (
    Array,
    ArrayRecord,
    ConfigRecord,
    Context,
    Message,
    MetricRecord,
    RecordDict,
)
from flwr.clientapp import ClientApp
from flwr.serverapp import strategy as flwr_strategy

from fedshield.aggregators import AGGREGATORS
from fedshield.algorithms.server import SERVER_ALGORITHMS
from fedshield.algorithms.server.base import ServerRound, ServerStep
from fedshield.algorithms.server.cohort import round_budget
from fedshield.algorithms.server.step import cap_counts
from fedshield.core.context import ClientUpdate, RoundContext
from fedshield.errors import ConfigError
from fedshield.flower import strategies as S
from fedshield.flower.client_tools import (
    DH,
    REF,
    H,
    ScaffoldClient,
    drag_calibrate_local,
)
from fedshield.flower.local import LocalGrid

M = 5  # nodes
ROUNDS = 2


class BNNet(nn.Module):
    """Parameters, BatchNorm running statistics and an integer counter."""

    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Linear(6, 4)
        self.bn = nn.BatchNorm1d(4)
        self.fc2 = nn.Linear(4, 3)


def initial(model_cls: type[nn.Module] = BNNet) -> ArrayRecord:
    torch.manual_seed(0)
    return ArrayRecord(model_cls().state_dict())


def update_of(seed: int, like: torch.Tensor, scale: float) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return scale * torch.randn(like.shape, generator=g, dtype=like.dtype)


def move(rnd: int, i: int, k: int, like: torch.Tensor) -> torch.Tensor:
    """Client k's move of array i in round rnd: clients differ in scale (0.1 to 0.5)."""
    return update_of(10_000 * rnd + 100 * i + k, like, 0.1 * (1 + k % 5))


def count_of(k: int) -> int:
    return 10 + 7 * k


def reply_arrays(k: int, rnd: int, start: ArrayRecord) -> dict[str, np.ndarray]:
    """Client k's trained model in round ``rnd``: start + G_k (positive running variances,
    an integer counter moved too)."""
    out = {}
    for i, (name, a) in enumerate(start.items()):
        v = torch.from_numpy(a.numpy())
        if name.endswith("running_var"):
            out[name] = (v.abs() + move(rnd, i, k, v).abs()).numpy()
        elif v.is_floating_point():
            out[name] = (v + move(rnd, i, k, v)).numpy()
        else:
            out[name] = (v + rnd).numpy()
    return out


def dh_arrays(k: int, rnd: int, h: ArrayRecord) -> dict[str, np.ndarray]:
    """Client k's scripted SCAFFOLD Δh, keyed like the parameters."""
    return {n: move(rnd, 50, k, torch.from_numpy(a.numpy())).numpy() for n, a in h.items()}


def scripted_app(forge: dict[int, Callable[[RecordDict], None]] | None = None) -> ClientApp:
    """Client k replies :func:`reply_arrays`, count_of(k) and, to SCAFFOLD, a Δh;
    ``forge[k]`` may rewrite its reply."""
    app = ClientApp()

    @app.train()
    def _train(msg: Message, context: Context) -> Message:
        k = int(context.node_config["partition-id"])
        rnd = int(msg.content["config"]["server-round"])
        arrays = reply_arrays(k, rnd, msg.content["arrays"])
        metrics = {"num-examples": count_of(k), "train_loss": float(k)}
        content = RecordDict(
            {
                "arrays": ArrayRecord({n: Array(v) for n, v in arrays.items()}),
                "metrics": MetricRecord(metrics),
            }
        )
        if H in msg.content.array_records:
            dh = dh_arrays(k, rnd, msg.content.array_records[H])
            content[DH] = ArrayRecord({n: Array(v) for n, v in dh.items()})
        if forge and k in forge:
            forge[k](content)
        return Message(content, reply_to=msg)

    return app


def run(strategy: S.FedshieldRule, grid: LocalGrid, rounds: int = ROUNDS, model=BNNet):
    return strategy.start(grid, initial(model), num_rounds=rounds)


def flat_of(record: ArrayRecord, strategy: S.FedshieldRule) -> tuple[torch.Tensor, torch.Tensor]:
    return strategy.layout.decode(record)


# -- the reference: the fedshield server algorithm on the same updates -----------------------
def reference_fn(arrays: ArrayRecord, server_round: int) -> ArrayRecord:
    """The server's 'root training': a fixed move of the weights per round (trusted)."""
    out = {}
    for name, a in arrays.items():
        v = torch.from_numpy(a.numpy())
        if name.endswith("weight"):
            v = v + update_of(999 + server_round, v, 0.2)
        out[name] = Array(v.numpy())
    return ArrayRecord(out)


class RefServices:
    """The root update of :func:`reference_fn`, as the simulator's services give it."""

    def __init__(self, layout, passed) -> None:
        self.layout, self.passed = layout, passed

    def root_update(self, params, buffers, ctx):
        record = reference_fn(self.layout.encode(params, buffers, self.passed), ctx.round)
        p, _ = self.layout.decode(record)
        return ClientUpdate(-1, p - params, 0, buffers)


def reference(strategy: S.FedshieldRule, grid: LocalGrid, rounds: int = ROUNDS):
    """θ, buffers and server state from a fresh instance of the strategy's server algorithm
    and rule (same registry entries and parameters) fed the scripted updates directly."""
    layout = strategy.layout
    rule = AGGREGATORS.entry(strategy.aggregator_name).obj(
        **strategy.server.aggregator.params.kwargs()
    )
    server = SERVER_ALGORITHMS.entry(strategy.server_name).obj(
        rule, lr=strategy.server.lr, weighting=strategy.weighting, params=strategy.server.params
    )
    start_record = initial()
    params, buffers = layout.decode(start_record)
    passed = layout.pass_through(start_record)
    state = server.init_state(params)
    node_of = {int(c.node_config["partition-id"]): n for n, c in grid.contexts.items()}
    services = RefServices(layout, passed)
    for rnd in range(1, rounds + 1):
        ctx = RoundContext(rnd, tuple(sorted(node_of.values())), (), 0, M, torch.device("cpu"))
        payload = server.broadcast(params, buffers, state, ctx)
        start = layout.encode(payload.params, payload.buffers, passed)
        updates = []
        for k in sorted(node_of, key=node_of.__getitem__):
            arrays = reply_arrays(k, rnd, start)
            p, b = layout.decode(ArrayRecord({n: Array(v) for n, v in arrays.items()}))
            extras = {}
            if "h" in payload.extras:
                dh = dh_arrays(k, rnd, layout.encode_params(payload.extras["h"]))
                extras["dh"] = torch.cat([torch.from_numpy(v).reshape(-1) for v in dh.values()])
            n = 1 if strategy.weighting == "uniform" else count_of(k)
            updates.append(ClientUpdate(node_of[k], p - payload.params, n, b, extras=extras))
        if strategy.weighting != "uniform" and server.robust:
            # the round step's count caps: 2× the median, then below half for the cohort's f
            f = round_budget(server.aggregator, len(ctx.cohort)).f
            updates = cap_counts(updates, strategy.count_cap, f)[0]
        rnd_in = ServerRound(params, buffers, state, updates, ctx, services)
        step = server.post_step(server.update(rnd_in), rnd_in)
        params, buffers, state = step.params, step.buffers, step.state
    return params, buffers, state


ROOT = {"reference_fn": reference_fn}
CASES: dict[str, Callable[[], S.FedshieldRule]] = {
    "fedavg-mean": lambda: S.FedshieldRule(),
    "drag": lambda: S.DRAG(alpha=0.3, c=0.4),
    "drag-fltrust": lambda: S.DRAG(aggregator="fltrust"),
    "brdrag": lambda: S.BRDRAG(c=0.5, **ROOT),
    "fltrust": lambda: S.FLTrust(**ROOT),
    "fedexp-median": lambda: S.FedExP(aggregator="median"),
    "fedacg-trimmed": lambda: S.FedACG(
        lam=0.8, aggregator="trimmed_mean", aggregator_args={"f": 1}
    ),
    "scaffold": lambda: S.SCAFFOLD(),
    "scaffold-krum": lambda: S.SCAFFOLD(aggregator="krum", aggregator_args={"f": 1}),
    "krum": lambda: S.Krum(f=1),
    "multikrum": lambda: S.MultiKrum(f=1, m=3),
    "median": lambda: S.Median(),
    "trimmed_mean": lambda: S.TrimmedMean(f=1),
    "bulyan": lambda: S.Bulyan(f=0),
    "geomed": lambda: S.GeoMed(weighting="samples"),
    "rfa-samples": lambda: S.RFA(weighting="samples"),
    "raga": lambda: S.RAGA(),
    "centered_clipping": lambda: S.CenteredClipping(tau=0.3),
    "norm_clip": lambda: S.NormClip(tau=0.2),
    "fedacg-cc": lambda: S.FedACG(aggregator="centered_clipping", aggregator_args={"tau": 0.3}),
}


@pytest.mark.parametrize("name", list(CASES))
def test_strategy_equals_the_fedshield_server_algorithm(name):
    strategy = CASES[name]()
    grid = LocalGrid(M, scripted_app())
    result = run(strategy, grid)
    params, buffers, state = reference(strategy, grid)
    got_p, got_b = flat_of(result.arrays, strategy)
    torch.testing.assert_close(got_p, params, rtol=0, atol=0)
    torch.testing.assert_close(got_b, buffers, rtol=0, atol=0)
    assert set(strategy.state) == set(state)
    for key in state:
        torch.testing.assert_close(strategy.state[key], state[key], rtol=0, atol=0)
    # the integer counter passes through unchanged (the server keeps its own)
    final = result.arrays.to_torch_state_dict()
    assert int(final["bn.num_batches_tracked"]) == 0
    assert not torch.equal(got_p, flat_of(initial(), strategy)[0])  # it moved
    metrics = result.train_metrics_clientapp[ROUNDS]
    assert metrics["sys/rejected"] == 0 and metrics["sys/kept"] == M


def test_every_server_algorithm_and_rule_is_offered_or_refused_clearly():
    """Every aggregator under FedAvg and every server algorithm builds (FedCART with the
    clients' model, tests/test_flower_fedcart.py)."""
    for name in AGGREGATORS.package_names():
        kwargs = ROOT if AGGREGATORS.entry(name).obj.needs_reference else {}
        S.FedshieldRule(aggregator=name, **kwargs)
    for name in SERVER_ALGORITHMS.package_names():
        if name == "fedcart":
            with pytest.raises(ConfigError, match="needs model_fn"):
                S.FedshieldRule(server=name)
        else:
            S.FedshieldRule(server=name, **ROOT)


# -- against Flower's own strategies (a maintained library's output) ------------------------
class Plain(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(8, 5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(x)


@pytest.mark.parametrize(
    ("ours", "theirs"),
    [
        (lambda: S.Krum(f=1), lambda: flwr_strategy.Krum(num_malicious_nodes=1)),
        (lambda: S.Median(), lambda: flwr_strategy.FedMedian()),
        (lambda: S.FedshieldRule(), lambda: flwr_strategy.FedAvg()),
        (
            lambda: S.MultiKrum(f=1, m=2, weighting="samples"),
            lambda: flwr_strategy.MultiKrum(num_malicious_nodes=1, num_nodes_to_select=2),
        ),
    ],
    ids=["krum", "median", "fedavg", "multikrum"],
)
def test_matches_flowers_own_strategy(ours, theirs):
    a = ours().start(LocalGrid(M, scripted_app()), initial(Plain), num_rounds=2)
    b = theirs().start(LocalGrid(M, scripted_app()), initial(Plain), num_rounds=2)
    for key in ("fc.weight", "fc.bias"):
        torch.testing.assert_close(
            torch.from_numpy(a.arrays[key].numpy()),
            torch.from_numpy(b.arrays[key].numpy()),
            atol=1e-6,
            rtol=1e-6,  # float32: θ + (θ_m − θ) against θ_m, sums in another order
        )


# -- untrusted replies ----------------------------------------------------------------------
def _set(key: str, value: np.ndarray) -> Callable[[RecordDict], None]:
    def forge(content: RecordDict) -> None:
        content["arrays"][key] = Array(value)

    return forge


def _count(value: Any) -> Callable[[RecordDict], None]:
    def forge(content: RecordDict) -> None:
        content["metrics"]["num-examples"] = value

    return forge


def _drop(key: str) -> Callable[[RecordDict], None]:
    def forge(content: RecordDict) -> None:
        del content["arrays"][key]

    return forge


def _huge_declared(content: RecordDict) -> None:
    # 4 GB declared and no bytes: refused from the metadata, never decoded
    content["arrays"]["fc1.weight"] = Array("float32", (10**9,), "numpy.ndarray", b"")


def _to_float64(content: RecordDict) -> None:
    for key, a in list(content["arrays"].items()):
        content["arrays"][key] = Array(a.numpy().astype(np.float64))


def _nan(content: RecordDict) -> None:
    w = content["arrays"]["fc2.weight"].numpy().copy()
    w[0, 0] = np.nan
    content["arrays"]["fc2.weight"] = Array(w)


def _garbage(content: RecordDict) -> None:
    content["arrays"]["fc2.bias"] = Array("float32", (3,), "numpy.ndarray", b"not numpy")


FORGED = {
    1: _nan,
    2: _set("fc1.weight", np.zeros((6, 4), np.float32)),  # transposed
    3: _to_float64,
    4: _huge_declared,
    5: _drop("fc2.bias"),
    6: _set("bn.running_var", -np.ones(4, np.float32)),
    7: _count(-3),
    8: _garbage,
    9: _set("bn.num_batches_tracked", np.zeros(3, np.int64)),
    10: _set("fc2.bias", np.zeros((30_000,), np.float32)),  # oversized
}
REASONS = {
    "delta_nonfinite": 1,
    "delta_shape": 3,  # transposed, declared 4 GB, oversized
    "delta_dtype": 1,
    "keys": 1,
    "buffers_range": 1,
    "num_examples": 1,
    "malformed": 1,
    "buffers_shape": 1,
}


def test_bad_replies_are_rejected_and_counted_and_the_rest_aggregated():
    honest = [0, 11, 12]
    nodes = len(FORGED) + len(honest)
    # Without a stated f the median outvotes its breakdown on the sampled nodes:
    # 3 kept replies are too few (rejected replies never lower f, docs/security.md §2c, on
    # Flower, where node ids can be forged): zero rows complete the round to 2f + 1, and their
    # median is θ unchanged. Stated f = 1: the 3 honest replies run.
    default = S.Median()
    kept = run(default, LocalGrid(nodes, scripted_app(FORGED)), rounds=1)
    m = kept.train_metrics_clientapp[1]
    assert m["sys/kept"] == 3 and m["sys/padded"] == 2 * m["sys/f"] + 1 - 3
    torch.testing.assert_close(
        flat_of(kept.arrays, default)[0], flat_of(initial(), default)[0], rtol=0, atol=0
    )
    strategy = S.Median(byzantine_f=1)
    grid = LocalGrid(nodes, scripted_app(FORGED))
    result = run(strategy, grid, rounds=1)
    metrics = result.train_metrics_clientapp[1]
    assert metrics["sys/rejected"] == len(FORGED)
    assert {
        k[len("sys/rejected/") :]: v for k, v in metrics.items() if k.startswith("sys/rejected/")
    } == REASONS
    assert metrics["sys/kept"] == len(honest)
    # the model is the median of the honest replies alone
    clean = S.Median(byzantine_f=1)
    clean_grid = LocalGrid(nodes, scripted_app())
    clean_grid.contexts = {
        n: c for n, c in grid.contexts.items() if c.node_config["partition-id"] in honest
    }
    want = run(clean, clean_grid, rounds=1)
    got_p, got_b = flat_of(result.arrays, strategy)
    want_p, want_b = flat_of(want.arrays, clean)
    torch.testing.assert_close(got_p, want_p, rtol=0, atol=0)
    torch.testing.assert_close(got_b, want_b, rtol=0, atol=0)


def test_huge_finite_reply_keeps_a_robust_model_finite_and_close():
    big = {0: _set("fc1.weight", np.full((4, 6), 3e38, np.float32))}
    strategy = S.Median()
    result = run(strategy, LocalGrid(M, scripted_app(big)), rounds=1)
    p, _ = flat_of(result.arrays, strategy)
    assert bool(torch.isfinite(p).all())
    start, _ = flat_of(initial(), strategy)
    assert float((p - start).abs().max()) < 3.0  # honest moves: N(0, 0.1²..0.5²)


def test_lying_count_is_capped_and_uniform_weighting_ignores_counts():
    liar = {0: _count(10**9)}
    cap = count_of(M - 1)  # the largest honest count
    capped = S.FedshieldRule(max_num_examples=cap)
    result = run(capped, LocalGrid(M, scripted_app(liar)), rounds=1)
    assert result.train_metrics_clientapp[1]["sys/capped_num_examples"] == 1
    # the same as an honest client 0 reporting the cap
    honest = S.FedshieldRule()
    want = run(honest, LocalGrid(M, scripted_app({0: _count(cap)})), rounds=1)
    torch.testing.assert_close(flat_of(result.arrays, capped)[0], flat_of(want.arrays, honest)[0])
    uniform = S.FedshieldRule(weighting="uniform")
    lied = run(uniform, LocalGrid(M, scripted_app(liar)), rounds=1)
    honest_uniform = S.FedshieldRule(weighting="uniform")
    plain = run(honest_uniform, LocalGrid(M, scripted_app()), rounds=1)
    torch.testing.assert_close(flat_of(lied.arrays, uniform)[0], flat_of(plain.arrays, uniform)[0])
    # robust rules default to uniform weighting: counts are never read (docs/security.md)
    assert S.Krum(f=1).weighting == "uniform" and S.FedshieldRule().weighting == "samples"


def test_non_finite_step_keeps_the_model_and_the_state(monkeypatch):
    strategy = S.CenteredClipping(tau=0.3)
    grid = LocalGrid(M, scripted_app())
    run(strategy, grid, rounds=1)
    state = {k: v.clone() for k, v in strategy.state.items()}

    def nan_step(rnd):
        nan_center = rnd.state["center"] * math.nan
        return ServerStep(rnd.params * math.nan, rnd.buffers, {"center": nan_center})

    monkeypatch.setattr(strategy.server, "update", nan_step)
    replies = grid.send_and_receive(strategy.configure_train(2, initial(), ConfigRecord(), grid))
    out, metrics = strategy.aggregate_train(2, replies)
    assert out is None and metrics["sys/nonfinite_step"] == 1
    torch.testing.assert_close(strategy.state["center"], state["center"])


# -- composition with Flower's own wrappers -------------------------------------------------
class Wide(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(40, 25)


def test_composes_with_flowers_server_side_dp_wrapper():
    """DifferentialPrivacyServerSideFixedClipping(Median()): the median of the updates
    clipped to C, plus Flower's Gaussian noise σ = z·C/n; the next round starts from the
    noised model Flower hands back to the strategy."""
    from flwr.serverapp.strategy import DifferentialPrivacyServerSideFixedClipping as DP

    clip = 0.5
    start_record = initial(Wide)
    flat = [torch.from_numpy(a.numpy()).reshape(-1) for a in start_record.values()]
    start = torch.cat(flat)
    rows = []
    for k in range(M):
        reply = reply_arrays(k, 1, start_record)
        g = torch.cat([torch.from_numpy(v).reshape(-1) for v in reply.values()]) - start
        rows.append(g * min(1.0, clip / float(g.norm())))
    want = start + AGGREGATORS.build("median")(torch.stack(rows))

    def one_round(noise: float, grid: LocalGrid) -> tuple[DP, ArrayRecord]:
        dp = DP(S.Median(), noise_multiplier=noise, clipping_norm=clip, num_sampled_clients=M)
        replies = grid.send_and_receive(dp.configure_train(1, initial(Wide), ConfigRecord(), grid))
        arrays, metrics = dp.aggregate_train(1, replies)
        assert metrics["sys/kept"] == M
        return dp, arrays

    _, quiet = one_round(0.0, LocalGrid(M, scripted_app()))
    quiet_flat = torch.cat([torch.from_numpy(a.numpy()).reshape(-1) for a in quiet.values()])
    torch.testing.assert_close(quiet_flat, want, atol=1e-6, rtol=0)

    np.random.seed(0)  # Flower draws its noise from numpy's global generator
    grid = LocalGrid(M, scripted_app())
    dp, noised = one_round(1.0, grid)
    noise = torch.cat([torch.from_numpy(a.numpy()).reshape(-1) for a in noised.values()])
    noise = noise - quiet_flat
    sigma = 1.0 * clip / M
    assert float(noise.std()) == pytest.approx(sigma, rel=0.1)
    assert abs(float(noise.mean())) < 4 * sigma / math.sqrt(noise.numel())
    dp.configure_train(2, noised, ConfigRecord(), grid)
    torch.testing.assert_close(dp.strategy._round.params, quiet_flat + noise, rtol=0, atol=0)


# -- client parts ----------------------------------------------------------------------------
def calibrating_app() -> ClientApp:
    """The scripted clients, calibrating locally with drag_calibrate_local."""
    app = ClientApp()

    @app.train()
    def _train(msg: Message, context: Context) -> Message:
        k = int(context.node_config["partition-id"])
        rnd = int(msg.content["config"]["server-round"])
        model = Plain()
        trained = reply_arrays(k, rnd, msg.content["arrays"])
        model.load_state_dict({n: torch.from_numpy(v) for n, v in trained.items()})
        diag = drag_calibrate_local(model, msg)
        metrics = {"num-examples": count_of(k)} | diag
        content = RecordDict(
            {"arrays": ArrayRecord(model.state_dict()), "metrics": MetricRecord(metrics)}
        )
        return Message(content, reply_to=msg)

    return app


def test_drag_local_calibration_equals_the_servers():
    """DRAG paper, Sec. III: v computed by the clients from the broadcast r gives the server-side
    result."""
    server_side = S.DRAG(alpha=0.3, c=0.4).start(
        LocalGrid(M, scripted_app()), initial(Plain), num_rounds=3
    )
    strategy = S.DRAG(alpha=0.3, c=0.4, client_calibration=True)
    grid = LocalGrid(M, calibrating_app())
    local = strategy.start(grid, initial(Plain), num_rounds=3)
    for key in ("fc.weight", "fc.bias"):
        torch.testing.assert_close(
            torch.from_numpy(local.arrays[key].numpy()),
            torch.from_numpy(server_side.arrays[key].numpy()),
            atol=1e-6,
            rtol=0,
        )
    sent = [REF in m.content for m in grid.sent if m.metadata.message_type == "train"]
    assert sent == [False] * M + [True] * (2 * M)  # r exists from round 2 on
    assert local.train_metrics_clientapp[3]["drag/lambda"] > 0
    assert "drag/lambda" not in local.train_metrics_clientapp[1]


def test_scaffold_client_needs_the_control_variate():
    from fedshield.flower.local import set_task_identity

    set_task_identity()
    msg = Message(RecordDict({"arrays": initial(Plain)}), dst_node_id=1, message_type="train")
    with pytest.raises(ValueError, match="fs.h"):
        ScaffoldClient(Plain(), msg, Context(0, 1, {}, RecordDict(), {}))


# -- configuration errors ------------------------------------------------------------------
@pytest.mark.parametrize(
    ("build", "match"),
    [
        (lambda: S.FedshieldRule(aggregator="krumm"), "did you mean 'krum'"),
        (lambda: S.Krum(f=-1), r"aggregator_args\.f"),
        (lambda: S.DRAG(alpha=1.5), r"server_args\.alpha"),
        (lambda: S.FedshieldRule(server="drag", aggregator="median"), "needs_reference"),
        (lambda: S.BRDRAG(), "reference_fn"),
        (lambda: S.BRDRAG(root_data=(torch.zeros(2, 8), torch.zeros(2))), "model_fn"),
        (
            lambda: S.BRDRAG(
                root_data=(torch.zeros(2, 8), torch.zeros(2)), model_fn=Plain, root_train={"lr": 0}
            ),
            r"root_train\.lr",
        ),
        (lambda: S.BRDRAG(reference_fn=reference_fn, root_data=(1, 2)), "not both"),
        (lambda: S.FedshieldRule(weighting="median"), "weighting='median'"),
        (lambda: S.FedshieldRule(max_num_examples=-1), "max_num_examples"),
        (lambda: S.FedshieldRule(server_lr=math.inf), "server_lr"),
        (lambda: S.Krum(client_calibration=True), "client_calibration"),
    ],
)
def test_bad_arguments_raise_one_clear_config_error(build, match):
    with pytest.raises(ConfigError, match=match):
        build()


def test_root_model_must_be_the_records_model():
    strategy = S.BRDRAG(root_data=(torch.zeros(4, 6), torch.zeros(4)), model_fn=Plain)
    with pytest.raises(ConfigError, match="model_fn's parameters"):
        strategy.configure_train(1, initial(), ConfigRecord(), LocalGrid(M, scripted_app()))


def test_fedshield_flower_exports_every_strategy_lazily():
    import fedshield.flower as fl

    names = set(S.__all__) - {"RootTrainParams"}
    assert names <= set(fl.__all__)
    assert all(getattr(fl, n) is getattr(S, n) for n in names)
    assert fl.ScaffoldClient is ScaffoldClient


def test_fedshield_central_dp_noises_a_robust_rule_at_its_own_sensitivity():
    """central_dp(Median()): rows clipped to C, the median, then N(0, (z·Δ₂)²) with Δ₂ the
    median's L2 sensitivity 2√2·C — not Flower's mean-calibrated z·C/n — and ε(δ) reported."""
    from fedshield.flower.privacy import central_dp
    from fedshield.privacy.accountant import epsilon
    from fedshield.privacy.sensitivity import MEDIAN_RADIUS

    clip, z = 0.5, 1.0

    def one_round(noise: float) -> tuple[torch.Tensor, dict]:
        strategy = central_dp(
            S.Median(), clip=clip, noise_multiplier=noise, delta=1e-3, num_rounds=4
        )
        grid = LocalGrid(M, scripted_app())
        replies = grid.send_and_receive(
            strategy.configure_train(1, initial(Wide), ConfigRecord(), grid)
        )
        arrays, metrics = strategy.aggregate_train(1, replies)
        flat = [torch.from_numpy(a.numpy()).reshape(-1) for a in arrays.values()]
        return torch.cat(flat), dict(metrics)

    quiet, _ = one_round(0.0)
    noised, metrics = one_round(z)
    sigma = z * 2.0 * MEDIAN_RADIUS * clip
    assert metrics["privacy/noise_std"] == pytest.approx(sigma)
    assert float((noised - quiet).std()) == pytest.approx(sigma, rel=0.1)
    assert metrics["privacy/epsilon"] == pytest.approx(epsilon(z, 1.0, 1, 1e-3))
    with pytest.raises(ConfigError, match="sensitivity|computes more"):
        central_dp(S.SCAFFOLD(), clip=clip, noise_multiplier=z, delta=1e-3, num_rounds=4)


def test_building_a_strategy_leaves_torchs_global_rng_untouched():
    """``model_fn()`` consumed the global RNG, so the user's next Net() changed."""
    root = (torch.rand(8, 6), torch.zeros(8, dtype=torch.long))
    torch.manual_seed(3)
    want = torch.rand(3)
    torch.manual_seed(3)
    S.SCAFFOLD(model_fn=BNNet)
    S.BRDRAG(root_data=root, model_fn=BNNet)
    assert torch.equal(torch.rand(3), want)


def test_a_plugin_rule_from_the_entry_point_group_is_found(monkeypatch):
    """FedshieldRule(aggregator=...) did not load the fedshield.plugins entry
    points that `fedshield run` loads."""
    from fedshield import plugins

    calls = []
    real = plugins.load_plugins

    def spy(modules=()):
        calls.append(tuple(modules))
        return real(modules)

    monkeypatch.setattr(plugins, "load_plugins", spy)
    S.FedshieldRule(aggregator="median")
    assert calls == [()]


def test_a_resumed_strategy_continues_its_round_seeded_streams():
    """A resumed strategy restarted Flower's round counter, so its round-seeded
    streams (root-data mini-batches, the reference's round) repeated. With round_offset the
    second session's rounds continue the first's."""
    seen: list[int] = []

    def reference(arrays: ArrayRecord, server_round: int) -> ArrayRecord:
        seen.append(server_round)
        return reference_fn(arrays, server_round)

    run(S.BRDRAG(reference_fn=reference), LocalGrid(M, scripted_app()), rounds=2)
    run(S.BRDRAG(reference_fn=reference, round_offset=2), LocalGrid(M, scripted_app()), rounds=2)
    assert seen == [1, 2, 3, 4]


def test_feddyn_client_part_in_a_users_loop_is_fedshields_own_update():
    """AlgorithmClient("feddyn") in a hand-written loop on the message S.FedDyn() sends
    gives the Δθ and the kept ∇L_k of fedshield's FedDyn client on the same batches, over
    two participations (the state carried in context.state)."""
    import torch.nn.functional as F

    from fedshield.algorithms.client import CLIENT_ALGORITHMS, LocalSpec
    from fedshield.algorithms.client.base import ClientContext, ClientRound, batch_indices
    from fedshield.core.context import Payload
    from fedshield.core.flat import get_params, set_params
    from fedshield.data.bundle import TensorData
    from fedshield.flower.client_tools import AlgorithmClient

    g = torch.Generator().manual_seed(0)
    data = TensorData(torch.randn(24, 8, generator=g), torch.randint(0, 5, (24,), generator=g))
    strategy = S.FedDyn(alpha=0.1)
    grid = LocalGrid(M, scripted_app())  # FedAvg samples at least its minimum of nodes
    msg = list(strategy.configure_train(1, initial(Plain), ConfigRecord(), grid))[0]
    context = Context(0, 1, {}, RecordDict(), {})
    ref = CLIENT_ALGORITHMS.get("feddyn")(
        LocalSpec(lr=0.1, batch_size=8, steps=3), CLIENT_ALGORITHMS.parse("feddyn", {}, "p")
    )
    torch.manual_seed(0)
    model, ref_model = Plain(), Plain()
    theta = get_params(model)
    alpha = strategy.server.broadcast(theta, theta.new_zeros(0), {}, None).extras  # type: ignore[arg-type]
    state: dict = {}
    for rnd in (1, 2):
        set_params(model, theta)
        part = AlgorithmClient("feddyn", model, msg, context)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        for idx in batch_indices(24, 8, 3, torch.Generator().manual_seed(rnd)):
            opt.zero_grad()
            F.cross_entropy(model(data.x[idx]), data.y[idx]).backward()
            part.correct()
            opt.step()
        part.reply()
        ctx = ClientContext(0, rnd, torch.Generator().manual_seed(rnd), torch.device("cpu"))
        payload = Payload(theta, theta.new_zeros(0), alpha)
        want = ref.local_update(ref_model, ClientRound(payload, data, state, ctx))
        torch.testing.assert_close(get_params(model) - theta, want.delta, rtol=0, atol=1e-6)
        saved = part.state["grad"]
        torch.testing.assert_close(saved, state["grad"], rtol=0, atol=1e-6)


def _users_loop(part: Any, model: nn.Module, data: Any, rnd: int, lr: float) -> None:
    """The hand-written loop of the AlgorithmClient docstring: 3 SGD steps of 8 rows."""
    import torch.nn.functional as F

    from fedshield.algorithms.client.base import batch_indices

    opt = torch.optim.SGD(model.parameters(), lr=lr)
    for idx in batch_indices(24, 8, 3, torch.Generator().manual_seed(rnd)):
        opt.zero_grad()
        F.cross_entropy(model(data.x[idx]), data.y[idx]).backward()
        part.correct()
        opt.step()


def _train_msg(h: torch.Tensor, model: nn.Module) -> Message:
    from fedshield.flower.client_tools import param_record
    from fedshield.flower.local import set_task_identity

    set_task_identity()  # a Message stamps the sender's identity

    content = RecordDict({"arrays": ArrayRecord(model.state_dict()), H: param_record(h, model)})
    return Message(content, dst_node_id=1, message_type="train")


def test_scaffold_option2_client_part_divides_by_the_given_lr():
    """AlgorithmClient("scaffold", variant="option2") computed Δh with η = 1 (1/η
    too small) and refused lr=. With lr it gives fedshield's own SCAFFOLD client's Δθ, Δh_m
    and h_m over two participations with different server h."""
    from fedshield.algorithms.client import CLIENT_ALGORITHMS, LocalSpec
    from fedshield.algorithms.client.base import ClientContext, ClientRound
    from fedshield.core.context import Payload
    from fedshield.core.flat import get_params, set_params
    from fedshield.data.bundle import TensorData
    from fedshield.flower.client_tools import AlgorithmClient, flat_params

    g = torch.Generator().manual_seed(0)
    data = TensorData(torch.randn(24, 8, generator=g), torch.randint(0, 5, (24,), generator=g))
    params = CLIENT_ALGORITHMS.parse("scaffold", {"variant": "option2"}, "p")
    ref = CLIENT_ALGORITHMS.get("scaffold")(LocalSpec(lr=0.1, batch_size=8, steps=3), params)
    torch.manual_seed(0)
    model, ref_model = Plain(), Plain()
    theta = get_params(model)
    context = Context(0, 1, {}, RecordDict(), {})
    state: dict = {}
    for rnd in (1, 2):
        h = 0.05 * torch.randn(theta.shape, generator=g)
        set_params(model, theta)
        msg = _train_msg(h, model)
        part = AlgorithmClient("scaffold", model, msg, context, variant="option2", lr=0.1)
        _users_loop(part, model, data, rnd, lr=0.1)
        reply = part.reply()
        ctx = ClientContext(0, rnd, torch.Generator().manual_seed(rnd), torch.device("cpu"))
        payload = Payload(theta, theta.new_zeros(0), {"h": h})
        want = ref.local_update(ref_model, ClientRound(payload, data, state, ctx))
        torch.testing.assert_close(get_params(model) - theta, want.delta, rtol=0, atol=1e-6)
        got_dh = flat_params(reply[DH], model)
        torch.testing.assert_close(got_dh, want.extras["dh"], rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(part.state["h"], state["h"], rtol=1e-5, atol=1e-6)
    assert float(want.extras["dh"].norm()) > 0


def test_an_algorithm_that_reads_the_step_size_needs_lr():
    from fedshield.flower.client_tools import AlgorithmClient

    model = Plain()
    msg = _train_msg(torch.zeros(sum(p.numel() for p in model.parameters())), model)
    context = Context(0, 1, {}, RecordDict(), {})
    with pytest.raises(ValueError, match=r"'scaffold'\(variant='option2'\) divides by the local"):
        AlgorithmClient("scaffold", model, msg, context, variant="option2")
    with pytest.raises(ValueError, match="lr=0: expected the optimizer's step size"):
        AlgorithmClient("scaffold", model, msg, context, variant="option2", lr=0)
    with pytest.raises(ValueError, match=r"variant='option2' divides by the local step size"):
        ScaffoldClient(model, msg, context, variant="option2")
    AlgorithmClient("scaffold", model, msg, context)  # the seed variant does not read it


def test_only_algorithms_that_declare_it_depend_on_the_step_size():
    """The class of the Δh bug above: every client algorithm AlgorithmClient runs on a
    plain model gives the same upload and state for lr 0.1 and 0.2 on the same steps,
    unless it declares reads_step_size() (then they differ: the declaration is true)."""
    from fedshield.algorithms.client import CLIENT_ALGORITHMS, LocalSpec
    from fedshield.algorithms.client.feddyn import ALPHA
    from fedshield.core.flat import get_params, set_params
    from fedshield.data.bundle import TensorData
    from fedshield.flower.client_tools import AlgorithmClient

    g = torch.Generator().manual_seed(0)
    data = TensorData(torch.randn(24, 8, generator=g), torch.randint(0, 5, (24,), generator=g))
    grid = LocalGrid(M, scripted_app())
    # the broadcast of every extra a client algorithm declares, from the strategy that sends it
    senders = {"h": S.SCAFFOLD(), ALPHA: S.FedDyn(alpha=0.1)}
    names = CLIENT_ALGORITHMS.names()
    declared = {e for n in names for e in CLIENT_ALGORITHMS.get(n).payload_extras}
    assert declared <= set(senders), declared - set(senders)
    cases = [(n, {}) for n in CLIENT_ALGORITHMS.names()] + [("scaffold", {"variant": "option2"})]
    ran, failed = [], []
    for name, params in cases:
        algo = CLIENT_ALGORITHMS.get(name)(
            LocalSpec(lr=1.0, batch_size=1, steps=1), CLIENT_ALGORITHMS.parse(name, params, "p")
        )
        try:
            algo.check_model(Plain())
        except ConfigError:
            continue  # needs its own model family (multi-exit, width, dual-head)
        msg = Message(RecordDict({"arrays": initial(Plain)}), dst_node_id=1, message_type="train")
        for extra in type(algo).payload_extras:
            sent = list(senders[extra].configure_train(1, initial(Plain), ConfigRecord(), grid))
            msg = sent[0]
        outs = []
        for lr in (0.1, 0.2):
            torch.manual_seed(0)
            model = Plain()
            theta = get_params(model)
            context = Context(0, 1, {}, RecordDict(), {})
            part = AlgorithmClient(name, model, msg, context, lr=lr, **params)
            torch.manual_seed(1)
            set_params(model, theta)
            try:
                _users_loop(part, model, data, 1, lr=0.1)  # the same steps: only lr= differs
                reply = part.reply()
            except ConfigError:  # FedCART checks its dual-head model when it finishes
                break
            except IndexError:
                failed.append(name)
                break
            outs.append(({k: v.to_numpy_ndarrays() for k, v in reply.items()}, part.state))
        if len(outs) < 2:
            continue
        same = all(
            all(np.array_equal(a, b) for a, b in zip(outs[0][0][k], outs[1][0][k]))
            for k in outs[0][0]
        ) and all(torch.equal(outs[0][1][k], outs[1][1][k]) for k in outs[0][1])
        assert same != algo.reads_step_size(), (name, params)
        ran.append((name, params.get("variant")))
    assert ("scaffold", "option2") in ran and ("feddyn", None) in ran and len(ran) >= 5, ran
    # CalFAT's correction reads the client's class counts from its data, which a user's
    # loop does not hand over: AlgorithmClient cannot run it (a known limit, not this bug)
    assert failed == ["calfat"], failed
