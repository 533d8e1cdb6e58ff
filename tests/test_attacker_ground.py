"""Each reproducer of "the defense holds where the attacker chooses the ground" (docs/security.md),
one test each (docs/security.md): a minority of the cohort that is a majority of a depth tier, the
Flower transport, bought weight, default arguments, aborts, resumed state and iteration
ceilings."""

from __future__ import annotations

import copy
import logging
import math

import numpy as np
import pytest
import torch

from fedshield import config
from fedshield.aggregators import AGGREGATORS
from fedshield.algorithms.server.aggregation import BLOCK_CLIP, coverage_groups
from fedshield.errors import ConfigError
from fedshield.sim.builder import build, build_components
from fedshield.sim.engine import Simulator
from fedshield.testing import fuzz


@pytest.fixture(autouse=True)
def _quiet():
    logging.disable(logging.WARNING)
    yield
    logging.disable(logging.NOTSET)


# -- a minority of the cohort, a majority of a depth tier ------------------------------
TIERS = [2, 2, 2, 6, 2, 2, 6, 2, 2, 6]  # clients 3, 6, 9 hold the deep blocks
ATTACKERS = (3, 6)  # 2 of 10: a minority of the cohort, 2 of 3 in the deep tier


@pytest.fixture(scope="module")
def tiered():
    """One honest cohort of multi-exit clients with the issue's tiers (median server)."""
    logging.disable(logging.WARNING)
    raw = fuzz.base_config("fedavg", "median", masks=True)
    raw["model"]["params"]["depth"] = 6
    raw["client"]["params"]["depths"] = TIERS
    sim = Simulator(build(config.validate(raw)))
    plan = sim.begin_round(1)
    honest = sim.train_cohort(plan)
    logging.disable(logging.NOTSET)
    return sim, plan, honest, copy.deepcopy(sim.state)


def _replay(tiered, rule: str, forge) -> tuple[torch.Tensor, dict, list]:
    sim, plan, honest, start = tiered
    sim.comp.server.aggregator = AGGREGATORS.build(rule)
    sim.state = copy.deepcopy(start)
    sim.records = []
    ups = [fuzz._clone(u) for u in honest]
    for u in ups:
        if forge is not None and u.client_id in ATTACKERS:
            u.delta = forge(u.delta)
    m = sim.end_round(plan, ups, apply_update_attack=False)
    full = torch.ones_like(honest[0].delta, dtype=torch.bool)
    masks = torch.stack([full if u.mask is None else u.mask for u in honest])
    return sim.state.params - start.params, m, coverage_groups(masks)


@pytest.mark.parametrize(
    "rule", ["median", "trimmed_mean", "rfa", "geomed", "raga", "krum", "multikrum", "bulyan"]
)
@pytest.mark.parametrize("forge", ["norm_1e30", "times_minus_100"])
def test_a_cohort_minority_that_is_a_tier_majority_moves_each_block_boundedly(
    tiered, rule: str, forge: str
) -> None:
    """Issue: 2 attackers of 10, 2 of the 3 deep clients, moved θ by 5.9e29 under median
    (clean 0.60). Now every coverage group moves by at most √2·κ·ρ*·√|G| (docs/security.md),
    ρ* the cohort's honest per-coordinate scale on the shared block."""
    edit = {
        "norm_1e30": lambda d: d / d.norm() * 1e30,
        "times_minus_100": lambda d: -100.0 * d,
    }[forge]
    clean, _, groups = _replay(tiered, rule, None)
    step, m, _ = _replay(tiered, rule, edit)
    assert m["sys/rejected"] == 0 and m["agg/block_clipped_groups"] == len(groups) - 1
    rho = m["agg/block_scale"]
    for _, cols in groups:
        moved = float(step[cols].double().norm())
        assert moved <= math.sqrt(2) * BLOCK_CLIP * rho * cols.numel() ** 0.5 * (1 + 1e-6)
    # Against the whole clean step: bounded by a small multiple, not 1e29.
    assert float(step.norm()) <= 10 * float(clean.norm())


