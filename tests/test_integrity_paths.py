"""Each reproducer of "no path around the defense", one test each (docs/security.md §5)."""

from __future__ import annotations

import copy
import logging

import pytest
import torch

from fedshield import config
from fedshield.algorithms.server.aggregation import aggregate_covered
from fedshield.cli import main
from fedshield.sim.builder import build
from fedshield.sim.engine import Simulator
from fedshield.testing import fuzz


@pytest.fixture(autouse=True)
def _quiet():
    logging.disable(logging.WARNING)
    yield
    logging.disable(logging.NOTSET)


def replay(pair: fuzz.Pair, edit) -> dict:
    """Replay the pair's first round after ``edit(updates)``; returns the round's metrics."""
    pair.sim.state = copy.deepcopy(pair.start)
    pair.sim.records = []
    ups = [fuzz._clone(u) for u in pair.honest]
    edit(ups)
    return pair.sim.end_round(pair.plan, ups, apply_update_attack=False)


def finite(sim: Simulator) -> bool:
    st = sim.state
    return all(bool(torch.isfinite(t).all()) for t in (st.params, st.buffers))


def test_a_lying_sample_count_is_not_believed_under_a_robust_rule() -> None:
    pair = fuzz.make_pair("fedavg", "median")
    honest = replay(pair, lambda ups: None)
    theta = pair.sim.state.params.clone()

    def lie(ups):
        ups[0].num_examples = 10**9

    m = replay(pair, lie)
    assert m["sys/rejected"] == 0 and honest["sys/rejected"] == 0
    assert torch.equal(pair.sim.state.params, theta)  # the partition size was used instead


def test_a_lying_sample_count_is_capped_when_counts_are_trusted() -> None:
    raw = fuzz.base_config("fedavg", "mean")
    raw["server"] |= {"trust_counts": True, "max_num_examples": 1000}
    sim = Simulator(build(config.validate(raw)))
    plan = sim.begin_round(1)
    ups = sim.train_cohort(plan)
    ups[0].num_examples = 10**9
    m = sim.end_round(plan, ups)
    assert m["sys/rejected/num_examples"] == 1


def test_depth_limited_clients_run_the_configured_rule_per_group() -> None:
    pair = fuzz.make_pair("fedavg", "median", masks=True)
    calls = []
    rule = pair.sim.comp.aggregator
    original = type(rule).aggregate

    def spy(self, updates, weights=None, *, reference=None):
        calls.append(updates.shape[0])
        return original(self, updates, weights, reference=reference)

    type(rule).aggregate = spy
    try:
        m = replay(pair, lambda ups: None)
    finally:
        type(rule).aggregate = original
    # depths [1, 2, 3] cycled over 10 clients: block 1 is held by all 10, block 2 by the 6
    # clients of depth >= 2, block 3 by the 3 of depth 3 — each group by the median itself
    assert sorted(set(calls)) == [3, 6, 10] and m["agg/coverage_groups"] >= 3


def test_brdrag_with_depth_limited_clients_and_a_nan_attacker_keeps_theta_finite() -> None:
    pair = fuzz.make_pair("brdrag", "brdrag", masks=True)

    def nan(ups):
        ups[0].delta = torch.full_like(ups[0].delta, torch.nan)

    m = replay(pair, nan)
    assert m["sys/rejected/delta_nonfinite"] == 1 and finite(pair.sim)
    assert not torch.equal(pair.sim.state.params, pair.start.params)


def test_a_forged_mask_is_rejected() -> None:
    pair = fuzz.make_pair("fedavg", "mean", masks=True)

    def forge(ups):
        shallow = next(u for u in ups if u.mask is not None)
        shallow.mask = torch.ones_like(shallow.mask)

    assert replay(pair, forge)["sys/rejected/mask"] == 1


@pytest.mark.parametrize("server", ["fedavg", "fedexp", "drag", "fedacg"])
def test_one_huge_finite_upload_leaves_a_robust_step_bounded(server: str) -> None:
    agg = "brdrag" if server == "drag" else "median"
    pair = fuzz.make_pair(server, agg)
    res = fuzz.run_case(pair, "huge_3e38", 1)
    assert res.finite and not res.held and res.step_norm <= res.bound


def test_fedexp_step_size_is_read_from_the_screened_robust_field() -> None:
    pair = fuzz.make_pair("fedexp", "median")
    clean = replay(pair, lambda ups: None)["agg/eta_g"]

    def huge(ups):
        ups[0].delta = torch.full_like(ups[0].delta, 1e30)

    attacked = replay(pair, huge)["agg/eta_g"]
    assert attacked <= 2 * clean  # the median of the squared norms ignores the outlier


