"""Defenses across rounds (fedshield.crossround): worked examples of the
step bound and the cache, their config errors, resume equality and the fixed-attacker
reproducer they exist for."""

from __future__ import annotations

import json

import pytest
import torch

from fedshield import config
from fedshield.algorithms.server import ServerRound
from fedshield.algorithms.server.step import server_round_step
from fedshield.core.context import ClientUpdate, RoundContext
from fedshield.core.integrity import UploadSpec
from fedshield.crossround import ROUND_DEFENSES, build, build_round_defenses
from fedshield.crossround.base import BoundInput
from fedshield.crossround.cache import scaled_f
from fedshield.errors import ConfigError
from fedshield.sim.builder import build as build_sim
from fedshield.sim.builder import build_components
from fedshield.sim.engine import Simulator

CPU = torch.device("cpu")


def ctx(rnd: int, cohort: tuple[int, ...] = (), m: int = 4) -> RoundContext:
    return RoundContext(rnd, cohort, (), 0, m, CPU)


def upload(cid: int, delta, mask=None, n: int = 1) -> ClientUpdate:
    d = torch.as_tensor(delta, dtype=torch.float32)
    return ClientUpdate(cid, d, n, torch.zeros(0), mask)


# --- step bound -------------------------------------------------------------------------


def bound_once(defense, state, before, after, rows, lr=1.0, rnd=1):
    theta, acted = defense.bound(BoundInput(before, after, rows, lr), state, ctx(rnd))
    return theta, {**state, **acted.state}, acted.metrics


def test_step_bound_clips_a_huge_step_to_kappa_times_the_median_of_recent_steps():
    sb = build("step_bound", kappa=3.0, window=5)
    rows = [upload(0, [1.0, 0.0])]
    state: dict = {}
    theta = torch.zeros(2)
    for norm in (1.0, 2.0, 2.5):  # recorded steps, all within the radius
        new, state, m = bound_once(sb, state, theta, theta + torch.tensor([norm, 0.0]), rows)
        assert m["defense/step_bound/clipped_blocks"] == 0.0
        theta = new
    big = theta + torch.tensor([0.0, 1e6])
    new, state, m = bound_once(sb, state, theta, big, rows)
    # lower median of {1, 2, 2.5} is 2 → radius κ·2 = 6, along the attacked direction
    assert torch.allclose(new - theta, torch.tensor([0.0, 6.0]))
    assert m["defense/step_bound/clipped_blocks"] == 1.0
    assert m["defense/step_bound/ratio"] == pytest.approx(1e6 / 6.0)
    # the history holds the applied (clipped) step, so the radius did not follow the attack
    assert int(state["step_bound/count"]) == 4
    assert torch.allclose(state["step_bound/steps"][3], torch.tensor([0.0, 6.0]))


def test_step_bound_first_round_radius_is_kappa_lr_times_the_lower_median_row_norm():
    sb = build("step_bound", kappa=2.0, window=3)
    rows = [upload(i, [float(n), 0.0]) for i, n in enumerate((1.0, 3.0, 5.0, 1e9))]
    theta = torch.zeros(2)
    new, _, m = bound_once(sb, {}, theta, torch.tensor([1e9, 0.0]), rows, lr=0.5)
    # lower median of {1, 3, 5, 1e9} = 3 → radius 2 · 0.5 · 3 = 3
    assert torch.allclose(new, torch.tensor([3.0, 0.0]))