@pytest.mark.parametrize(
    ("family", "params", "model"),
    [
        ("multi_exit", {"depths": [1, 1, 1, 3], "optimizer": "sgd"}, {}),
        ("depthfl", {"depths": [1, 1, 1, 3]}, {"exit_bottleneck": "depthfl"}),
        ("reefl", {"depths": [1, 1, 1, 3]}, {"exit_mode": "recurrent"}),
        ("heterofl", {}, {}),
        ("scalefl", {}, {"depth": 6, "exit_blocks": [2, 3, 5, 6]}),
    ],
    ids=lambda v: v if isinstance(v, str) else "",
)
def test_attackers_placed_in_the_smallest_tier_stay_bounded_for_every_tiered_family(
    family: str, params: dict, model: dict
) -> None:
    """The attackers take the widest coverage (the smallest tier) of each client family
    with tiers; with a minority of the cohort (4 of 10) uploading rows of norm 1e30, θ moves
    no further than a small multiple of the honest step under the median."""
    raw = fuzz.base_config("fedavg", "median", masks=True)
    raw["client"] |= {"algorithm": family, "params": params}
    raw["model"]["params"] |= model
    sim = Simulator(build(config.validate(raw)))
    plan = sim.begin_round(1)
    honest = sim.train_cohort(plan)
    start = copy.deepcopy(sim.state)
    order = sorted(honest, key=lambda u: -fuzz._coverage(u))
    attackers = {u.client_id for u in order[:4]}  # 4 of 10: a minority of the cohort

    def run(forge: bool) -> float:
        sim.state = copy.deepcopy(start)
        ups = [fuzz._clone(u) for u in honest]
        for u in ups:
            if forge and u.client_id in attackers:
                u.delta = u.delta / u.delta.norm().clamp_min(1e-12) * 1e30
        sim.end_round(plan, ups, apply_update_attack=False)
        return float((sim.state.params - start.params).double().norm())

    clean = run(False)
    assert run(True) <= 10 * max(clean, 1e-8)


# -- the Flower transport: one reply per sampled node, to its own instruction ------------
flwr = pytest.importorskip("flwr")


def _flower_round(strategy, forge):
    """Round 1 of ``strategy`` on 10 scripted nodes (tests/test_flower_strategies.py's
    replies); ``forge(replies, sent)`` rewrites the reply list before aggregation."""
    from flwr.app import ConfigRecord
    from test_flower_strategies import initial, scripted_app

    from fedshield.flower.arrays import ModelLayout
    from fedshield.flower.local import LocalGrid

    grid = LocalGrid(10, scripted_app())
    arrays = initial()
    sent = list(strategy.configure_train(1, arrays, ConfigRecord({}), grid))
    replies = list(grid.send_and_receive(sent))
    replies = forge(replies, sent)
    new, metrics = strategy.aggregate_train(1, replies)
    layout = ModelLayout.of(arrays)
    before, _ = layout.decode(arrays)
    after = before if new is None else layout.decode(new)[0]
    return float((after - before).double().norm()), dict(metrics)


def _huge_reply(reply, instruction, node: int | None = None):
    """A reply to ``instruction`` with ``reply``'s records but every model array at 1e30,
    sent by ``node`` (default: the instruction's own node)."""
    from flwr.app import Array, ArrayRecord, Message, RecordDict

    arrays = reply.content["arrays"]
    big = {
        k: Array(np.full_like(v, 1e30) if np.issubdtype(v.dtype, np.floating) else v)
        for k, v in ((k, a.numpy()) for k, a in arrays.items())
    }
    content = RecordDict({"arrays": ArrayRecord(big), "metrics": reply.content["metrics"]})
    out = Message(content, reply_to=instruction)
    if node is not None:
        out.metadata.__dict__["_src_node_id"] = node  # what a forged or misrouted reply says
    return out


def test_a_reply_delivered_again_and_again_counts_at_most_once() -> None:
    """Issue: one node's 1e30 reply delivered 10 extra times gave sys/kept = 20 of 10
    sampled nodes and moved Median()'s θ by 1e30. Now a node that answers more than once
    has every reply dropped (sys/rejected/duplicate)."""
    from fedshield.flower import strategies as S

    def forge(replies, sent):
        bad = _huge_reply(replies[0], sent[0])
        return replies[1:] + [bad] * 11

    clean, _ = _flower_round(S.Median(), lambda r, s: r)
    step, m = _flower_round(S.Median(), forge)
    assert m["sys/kept"] == 9 and m["sys/rejected/duplicate"] == 11
    assert step <= 2 * clean


def test_replies_to_other_nodes_instructions_and_from_unsampled_nodes_are_dropped() -> None:
    from fedshield.flower import strategies as S

    def forge(replies, sent):
        # node 0 answers node 1's instruction 10 times; a stranger answers node 2's.
        node0 = sent[0].metadata.dst_node_id
        spoofed = [_huge_reply(replies[0], sent[1], node=node0) for _ in range(10)]
        return [*replies, *spoofed, _huge_reply(replies[2], sent[2], node=12345)]

    clean, _ = _flower_round(S.Median(), lambda r, s: r)
    step, m = _flower_round(S.Median(), forge)
    assert m["sys/rejected/wrong_instruction"] == 10 and m["sys/rejected/unsampled"] == 1
    assert m["sys/kept"] == 10 and step == pytest.approx(clean, rel=1e-6)