def test_drag_first_reference_ignores_a_nan_upload() -> None:
    pair = fuzz.make_pair("drag", "brdrag")

    def nan(ups):
        ups[3].delta = torch.full_like(ups[3].delta, torch.nan)

    replay(pair, nan)
    assert finite(pair.sim) and bool(torch.isfinite(pair.sim.state.server_state["ref"]).all())


def test_drag_with_fltrust_and_a_nan_upload_keeps_training() -> None:
    pair = fuzz.make_pair("drag", "fltrust")

    def nan(ups):
        ups[0].delta = torch.full_like(ups[0].delta, torch.nan)

    replay(pair, nan)
    assert finite(pair.sim) and not torch.equal(pair.sim.state.params, pair.start.params)


@pytest.mark.parametrize("agg", ["mean", "median", "krum", "brdrag"])
def test_nan_fedcart_prototypes_are_rejected(agg: str) -> None:
    pair = fuzz.make_pair("fedcart", agg)

    def nan(ups):
        p = ups[0].extras["fedcart/prototypes"].clone()
        p[0, 0] = torch.nan
        ups[0].extras["fedcart/prototypes"] = p

    m = replay(pair, nan)
    assert finite(pair.sim) and m["sys/rejected/extra_fedcart/prototypes"] == 1
    assert bool(torch.isfinite(pair.sim.state.server_state["proto"]).all())


def test_a_nan_scaffold_control_variate_is_rejected_and_training_goes_on() -> None:
    raw = fuzz.base_config("scaffold", "mean")
    raw["rounds"] = 3
    sim = Simulator(build(config.validate(raw)))
    plan = sim.begin_round(1)
    ups = sim.train_cohort(plan)
    ups[0].extras["dh"] = torch.full_like(ups[0].extras["dh"], torch.nan)
    m1 = sim.end_round(plan, ups)
    assert m1["sys/rejected/extra_dh"] == 1
    assert bool(torch.isfinite(sim.state.server_state["h"]).all())
    plan = sim.begin_round(2)
    assert sim.end_round(plan, sim.train_cohort(plan))["sys/rejected"] == 0


def test_a_float64_upload_is_rejected_and_theta_stays_float32() -> None:
    pair = fuzz.make_pair("brdrag", "brdrag")
    res = fuzz.run_case(pair, "float64", 1)
    assert res.rejected == {"sys/rejected/delta_dtype": 1.0}
    assert pair.sim.state.params.dtype == torch.float32


def test_wrong_length_buffers_and_negative_counts_are_rejected_not_raised() -> None:
    pair = fuzz.make_pair("fedavg", "mean")

    def bad(ups):
        ups[0].buffers = torch.zeros(7)
        ups[1].num_examples = -3

    m = replay(pair, bad)
    assert m["sys/rejected/buffers_shape"] == 1
    # counts are not trusted here? fedavg+mean without attack trusts them: checked
    assert m["sys/rejected/num_examples"] == 1


@pytest.mark.parametrize("agg", ["krum", "multikrum", "trimmed_mean"])
def test_rules_degrade_instead_of_aborting_when_screening_leaves_too_few_rows(agg: str) -> None:
    raw = fuzz.base_config("fedavg", agg)
    raw["server"]["aggregator_args"] = {"f": 3}  # needs > 8 rows for Krum, > 6 for TM
    sim = Simulator(build(config.validate(raw)))
    plan = sim.begin_round(1)
    ups = sim.train_cohort(plan)
    for u in ups[:4]:
        u.delta = torch.full_like(u.delta, torch.nan)
    m = sim.end_round(plan, ups)
    assert m["sys/rejected"] == 4 and m.get("sys/degraded") == 1
    assert not torch.equal(sim.state.params, sim.initial[0])


def test_centered_clipping_clips_around_the_previous_aggregate() -> None:
    raw = fuzz.base_config("fedavg", "centered_clipping")
    sim = Simulator(build(config.validate(raw)))
    assert torch.equal(sim.state.server_state["center"], torch.zeros_like(sim.state.params))
    plan = sim.begin_round(1)
    start = sim.state.params.clone()
    sim.end_round(plan, sim.train_cohort(plan))
    step = sim.state.params - start
    assert torch.allclose(sim.state.server_state["center"], step, atol=1e-6)  # lr = 1: v = Δ


def test_rfa_with_a_huge_scaling_attack_from_the_cli(tmp_path) -> None:
    out = tmp_path / "run"
    rc = main(
        [
            "run", "--preset", "brdrag-digits-cpu", "--out", str(out), "-q",
            "--set", "rounds=3", "--set", "server.algorithm=fedavg",
            "--set", 'server.aggregator="rfa"', "--set", "attack.name=scaling",
            "--set", "attack.params.k=1e30",
        ]
    )  # fmt: skip
    assert rc == 0
    import json

    summary = json.loads((out / "summary.json").read_text())
    assert summary["final_test_acc"] > 0.2  # 10 classes: a NaN model scores ~0.1