def test_step_bound_is_per_coverage_block():
    """Two tiers: the shared block (held by all rows) steps normally, the deep block (held by
    rows 2 and 3 only, attackers) is pushed 1e6×: only the deep block is clipped."""
    sb = build("step_bound", kappa=3.0, window=4)
    shallow = torch.tensor([True, True, False, False])
    rows = [upload(i, [1.0, 1.0, 1.0, 1.0], None if i >= 2 else shallow) for i in range(4)]
    state: dict = {}
    theta = torch.zeros(4)
    for _ in range(2):
        theta, state, _ = bound_once(sb, state, theta, theta + torch.ones(4), rows)
    after = theta + torch.tensor([2.0, 2.0, 1e6, 0.0])
    new, state, m = bound_once(sb, state, theta, after, rows)
    step = new - theta
    assert torch.allclose(step[:2], torch.tensor([2.0, 2.0]))  # ratio 2/1 < κ: untouched
    # deep block: history norm √2, radius 3√2, direction (1, 0) kept
    assert torch.allclose(step[2:], torch.tensor([3.0 * 2**0.5, 0.0]))
    assert m["defense/step_bound/clipped_blocks"] == 1.0


def test_step_bound_window_is_a_ring_and_a_bad_minority_does_not_move_the_median():
    sb = build("step_bound", kappa=3.0, window=3)
    rows = [upload(0, [1.0])]
    state: dict = {}
    theta = torch.zeros(1)
    for step in (1.0, 1.0, 1e6, 1.0, 1e6):
        theta, state, _ = bound_once(sb, state, theta, theta + step, rows)
    # the two attacked rounds entered as 3.0 each; ring holds {3, 1, 3}: median 3 → ≤ 9
    assert sorted(state["step_bound/steps"].flatten().tolist()) == [1.0, 3.0, 3.0]
    new, _, _ = bound_once(sb, state, theta, theta + 1e6, rows)
    assert float(new - theta) == pytest.approx(9.0)


def test_step_bound_malformed_state_starts_over_and_says_so():
    sb = build("step_bound", window=2)
    state = {"step_bound/steps": torch.zeros(7, 3), "step_bound/count": torch.tensor(1)}
    new, state, m = bound_once(sb, state, torch.zeros(2), torch.ones(2), [upload(0, [1.0, 1.0])])
    assert m["defense/step_bound/reset"] == 1.0
    assert state["step_bound/steps"].shape == (2, 2)


def test_step_bound_leaves_a_nonfinite_step_to_the_guard():
    sb = build("step_bound")
    after = torch.tensor([float("inf"), 0.0])
    new, _, _ = bound_once(sb, {}, torch.zeros(2), after, [upload(0, [1.0, 1.0])])
    assert new is after


# --- cache ------------------------------------------------------------------------------


def cache_round(defense, state, kept, rnd, m=4, cohort=None):
    c = ctx(rnd, cohort or tuple(u.client_id for u in kept), m)
    rows, acted = defense.rows(kept, state, c)
    return rows, {**state, **acted.state}, acted.metrics


def test_cache_returns_the_latest_row_of_every_client_seen():
    cache = build("cache")
    rows, state, _ = cache_round(cache, {}, [upload(0, [1.0]), upload(1, [2.0])], 1)
    assert [(u.client_id, float(u.delta)) for u in rows] == [(0, 1.0), (1, 2.0)]
    rows, state, m = cache_round(cache, state, [upload(2, [3.0]), upload(1, [5.0])], 2)
    # this round's rows in order, then the others' cached rows by client id; client 1's
    # row is its round-2 upload, client 3 (never seen) has none
    assert [(u.client_id, float(u.delta)) for u in rows] == [(2, 3.0), (1, 5.0), (0, 1.0)]
    assert m == {
        "defense/cache/rows": 3.0,
        "defense/cache/cached": 1.0,
        "defense/cache/oldest": 1.0,
    }


def test_cache_keeps_masks_counts_and_drops_rows_older_than_max_age():
    cache = build("cache", max_age=1)
    mask = torch.tensor([True, False])
    _, state, _ = cache_round(cache, {}, [upload(0, [1.0, 0.0], mask, n=7)], 1)
    rows, state, _ = cache_round(cache, state, [upload(1, [2.0, 2.0])], 2)
    old = rows[1]
    assert old.client_id == 0 and old.num_examples == 7 and torch.equal(old.mask, mask)
    rows, state, _ = cache_round(cache, state, [upload(1, [2.0, 2.0])], 3)
    assert [u.client_id for u in rows] == [1]  # client 0's row is 2 rounds old
    assert int((state["cache/ids"] >= 0).sum()) == 1