def test_a_claimed_count_of_2_pow_53_cannot_buy_a_weighted_geometric_median() -> None:
    """Issue: RFA(weighting="samples") with one client claiming 2**53 examples and a 1e30
    model moved θ by 1e30. Counts are now capped at count_cap × the median count, then
    so that the cohort's f = 4 largest hold less than half: honest counts too."""
    from flwr.app import MetricRecord

    from fedshield.flower import strategies as S

    def forge(replies, sent):
        bad = _huge_reply(replies[0], sent[0])
        bad.content["metrics"] = MetricRecord({"num-examples": 2**53})
        return [bad, *replies[1:]]

    clean, _ = _flower_round(S.RFA(weighting="samples"), lambda r, s: r)
    step, m = _flower_round(S.RFA(weighting="samples"), forge)
    assert m["sys/capped_counts"] >= 1
    assert step <= 3 * clean


def test_trusted_counts_in_the_simulator_are_capped_under_a_robust_rule() -> None:
    raw = fuzz.base_config("fedavg", "rfa")
    raw["server"] |= {"trust_counts": True}
    sim = Simulator(build(config.validate(raw)))
    plan = sim.begin_round(1)
    honest = sim.train_cohort(plan)
    start = copy.deepcopy(sim.state)
    m0 = sim.end_round(plan, [fuzz._clone(u) for u in honest], apply_update_attack=False)
    clean = float((sim.state.params - start.params).norm())
    sim.state = copy.deepcopy(start)
    ups = [fuzz._clone(u) for u in honest]
    ups[0].num_examples = 2**53
    ups[0].delta = ups[0].delta / ups[0].delta.norm() * 1e30
    m = sim.end_round(plan, ups, apply_update_attack=False)
    assert "sys/capped_counts" not in m0 and m["sys/capped_counts"] == 1
    assert float((sim.state.params - start.params).norm()) <= 3 * clean


# -- robust by default -------------------------------------------------------------------
def _one_huge(rule_cfg: dict) -> tuple[float, float, dict]:
    raw = fuzz.base_config("fedavg", rule_cfg["aggregator"])
    raw["server"] |= rule_cfg
    raw["server"].setdefault("aggregator_args", {})
    if "aggregator_args" not in rule_cfg:
        raw["server"]["aggregator_args"] = {}
    sim = Simulator(build(config.validate(raw)))
    plan = sim.begin_round(1)
    honest = sim.train_cohort(plan)
    start = copy.deepcopy(sim.state)
    sim.end_round(plan, [fuzz._clone(u) for u in honest], apply_update_attack=False)
    clean = float((sim.state.params - start.params).norm())
    sim.state = copy.deepcopy(start)
    ups = [fuzz._clone(u) for u in honest]
    ups[0].delta = ups[0].delta / ups[0].delta.norm() * 1e30
    m = sim.end_round(plan, ups, apply_update_attack=False)
    return float((sim.state.params - start.params).norm()), clean, m


@pytest.mark.parametrize("rule", ["krum", "multikrum", "trimmed_mean", "bulyan"])
def test_a_rule_named_without_arguments_tolerates_a_byzantine_row(rule: str) -> None:
    """Issue: bulyan with no aggregator_args (f = 0) and one 1e30 upload of 10 moved θ by
    1e29. f is now never a silent 0."""
    step, clean, _ = _one_huge({"aggregator": rule})
    assert step <= 3 * clean


def test_f_is_derived_from_the_attack_budget_in_a_simulation() -> None:
    raw = fuzz.base_config("fedavg", "krum")
    raw["server"]["aggregator_args"] = {}
    raw["attack"] = {"name": "noise", "fraction": 0.2}
    comp = build_components(config.validate(raw))
    assert comp.aggregator.f == 2  # ceil(0.2 × 10)
    raw["attack"]["fraction"] = 0.6  # more than Krum tolerates on 10 rows: its largest f
    assert build_components(config.validate(raw)).aggregator.f == 3
    raw["attack"] = {"name": "none"}
    rule = build_components(config.validate(raw)).aggregator
    assert rule.f is None and rule.f_for(10) == 3  # the largest f 10 rows allow


def test_centered_clipping_default_radius_is_relative_to_the_honest_scale() -> None:
    """Issue: the absolute τ = 10 let one attacker move θ 11–22× the honest step."""
    step, clean, m = _one_huge({"aggregator": "centered_clipping"})
    assert m["agg/tau"] > 0 and step <= 2 * clean