def test_the_engine_never_writes_a_non_finite_theta() -> None:
    pair = fuzz.make_pair("fedavg", "mean")

    def overflow(ups):
        for u in ups:
            u.delta = torch.full_like(u.delta, 3e38)

    pair.sim.comp.server.lr = 10.0  # θ + 10 · 3e38 overflows float32
    try:
        m = replay(pair, overflow)
    finally:
        pair.sim.comp.server.lr = 1.0
    assert m["sys/nonfinite_step"] == 1 and torch.equal(pair.sim.state.params, pair.start.params)


def test_aggregate_covered_with_all_rows_full_equals_the_plain_rule() -> None:
    from fedshield.aggregators import build as agg_build

    x = torch.randn(7, 13, generator=torch.Generator().manual_seed(1))
    rule = agg_build("median")
    full = torch.ones_like(x, dtype=torch.bool)
    assert torch.allclose(aggregate_covered(rule, x, None, full, None).delta, rule(x))


@pytest.mark.parametrize("count", [10**400, 10**39, 2**53 + 1], ids=["1e400", "1e39", "2^53+1"])
def test_a_count_beyond_float64s_exact_range_is_rejected_even_when_counts_are_trusted(
    count: int,
) -> None:
    """Trusted counts with no cap: a count of 1e39 or 1e400 used to abort the round
    (OverflowError / non-finite weights); it is rejected and the round goes on."""
    raw = fuzz.base_config("fedavg", "mean")
    raw["server"] |= {"trust_counts": True}
    sim = Simulator(build(config.validate(raw)))
    plan = sim.begin_round(1)
    ups = sim.train_cohort(plan)
    ups[0].num_examples = count
    m = sim.end_round(plan, ups)
    assert m["sys/rejected/num_examples"] == 1 and finite(sim)


def test_a_short_all_true_mask_from_a_full_depth_client_is_rejected() -> None:
    """A full-coverage client may omit its mask or send an all-True one of θ's length;
    a one-entry all-True mask used to pass and abort the round in the server's stack."""
    pair = fuzz.make_pair("fedavg", "median", masks=True)
    full = next(i for i, u in enumerate(pair.honest) if u.mask is None or bool(u.mask.all()))

    def short(ups):
        ups[full].mask = torch.ones(1, dtype=torch.bool)

    m = replay(pair, short)
    assert m["sys/rejected/mask"] == 1 and finite(pair.sim)


@pytest.mark.parametrize(
    ("field", "value", "reason"),
    [
        ("metrics", None, "metrics"),
        ("extras", None, "extras"),
        ("delta", "sparse", "delta_shape"),
    ],
)
def test_malformed_upload_objects_are_rejected_not_raised(field, value, reason) -> None:
    pair = fuzz.make_pair("fedavg", "median")

    def edit(ups):
        setattr(ups[0], field, ups[0].delta.to_sparse() if value == "sparse" else value)

    m = replay(pair, edit)
    assert m[f"sys/rejected/{reason}"] == 1 and finite(pair.sim)


def test_untrusted_client_metrics_and_a_grad_tracking_delta_do_not_leak_into_the_round() -> None:
    pair = fuzz.make_pair("fedavg", "median")

    def edit(ups):
        ups[0].metrics = {"train/loss": "x", "comm/bytes": [1, 2]}
        ups[1].metrics = {"train/loss": float("nan")}
        ups[2].delta = ups[2].delta.clone().requires_grad_(True)

    m = replay(pair, edit)
    assert m["sys/rejected"] == 0 and m["train/loss"] == m["train/loss"]  # finite, from 8
    assert not pair.sim.state.params.requires_grad and finite(pair.sim)


def test_nan_batchnorm_buffers_under_the_median_are_rejected() -> None:
    """The issue's first reproducer: a client's NaN BatchNorm running statistics, which the
    median passed through to the global buffers."""
    raw = fuzz.base_config("fedavg", "median")
    raw["model"] = {"name": "mlp", "params": {"batchnorm": True}}
    sim = Simulator(build(config.validate(raw)))
    plan = sim.begin_round(1)
    ups = sim.train_cohort(plan)
    assert ups[0].buffers.numel() > 0
    ups[0].buffers = torch.full_like(ups[0].buffers, float("nan"))
    m = sim.end_round(plan, ups)
    assert m["sys/rejected/buffers_nonfinite"] == 1 and finite(sim)