def test_cache_evicts_the_oldest_row_when_more_clients_than_slots():
    cache = build("cache")
    state: dict = {}
    for rnd, cid in enumerate((10, 11, 12), start=1):
        rows, state, _ = cache_round(cache, state, [upload(cid, [float(cid)])], rnd, m=2)
    assert [u.client_id for u in rows] == [12, 11]


def test_cache_scales_f_to_the_rows_it_hands_the_rule():
    # p = 0.3, n = 50: 15 + 2·√(15 · 0.7) = 21.48 → 22; capped by what 50 rows allow
    assert scaled_f(3, 50, 10, None) == 22
    assert scaled_f(3, 50, 10, 24) == 22 and scaled_f(3, 50, 10, 10) == 10
    assert scaled_f(0, 50, 10, None) == 0
    from fedshield.aggregators import build as build_rule

    rule = build_rule("trimmed_mean", f=3)
    assert build("cache").rule(rule, 50, ctx(1, tuple(range(10)))).f == 22
    assert build("cache").rule(rule, 10, ctx(1, tuple(range(10)))) is rule


def test_cache_malformed_state_starts_over():
    cache = build("cache")
    _, state, _ = cache_round(cache, {}, [upload(0, [1.0])], 1)
    state["cache/rows"] = torch.zeros(4, 3)  # wrong width
    rows, state, m = cache_round(cache, state, [upload(1, [2.0])], 2)
    assert m["defense/cache/reset"] == 1.0 and [u.client_id for u in rows] == [1]


# --- reputation ---------------------------------------------------------------------------


def test_reputation_suspends_a_client_after_two_flagged_uploads_and_restores_it():
    rep = build("reputation")  # τ = 3, λ = 0.8, threshold 1.5
    honest = [upload(k, [1.0 + 0.1 * k, 0.0]) for k in range(4)]
    state: dict = {}

    def one_round(liar_delta, rnd):
        nonlocal state
        kept = [*honest, upload(9, liar_delta)]
        rows, acted = rep.rows(kept, state, ctx(rnd, (0, 1, 2, 3, 9), 10))
        suspended = acted.metrics["defense/reputation/suspended"]
        # the server applied the honest mean (1.15, 0)
        step = BoundInput(torch.zeros(2), torch.tensor([1.15, 0.0]), rows, 1.0, kept)
        _, acted = rep.bound(step, state, ctx(rnd, (0, 1, 2, 3, 9), 10))
        state = {**state, **acted.state}
        return [u.client_id for u in rows], suspended, acted.metrics

    ids, _, m = one_round([100.0, 0.0], 1)  # distance 98.85 vs median 0.15: flagged
    assert 9 in ids and m["defense/reputation/flagged"] == 1.0
    ids, _, _ = one_round([100.0, 0.0], 2)  # score 1 → still in; flagged again: 1.8
    assert 9 in ids
    ids, suspended, _ = one_round([1.2, 0.0], 3)  # score 1.8 ≥ 1.5: suspended, yet judged
    assert 9 not in ids and suspended == 1.0
    ids, _, _ = one_round([1.2, 0.0], 4)  # 0.8 · 1.8 = 1.44 < 1.5: restored
    assert 9 in ids
    scores = dict(zip(state["reputation/ids"].tolist(), state["reputation/scores"].tolist()))
    assert scores[9] == pytest.approx(0.8 * 1.44) and scores[0] == 0.0


def test_reputation_never_drops_more_than_half_of_the_rows():
    rep = build("reputation")
    state = {
        "reputation/ids": torch.arange(4, dtype=torch.int64),
        "reputation/scores": torch.tensor([5.0, 4.0, 3.0, 0.0], dtype=torch.float64),
    }
    kept = [upload(k, [1.0]) for k in range(4)]
    rows, _ = rep.rows(kept, state, ctx(1, (0, 1, 2, 3)))
    assert [u.client_id for u in rows] == [2, 3]  # the two most suspicious dropped


