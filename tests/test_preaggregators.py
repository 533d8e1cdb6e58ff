"""Pre-aggregators (NNM, Bucketing, ARC, static clipping) and the composed rule: worked
examples, the config path (server.pre_aggregators), the minimum-row conditions behind
Bucketing, the coverage groups and secondary fields. ByzFL equality:
test_attacks_defense_aware_reference.py."""

from __future__ import annotations

import copy
import math

import pytest
import torch

import fedshield.aggregators as agg
import fedshield.preaggregators as pre
from fedshield import config as cfgmod
from fedshield.aggregators.fields import aggregate_field
from fedshield.algorithms.server.aggregation import aggregate_covered
from fedshield.errors import ConfigError
from fedshield.preaggregators.bucketing import bucketing
from fedshield.preaggregators.clipping import arc, arc_count, clip
from fedshield.preaggregators.composed import ComposedRule, round_generator
from fedshield.preaggregators.nnm import nnm
from fedshield.registry import tags_of
from fedshield.sim.builder import build, build_components
from fedshield.sim.engine import Simulator


def test_nnm_worked_example() -> None:
    # Points 0, 1, 2, 10 on a line, f = 1: each row → mean of its 3 nearest (itself incl.).
    x = torch.tensor([[0.0], [1.0], [2.0], [10.0]], dtype=torch.float64)
    out = nnm(x, 1)
    torch.testing.assert_close(
        out.squeeze(1), torch.tensor([1.0, 1.0, 1.0, 13 / 3], dtype=torch.float64)
    )
    assert torch.equal(nnm(x, 3), x)  # n − f = 1: each row its own nearest
    with pytest.raises(ValueError, match="f < n"):
        nnm(x, 4)


def test_bucketing_worked_example_with_weights() -> None:
    x = torch.tensor([[0.0], [2.0], [4.0], [8.0], [16.0]], dtype=torch.float64)
    perm = torch.tensor([4, 0, 1, 3, 2])  # buckets {16, 0}, {2, 8}, {4}
    out, w = bucketing(x, 2, perm)
    torch.testing.assert_close(out.squeeze(1), torch.tensor([8.0, 5.0, 4.0], dtype=torch.float64))
    assert w is None
    weights = torch.tensor([1.0, 3.0, 1.0, 1.0, 1.0], dtype=torch.float64)
    out, w = bucketing(x, 2, perm, weights)
    torch.testing.assert_close(out.squeeze(1), torch.tensor([8.0, 3.5, 4.0], dtype=torch.float64))
    torch.testing.assert_close(w, torch.tensor([2.0, 4.0, 1.0], dtype=torch.float64))


def test_arc_and_clip_worked_example() -> None:
    x = torch.tensor([[3.0, 4.0], [0.0, 1.0], [6.0, 8.0], [0.0, 2.0], [30.0, 40.0]])
    # n = 5, f = 1: ⌊(2/5)·4⌋ = 1 row clipped (norm 50) to the next largest norm, 10.
    assert arc_count(5, 1) == 1 and arc_count(10, 3) == 4
    out = arc(x, 1)
    torch.testing.assert_close(out[4], torch.tensor([6.0, 8.0]))
    assert torch.equal(out[:4], x[:4])
    out = clip(x, 2.0)
    torch.testing.assert_close(out[0], torch.tensor([1.2, 1.6]))
    assert torch.equal(out[1], x[1]) and torch.equal(out[3], x[3])


def test_huge_finite_rows_stay_finite() -> None:
    x = torch.full((6, 4), 3e38)
    x[0] = -3e38
    for name, kw in (("nnm", {"f": 1}), ("bucketing", {"s": 2}), ("arc", {"f": 1}), ("clip", {})):
        out, _ = pre.build(name, **kw)(x, None, generator=torch.Generator().manual_seed(0))
        assert torch.isfinite(out).all(), name


# --- the composed rule -------------------------------------------------------------------