@pytest.mark.parametrize("agg", ["median", "geomed", "raga"])
def test_a_two_client_depth_tier_under_an_honest_majority_rule_moves_no_further_than_honest(
    agg: str,
) -> None:
    """Depths [1, 2, 3, 4] over 10 clients: block 4 is held by clients 3 and 7 only, where
    the median of two rows is their mean. Client 3 uploading 1e30 on its own coverage
    moved θ by ~1e31; the two-row group's rows are now clipped to the round's median row
    norm first (sys/degraded), so the step stays at the honest scale."""
    raw = fuzz.base_config("fedavg", agg, masks=True)
    raw["client"]["params"]["depths"] = [1, 2, 3, 4]
    raw["model"]["params"]["depth"] = 4
    sim = Simulator(build(config.validate(raw)))
    plan = sim.begin_round(1)
    ups = sim.train_cohort(plan)
    honest_scale = max(float(u.delta.double().norm()) for u in ups)
    start = sim.state.params.clone()
    bad = ups[list(plan.ctx.cohort).index(3)]
    huge = torch.full_like(bad.delta, 1e30)  # a full-depth client: no mask, all of θ
    bad.delta = huge if bad.mask is None else torch.where(bad.mask, huge, 0.0)
    m = sim.end_round(plan, ups, apply_update_attack=False)
    step = float((sim.state.params.double() - start.double()).norm())
    assert m["sys/rejected"] == 0 and m["sys/degraded"] >= 1
    assert finite(sim) and step <= 2 * honest_scale


@pytest.mark.parametrize(("agg", "left"), [("multikrum", 3), ("trimmed_mean", 2)])
def test_a_rule_degraded_to_f_0_does_not_let_one_row_through(agg: str, left: int) -> None:
    """Screening leaves fewer rows than an f = 1 rule needs (Multi-Krum 2f + 3, Trimmed
    Mean 2f + 1): it runs at f = 0 — the mean — on clipped rows, so a huge finite row
    moves θ no further than an honest row could; also behind the NNM a reference-free rule
    named alone gets by default."""
    pair = fuzz.make_pair("fedavg", agg)
    rule = pair.sim.comp.aggregator
    assert [p.name for p in rule.pre] == ["nnm"]  # the default composition
    rule.rule._configure(f=1)
    honest_scale = max(float(u.delta.double().norm()) for u in pair.honest)

    def edit(ups):
        for u in ups[left:]:
            u.delta = torch.full_like(u.delta, float("nan"))  # rejected
        ups[0].delta = torch.full_like(ups[0].delta, 1e30)

    m = replay(pair, edit)
    step = float((pair.sim.state.params.double() - pair.start.params.double()).norm())
    assert m["sys/rejected"] == 10 - left and m["sys/degraded"] == 1
    assert finite(pair.sim) and step <= 2 * honest_scale


@pytest.mark.parametrize("agg", ["geomed", "rfa"])
def test_fedcart_class_counts_are_the_servers_not_the_clients(agg: str) -> None:
    """One client claiming 1e30 samples of every class made every global prototype its
    own row under a weighted robust rule; the simulator now uses the label counts it
    knows, so the lie changes nothing."""
    from fedshield.algorithms.client.fedcart import COUNTS, PROTOTYPES

    pair = fuzz.make_pair("fedcart", agg)
    replay(pair, lambda ups: None)
    clean = pair.sim.state.server_state["proto"].clone()
    evil = torch.full_like(pair.honest[0].extras[PROTOTYPES], 1e4)

    def lie(ups):
        counts = torch.full_like(ups[0].extras[COUNTS], 1e30)
        ups[0].extras = dict(ups[0].extras, **{COUNTS: counts, PROTOTYPES: evil.clone()})

    replay(pair, lie)
    proto = pair.sim.state.server_state["proto"]
    assert float(proto.norm()) < 2 * float(clean.norm())


def test_prototype_votes_under_a_robust_rule_ignore_self_reported_counts() -> None:
    """The Flower-native path cannot check counts: a robust rule weighs holders alike."""
    from fedshield.aggregators import build as build_rule
    from fedshield.algorithms.client.fedcart import COUNTS, PROTOTYPES
    from fedshield.algorithms.server.fedcart import aggregate_prototypes
    from fedshield.core.context import ClientUpdate

    rows = [torch.zeros(2, 3) + 0.01 * i for i in range(4)] + [torch.full((2, 3), 1e4)]
    counts = [torch.tensor([10.0, 10.0])] * 4 + [torch.tensor([1e30, 1e30])]
    ups = [
        ClientUpdate(i, torch.zeros(1), 1, torch.zeros(0), extras={PROTOTYPES: p, COUNTS: c})
        for i, (p, c) in enumerate(zip(rows, counts))
    ]
    mean, _ = aggregate_prototypes(ups, build_rule("geomed"), (2, 3))
    assert float(mean.abs().max()) < 1.0  # the honest cluster's median, not the liar's row