# --- the round step: state kept apart from the server's, carried in server state ---------


def test_round_step_carries_defense_state_and_outvotes_a_bad_cohort_with_cached_rows():
    raw = {
        "name": "t",
        "rounds": 1,
        "data": {"dataset": "digits", "num_clients": 6},
        "model": {"name": "mlp", "params": {"hidden": 8}},
        "server": {"aggregator": "median", "clients_per_round": 3},
    }
    comp = build_components(config.validate(raw))
    comp.server.round_defenses = build_round_defenses(["cache", "step_bound"], {})
    d = 5
    spec = UploadSpec(num_params=d, dtype=torch.float32, num_buffers=0)
    honest = [ClientUpdate(k, torch.full((d,), 0.1), 1, torch.zeros(0)) for k in range(3)]
    start = ServerRound(torch.zeros(d), torch.zeros(0), {}, honest, ctx(1, (0, 1, 2), 6))
    out = server_round_step(comp.server, start, spec)
    assert torch.allclose(out.params, torch.full((d,), 0.1))
    assert {"cache/rows", "step_bound/steps"} <= set(out.state)
    # round 2: a cohort of three attackers and no honest row: the cached honest rows win
    bad = [ClientUpdate(k, torch.full((d,), 1e6), 1, torch.zeros(0)) for k in (3, 4, 5)]
    start = ServerRound(out.params, out.buffers, out.state, bad, ctx(2, (3, 4, 5), 6))
    out = server_round_step(comp.server, start, spec)
    assert out.applied and out.metrics["defense/cache/rows"] == 6.0
    # median of {0.1 ×3, 1e6 ×3} per coordinate is their mean (5e5): the step bound caps it
    step = out.params - start.params
    assert float(step.norm()) == pytest.approx(3 * 0.1 * d**0.5, rel=1e-5)


# --- config -------------------------------------------------------------------------------


def small(**server):
    return {
        "name": "t",
        "rounds": 1,
        "data": {"dataset": "digits", "num_clients": 6},
        "model": {"name": "mlp", "params": {"hidden": 8}},
        "server": {"aggregator": "median", "clients_per_round": 3, **server},
        "run": {"progress": False},
    }


@pytest.mark.parametrize(
    ("server", "client", "match"),
    [
        ({"round_defenses": ["cahce"]}, {}, r"server\.round_defenses\[0\].*did you mean 'cache'"),
        ({"round_defense_args": {"cache": {}}}, {}, r"server\.round_defense_args\.cache: not in"),
        (
            {
                "round_defenses": ["step_bound"],
                "round_defense_args": {"step_bound": {"kappa": 0.5}},
            },
            {},
            r"server\.round_defense_args\.step_bound\.kappa",
        ),
        ({"round_defenses": ["cache", "cache"]}, {}, r"'cache' is listed twice"),
        ({"round_defenses": ["cache"]}, {"algorithm": "scaffold"}, r"not the extras \['dh'\]"),
    ],
)
def test_config_errors_name_the_key(server, client, match):
    raw = small(**server)
    raw["client"] = client
    with pytest.raises(ConfigError, match=match):
        build_components(config.validate(raw))


def test_central_dp_refuses_round_defenses():
    raw = small(round_defenses=["step_bound"], weighting="uniform")
    raw["server"]["aggregator"] = "mean"
    raw["privacy"] = {"central": {"noise_multiplier": 1.0}}
    with pytest.raises(ConfigError, match=r"'step_bound' is not covered by \[privacy\.central\]"):
        build_components(config.validate(raw))


def test_every_round_defense_states_its_memory():
    for entry in ROUND_DEFENSES.entries():
        assert entry.tag_values("memory"), entry.name
        assert "Memory O(" in (entry.obj.__doc__ or ""), entry.name


# --- whole runs ---------------------------------------------------------------------------