def test_composed_rule_carries_the_rules_facts() -> None:
    rule = pre.compose(["nnm"], {}, agg.build("trimmed_mean", f=2))
    assert isinstance(rule, ComposedRule)
    assert tags_of(rule) == tags_of(agg.build("trimmed_mean"))
    assert rule.f == 2 and rule.pre[0].f == 2  # NNM's f from the rule's own f
    assert rule.registry_name == "nnm+trimmed_mean"
    assert repr(rule) == "nnm(f=2) → TrimmedMean(f=2)"
    ref = pre.compose(["clip"], {"clip": {"c": 1.0}}, agg.build("brdrag"))
    assert ref.needs_reference and ref.c == 0.5
    assert pre.compose([], {}, agg.build("median")).__class__.__name__ == "Median"


def test_bucketing_reduces_the_rows_the_rule_sees() -> None:
    rule = pre.compose(["bucketing"], {}, agg.build("krum", f=2))
    with pytest.raises(
        ConfigError, match=r"krum: f=2 needs more than 2f \+ 2 = 6 rows.*the 5 rows left"
    ):
        rule.validate(10)
    rule.validate(14)  # 7 buckets: Krum f=2 can run
    run = rule.adapted(10)
    assert isinstance(run, ComposedRule) and run.rule.f == 1  # largest feasible f on 5 rows
    assert rule.adapted(2) is None  # one bucket: nothing Krum can do


def test_composed_rule_drops_nonfinite_rows_and_maps_weights() -> None:
    x = torch.randn(6, 3, dtype=torch.float64)
    x[2, 1] = float("nan")
    rule = pre.compose(["nnm"], {"nnm": {"f": 1}}, agg.build("mean"))
    w = torch.arange(1.0, 7.0, dtype=torch.float64)
    out, diag = rule.aggregate(x, w)
    keep = [0, 1, 3, 4, 5]
    expected = agg.build("mean")(nnm(x[keep], 1), w[keep])
    torch.testing.assert_close(out, expected)
    assert diag["agg/nonfinite"] == 1.0 and diag["agg/pre_rows"] == 5.0


def test_bucketing_draw_is_a_pure_function_of_seed_and_round() -> None:
    """The draw no longer depends on the rows (attackers picked it with one-ulp
    nudges to their own rows); the seed and the round move it."""
    x = torch.randn(9, 4)
    rule = pre.compose(["bucketing"], {"bucketing": {"s": 3}}, agg.build("median"), seed=7)
    assert torch.equal(rule(x), rule(x))  # same seed, same round: same buckets (resume-safe)
    def perm(seed: int, rnd: int) -> tuple[int, ...]:
        return tuple(torch.randperm(9, generator=round_generator(seed, rnd, 9)).tolist())

    perms = {perm(s, 1) for s in range(6)}
    assert len(perms) > 1  # the seed moves the permutation
    rounds = {perm(7, r) for r in range(6)}
    assert len(rounds) > 1  # so does the round
    assert rule.for_round(3).round == 3
    g1, g2 = round_generator(7, 3, 9), round_generator(7, 3, 9)
    assert torch.equal(torch.randperm(9, generator=g1), torch.randperm(9, generator=g2))


def test_composed_rule_runs_per_coverage_group_and_on_fields() -> None:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(8, 6, generator=g, dtype=torch.float64)
    masks = torch.ones(8, 6, dtype=torch.bool)
    masks[5:, 3:] = False  # columns 3..5 held by rows 0..4 only
    rule = pre.compose(["nnm"], {"nnm": {"f": 1}}, agg.build("median"))
    out = aggregate_covered(rule, x, None, masks, None).delta
    torch.testing.assert_close(out[:3], rule(x[:, :3]))
    torch.testing.assert_close(out[3:], rule(x[:5, 3:]))
    field, how = aggregate_field(x, None, rule)
    assert how == "nnm+median"
    torch.testing.assert_close(field, rule(x))


# --- the config path -----------------------------------------------------------------------


def _cfg(small_cfg: dict, **server) -> cfgmod.ExperimentConfig:
    raw = copy.deepcopy(small_cfg)
    raw["server"].update(server)
    raw["data"]["num_clients"] = 10
    raw["server"]["clients_per_round"] = 10
    return cfgmod.validate(raw)