# -- degrade, never abort ----------------------------------------------------------------
@pytest.mark.parametrize(("server", "rule"), [("fedavg", "mean"), ("drag", "drag")])
def test_every_kept_upload_reporting_zero_examples_is_weighted_uniformly(server, rule) -> None:
    raw = fuzz.base_config(server, rule)
    raw["server"] |= {"trust_counts": True}
    sim = Simulator(build(config.validate(raw)))
    plan = sim.begin_round(1)
    ups = sim.train_cohort(plan)
    for u in ups:
        u.num_examples = 0
    theta = sim.state.params.clone()
    m = sim.end_round(plan, ups, apply_update_attack=False)
    assert m["sys/zero_counts"] == 10 and not torch.equal(sim.state.params, theta)


def test_drag_with_every_row_forged_keeps_theta_instead_of_aborting() -> None:
    raw = fuzz.base_config("drag", "drag")
    sim = Simulator(build(config.validate(raw)))
    plan = sim.begin_round(1)
    ups = sim.train_cohort(plan)
    for u in ups:
        u.delta = torch.full_like(u.delta, 3e38)
    theta = sim.state.params.clone()
    m = sim.end_round(plan, ups, apply_update_attack=False)
    assert torch.isfinite(sim.state.params).all()
    held = m.get("sys/failed_step") or m.get("sys/nonfinite_step")
    assert held or not torch.equal(sim.state.params, theta)


# -- resumed state is checked like an upload --------------------------------------------
def _saved_run(tmp_path, aggregator: str = "centered_clipping"):
    from fedshield.runner import run

    raw = fuzz.base_config("fedavg", aggregator)
    raw |= {"rounds": 2}
    raw["eval"] = {"every": 1}
    raw["checkpoint"] = {"every": 1}
    path = tmp_path / "cfg.toml"
    import tomli_w

    path.write_text(tomli_w.dumps(raw))
    out = tmp_path / "run"
    run(config.load(path), out)
    return path, out


def _set_center(s: dict, value: torch.Tensor) -> None:
    s["server_state"]["center"] = value


TAMPER = {
    "center_1e30": (
        lambda s: _set_center(s, torch.full_like(s["params"], 1e30)),
        "state.server_state",
    ),
    "center_shape": (lambda s: _set_center(s, torch.zeros(3)), "shape"),
    "theta_nan": (lambda s: s["params"].__setitem__(0, float("nan")), "NaN/Inf"),
    "theta_float64": (lambda s: s.__setitem__("params", s["params"].double()), "dtype"),
    "theta_1e30": (lambda s: s.__setitem__("params", torch.full_like(s["params"], 1e30)), "norm"),
    "theta_shape": (lambda s: s.__setitem__("params", s["params"][:-1]), "shape"),
}


@pytest.mark.parametrize("case", sorted(TAMPER))
def test_a_tampered_checkpoint_is_refused_with_one_line(tmp_path, capsys, case: str) -> None:
    """Issue: a checkpoint whose Centered Clipping centre is 1e30 sent θ to 1e30 after
    --resume; a NaN θ was resumed (exit 0); a 1e30 or float64 θ froze every later round; a
    wrong shape gave a raw ValueError. Now: one error line naming the field, exit 2."""
    from fedshield.cli import main

    tamper, message = TAMPER[case]
    path, out = _saved_run(tmp_path)
    ckpt = torch.load(out / "checkpoint.pt", weights_only=True)
    tamper(ckpt["state"])
    torch.save(ckpt, out / "checkpoint.pt")
    (out / "summary.json").unlink(missing_ok=True)
    code = main(["run", str(path), "--out", str(out), "--resume", "--set", "rounds=3"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and err[0].startswith("error:")
    assert "checkpoint.pt" in err[0] and message in err[0], err[0]


# -- configs that never finish a round ----------------------------------------------------
@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("server.aggregator_args.max_iter", 10**12),
        ("server.aggregator_args.iters", 10**12),
        ("client.local_steps", 10**12),
        ("data.num_clients", 10**8),
    ],
)
def test_iteration_counts_have_a_ceiling(key: str, value: int) -> None:
    raw = fuzz.base_config("fedavg", "geomed" if "max_iter" in key else "centered_clipping")
    raw["server"]["aggregator_args"] = {}
    node = raw
    *parents, leaf = key.split(".")
    for p in parents:
        node = node.setdefault(p, {})
    node[leaf] = value
    with pytest.raises(ConfigError, match=leaf):
        build_components(config.validate(raw))