#: The fixed-attacker reproducer of docs/cross-round.md (bench/bench_cross_round.py runs it at 30
#: rounds).
REPRO = {
    "name": "repro",
    "seed": 7,
    "rounds": 5,
    "data": {
        "dataset": "digits",
        "num_clients": 50,
        "partition": "dirichlet",
        "beta": 0.5,
        "min_size": 10,
    },
    "model": {"name": "mlp", "params": {"hidden": 64}},
    "client": {"lr": 0.1, "batch_size": 16, "local_steps": 10},
    "server": {"aggregator": "median", "clients_per_round": 10, "weighting": "uniform"},
    "attack": {"name": "noise", "params": {"sigma": 100.0}, "fraction": 0.3},
    "eval": {"every": 5},
    "checkpoint": {"every": 1},
    "run": {"progress": False, "threads": 1},
}


def run(raw, out=None, resume=False):
    sim = Simulator(build_sim(config.validate(raw)), out, resume=resume)
    return sim.run(), sim


def with_defenses(names, **top):
    raw = json.loads(json.dumps(REPRO))
    raw["server"]["round_defenses"] = names
    raw.update(top)
    return raw


def test_reproducer_round_four_holds_five_attackers_and_each_defense_bounds_it():
    """Round 4 of seed 7 samples 5 attackers: plain Median moves ‖θ‖ 5 → 240; the cache (the
    rule sees the 29 rows of every client seen so far) and the step bound keep it near 5."""
    norms = {}
    for names in ([], ["cache"], ["step_bound"]):
        _, sim = run(with_defenses(names, rounds=4))
        assert sim.records[3]["byz/count"] == 5
        norms[tuple(names)] = max(r["sys/theta_norm"] for r in sim.records)
    assert norms[()] > 100.0
    assert norms[("cache",)] < 10.0 and norms[("step_bound",)] < 10.0


def test_resume_with_round_defenses_equals_the_uninterrupted_run(tmp_path):
    full = with_defenses(["cache", "step_bound"], rounds=4, eval={"every": 1})
    full["data"] |= {"num_clients": 10, "partition": "iid"}
    full["server"]["clients_per_round"] = 4
    full["client"]["local_steps"] = 2
    run(full, tmp_path / "full")
    run(dict(full, rounds=2), tmp_path / "resumed")
    run(full, tmp_path / "resumed", resume=True)
    a = (tmp_path / "full" / "metrics.jsonl").read_text()
    assert a == (tmp_path / "resumed" / "metrics.jsonl").read_text()
    assert '"defense/cache/cached": 4.0' in a  # the resumed cache held the earlier rows


@pytest.mark.slow
def test_fixed_mode_reproducer_with_cache_ends_within_5_points_of_per_round():
    """The target of docs/cross-round.md: Median in fixed mode, 30 rounds — plain 0.39 (per_round
    0.83); with the cache it ends within 5 points of the per_round twin."""
    res, _ = run(with_defenses(["cache"], rounds=30, eval={"every": 30}))
    twin, _ = run(
        with_defenses(
            [], rounds=30, eval={"every": 30}, attack={**REPRO["attack"], "mode": "per_round"}
        )
    )
    assert res["final_test_acc"] >= twin["final_test_acc"] - 0.05


def test_a_flower_native_strategy_carries_the_defenses_state():
    """Flower-native strategies run the same round step: a strategy whose server carries round
    defenses keeps their memory in ``strategy.state`` from round to round."""
    pytest.importorskip("flwr")
    from test_flower_strategies import M, initial, scripted_app

    from fedshield.flower import strategies as S
    from fedshield.flower.local import LocalGrid

    strategy = S.Median()
    strategy.server.round_defenses = build_round_defenses(["cache", "step_bound"], {})
    strategy.start(LocalGrid(M, scripted_app()), initial(), num_rounds=2)
    assert int(strategy.state["step_bound/count"]) == 2
    assert int((strategy.state["cache/ids"] >= 0).sum()) == M