def test_config_builds_the_composed_rule_and_runs(small_cfg: dict) -> None:
    cfg = _cfg(
        small_cfg,
        aggregator="krum",
        aggregator_args={"f": 1},
        pre_aggregators=["nnm", "bucketing"],
        pre_aggregator_args={"bucketing": {"s": 2}},
    )
    comp = build_components(cfg)
    assert isinstance(comp.aggregator, ComposedRule) and comp.server.aggregator is comp.aggregator
    assert [p.name for p in comp.aggregator.pre] == ["nnm", "bucketing"]
    cfg.rounds = 2
    summary = Simulator(build(cfg)).run()
    assert summary["final"]["agg/pre_rows"] == 5.0
    assert math.isfinite(summary["final_test_acc"])


@pytest.mark.parametrize(
    ("server", "match"),
    [
        ({"pre_aggregators": ["nnn"]},
         r"server.pre_aggregators\[0\]: unknown pre-aggregator 'nnn' \(did you mean 'nnm'"),
        ({"pre_aggregators": ["nnm"], "pre_aggregator_args": {"nnm": {"ff": 1}}},
         r"server.pre_aggregator_args.nnm.ff: unknown key \(did you mean 'f'"),
        ({"pre_aggregators": ["nnm"], "pre_aggregator_args": {"nnm": {"f": -1}}},
         r"server.pre_aggregator_args.nnm.f: Input should be greater than or equal to 0"),
        ({"pre_aggregator_args": {"bucketing": {"s": 2}}},
         r"server.pre_aggregator_args.bucketing: not in server.pre_aggregators \[\]"),
        ({"aggregator": "krum", "aggregator_args": {"f": 2}, "pre_aggregators": ["bucketing"]},
         r"server.aggregator='krum': krum: f=2 needs more than 2f \+ 2 = 6 rows"),
    ],
)  # fmt: skip
def test_bad_pre_aggregator_config_is_refused_before_data(small_cfg: dict, server, match) -> None:
    with pytest.raises(ConfigError, match=match):
        build_components(_cfg(small_cfg, **server))


def _nnm_by_definition(x: torch.Tensor, f: int) -> torch.Tensor:
    """NNM with direct distances and the documented tie rule: sort by (distance, index)."""
    n = x.shape[0]
    rows = []
    for i in range(n):
        key = sorted((float(((x[i] - x[j]) ** 2).sum()), j) for j in range(n))
        rows.append(x[[j for _, j in key[: n - f]]].mean(dim=0))
    return torch.stack(rows)


def test_nnm_breaks_distance_ties_to_the_lower_index() -> None:
    # Row 0 has four neighbours at distance 1 (rows 1-4) and f = 2 keeps 3: itself, 1 and 2.
    x = torch.tensor([[0.0, 0.0], [1.0, 0.0], [0.0, 1.0], [-1.0, 0.0], [0.0, -1.0]]).double()
    third = torch.tensor([1 / 3, 1 / 3], dtype=torch.float64)
    torch.testing.assert_close(nnm(x, 2)[0], third)
    torch.testing.assert_close(nnm(x[[0, 3, 4, 1, 2]], 2)[0], -third)
    # Seeded lattices: ±unit steps around a dyadic offset far from 0, so the direct
    # distances tie exactly while the Gram pass (centred on a non-dyadic mean) rounds them
    # differently; torch.topk on the Gram distances picked other neighbours in 90 / 90.
    steps = torch.cat([torch.zeros(1, 16), torch.eye(16)[:4], -torch.eye(16)[:4],
                       2 * torch.eye(16)[4:6]]).double()  # fmt: skip
    for seed in range(10):
        g = torch.Generator().manual_seed(seed)
        base = torch.randint(-800, 800, (1, 16), generator=g).double() / 8
        x = base + steps[torch.randperm(steps.shape[0], generator=g)]
        for f in (2, 4, 6):
            torch.testing.assert_close(nnm(x, f), _nnm_by_definition(x, f), rtol=1e-13, atol=1e-13)
