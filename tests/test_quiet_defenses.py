"""Round defenses against quiet attackers: collusion evidence
(near-identical rows of different clients) and server-kept worker momentum, on hand-built
quiet rows — worked examples of their formulas and of the f they leave the rule."""

from __future__ import annotations

import pytest
import torch

from fedshield.aggregators import build as build_rule
from fedshield.algorithms.server import ServerRound
from fedshield.core.context import ClientUpdate, RoundContext
from fedshield.crossround import build, build_round_defenses
from fedshield.crossround.base import BoundInput
from fedshield.crossround.chain import lowered_f
from fedshield.crossround.collusion import near_duplicates

CPU = torch.device("cpu")


def ctx(rnd: int, cohort: tuple[int, ...], m: int = 20) -> RoundContext:
    return RoundContext(rnd, cohort, (), 0, m, CPU)


def upload(cid: int, delta, mask=None) -> ClientUpdate:
    return ClientUpdate(cid, torch.as_tensor(delta, dtype=torch.float32), 1, torch.zeros(0), mask)


def honest_rows(n: int, d: int = 16, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return 1.0 + torch.randn(n, d, generator=g)  # a common mean, heterogeneous clients


def hug(honest: torch.Tensor, h: float = 0.9, tau: float = 3.0) -> torch.Tensor:
    """The quiet row x = med − h·τ·med_j‖h_j − med‖·ū."""
    med = honest.median(dim=0).values
    u = honest.mean(0) / honest.mean(0).norm()
    return med - h * tau * (honest - med).norm(dim=1).median() * u


# --- collusion ----------------------------------------------------------------------------


def test_identical_quiet_rows_are_flagged_and_honest_rows_are_not():
    honest = honest_rows(7)
    x = hug(honest)
    rows = torch.cat([honest, x.expand(3, -1)])
    assert near_duplicates(rows, 0.1).tolist() == [False] * 7 + [True] * 3
    # as a majority too: 6 identical of 10 — their 15 zero pairs are fewer than half of 45
    rows = torch.cat([honest[:4], x.expand(6, -1)])
    assert near_duplicates(rows, 0.1).tolist() == [False] * 4 + [True] * 6


def test_far_outliers_do_not_make_honest_rows_look_near_identical():
    """Noise rows (σ = 100) inflate the pairwise median; each row's own norm caps the scale,
    so the honest rows are not flagged, whether the outliers are 3 or 6 of 10."""
    g = torch.Generator().manual_seed(1)
    honest, noise = honest_rows(7), 100.0 * torch.randn(6, 16, generator=g)
    assert not near_duplicates(torch.cat([honest, noise[:3]]), 0.1).any()
    assert not near_duplicates(torch.cat([honest[:4], noise]), 0.1).any()


def test_near_duplicates_needs_three_rows_and_a_spread():
    x = torch.ones(2, 4)
    assert not near_duplicates(x, 0.5).any()
    assert not near_duplicates(torch.ones(5, 4), 0.5).any()  # all equal: no spread to judge
    # a non-finite row is not compared and not flagged
    rows = torch.cat([honest_rows(4), torch.full((1, 16), float("nan"))])
    assert near_duplicates(rows, 0.1).tolist() == [False] * 5


def test_collusion_drops_the_copies_and_lowers_the_rules_f_by_them():
    honest = honest_rows(7)
    x = hug(honest)
    kept = [upload(k, honest[k]) for k in range(7)] + [upload(10 + k, x) for k in range(3)]
    rows, acted = build("collusion").rows(kept, {}, ctx(1, tuple(u.client_id for u in kept)))
    assert [u.client_id for u in rows] == list(range(7))
    assert acted.identified == 3 and acted.metrics["defense/collusion/duplicates"] == 3.0
    rule = build_rule("trimmed_mean", f=4)
    assert lowered_f(rule, 3).f == 1 and lowered_f(rule, 9).f == 0
    assert lowered_f(build_rule("median"), 3) is not None  # no f: the rule itself
    assert lowered_f(rule, 0) is rule


def test_collusion_suspends_repeat_senders_even_once_they_jitter():
    """Two flagged uploads in a row give 1 then 1.9 ≥ 1.5: the client stays out of the
    round where its rows are jittered past eq. (1), and is restored by consistent uploads
    (0.9 · 1.9 = 1.71, then 1.54, then 1.39 < 1.5)."""
    col = build("collusion")  # ρ = 0.1, λ = 0.9, threshold 1.5
    state: dict = {}
    attackers = (10, 11, 12)

    def one_round(rnd: int, jitter: float) -> list[int]:
        nonlocal state
        honest = honest_rows(7, seed=rnd)
        x = hug(honest)
        g = torch.Generator().manual_seed(100 + rnd)
        bad = [x + jitter * torch.randn(x.shape, generator=g) for _ in attackers]
        kept = [upload(k, honest[k]) for k in range(7)]
        kept += [upload(c, b) for c, b in zip(attackers, bad, strict=True)]
        c = ctx(rnd, tuple(u.client_id for u in kept))
        rows, acted = col.rows(kept, state, c)
        step = BoundInput(torch.zeros(16), honest.mean(0), rows, 1.0, kept)
        _, judged = col.bound(step, state, c)
        state = {**state, **acted.state, **judged.state}
        return [u.client_id for u in rows]

    assert one_round(1, 0.0) == list(range(7))
    assert one_round(2, 0.0) == list(range(7))
    assert one_round(3, 3.0) == list(range(7))  # jittered: suspended on their record
    assert one_round(4, 3.0) == list(range(7))
    assert one_round(5, 3.0) == list(range(7))
    assert one_round(6, 3.0) == [*range(7), *attackers]
    scores = dict(zip(state["collusion/ids"].tolist(), state["collusion/scores"].tolist()))
    assert scores[10] == pytest.approx(0.9**4 * 1.9) and scores[0] == 0.0


def test_collusion_through_the_chain_runs_the_rule_with_the_lowered_f():
    honest = honest_rows(7)
    x = hug(honest)
    kept = [upload(k, honest[k]) for k in range(7)] + [upload(10 + k, x) for k in range(3)]
    defenses = build_round_defenses(["collusion"], {})
    assert defenses is not None
    seen = []

    class Server:
        aggregator = build_rule("trimmed_mean", f=3)
        lr = 1.0

        def update(self, rnd):
            from fedshield.algorithms.server.base import ServerStep

            rows = rnd.updates
            seen.append((len(rows), self.aggregator.f))
            return ServerStep(
                rnd.params + self.aggregator(torch.stack([u.delta for u in rows])),
                rnd.buffers, {}, {},
            )  # fmt: skip

        def post_step(self, step, rnd):
            return step

    start = ServerRound(torch.zeros(16), torch.zeros(0), {}, kept, ctx(1, ()))
    out = defenses.step(Server(), start)
    assert seen == [(7, 0)]  # trimmed mean of 7 rows with f = 3 − 3: the honest mean
    torch.testing.assert_close(out.params, honest.mean(0), rtol=1e-5, atol=1e-5)


# --- direction consistency ---------------------------------------------------------------


def test_consistency_flags_offsets_against_the_applied_step_and_suspends_on_the_second():
    from fedshield.crossround.consistency import against_step

    honest = honest_rows(7)
    x = hug(honest)
    rows = torch.cat([honest, x.expand(3, -1)])
    step = rows.median(dim=0).values  # what a median applies: pulled, still the honest side
    flags = against_step(rows, step, 0.65)
    assert flags[7:].all() and not flags[:7].any()
    # cos of the offset (−1, 0) from the median (1, 0) with the step (1, 0) is −1 < −γ
    two = torch.tensor([[0.0, 0.0], [1.0, 1.0], [1.0, -1.0], [1.0, 0.0]])
    assert against_step(two, torch.tensor([1.0, 0.0]), 0.65).tolist() == [True, False, False, False]
    con = build("consistency")  # γ = 0.65, λ = 0.8, threshold 1.5
    state: dict = {}
    kept = [upload(k, r) for k, r in enumerate(rows)]
    c = ctx(1, tuple(range(10)))
    for _ in range(2):  # 1, then 1.8 ≥ 1.5
        _, acted = con.bound(BoundInput(torch.zeros(16), step, kept, 1.0, kept), state, c)
        state = {**state, **acted.state}
        assert acted.metrics["defense/consistency/flagged"] == 3.0
    left, acted = con.rows(kept, state, c)
    assert [u.client_id for u in left] == list(range(7)) and acted.identified == 0


# --- worker momentum ---------------------------------------------------------------------


def test_momentum_is_beta_times_the_last_plus_one_minus_beta_times_the_upload():
    mom = build("momentum", beta=0.5)
    state: dict = {}

    def one_round(rnd: int, rows: dict[int, list[float]]) -> dict[int, list[float]]:
        nonlocal state
        kept = [upload(c, r) for c, r in rows.items()]
        out, acted = mom.rows(kept, state, ctx(rnd, tuple(rows), m=4))
        state = {**state, **acted.state}
        return {u.client_id: u.delta.tolist() for u in out}

    assert one_round(1, {0: [2.0, 0.0], 1: [0.0, 4.0]}) == {0: [2.0, 0.0], 1: [0.0, 4.0]}
    assert one_round(2, {0: [0.0, 2.0]}) == {0: [1.0, 1.0]}  # 0.5·(2, 0) + 0.5·(0, 2)
    assert one_round(3, {0: [1.0, 1.0], 1: [0.0, 0.0]}) == {0: [1.0, 1.0], 1: [0.0, 2.0]}
    masked = upload(2, [5.0, 5.0], mask=torch.tensor([True, False]))
    out, _ = mom.rows([masked], state, ctx(4, (2,), m=4))
    assert out[0] is masked  # a tiered row passes unchanged


def test_momentum_malformed_state_starts_over():
    mom = build("momentum")
    state = {"momentum/ids": torch.zeros(3)}  # wrong dtype, other fields missing
    out, acted = mom.rows([upload(0, [1.0, 2.0])], state, ctx(1, (0,)))
    assert out[0].delta.tolist() == [1.0, 2.0] and acted.metrics["defense/momentum/reset"] == 1.0


# --- a run: the registered stealth attack against the collusion check --------------------


def test_stealth_rows_are_left_out_every_round_of_a_run():
    """The library's stealth attack (identical hug rows at the published radius) against
    Median + collusion: each round exactly the cohort's attackers are left out — as
    duplicates the first time, suspended after — and no honest client is."""
    from fedshield.config import validate
    from fedshield.runner import run

    raw = {
        "name": "quiet",
        "seed": 1,
        "rounds": 3,
        "data": {
            "dataset": "digits",
            "num_clients": 20,
            "partition": "dirichlet",
            "beta": 0.5,
            "min_size": 5,
        },
        "model": {"name": "mlp", "params": {"hidden": 8}},
        "client": {"lr": 0.1, "batch_size": 16, "local_steps": 3},
        "server": {
            "aggregator": "median",
            "clients_per_round": 10,
            "weighting": "uniform",
            "round_defenses": ["collusion", "step_bound"],
        },
        "attack": {"name": "stealth", "fraction": 0.3},
        "eval": {"every": 3},
        "run": {"threads": 1, "progress": False},
    }
    res = run(validate(raw, "t"), None, quiet=True)
    left_out = [
        r["defense/collusion/duplicates"] + r["defense/collusion/suspended"] for r in res.history
    ]
    assert left_out == [r["byz/count"] for r in res.history]
    assert all(r["byz/count"] > 0 for r in res.history)
