"""``stealth`` (docs/security.md §6b): x = c − h·r·ū, r the radius the server publishes.

Worked example: honest rows (1, 0), (3, 0), (2, 2): coordinate-wise median c = (2, 0), mean
(2, 2/3) so ū = (3, 1)/√10, distances from c 1, 1, 2 so D = 1 (lower median).
"""

from __future__ import annotations

import math

import pytest
import torch

from fedshield import attacks
from fedshield.aggregators import build as build_rule
from fedshield.attacks.base import AttackContext
from fedshield.crossround import build as build_defense
from fedshield.preaggregators import build as build_pre
from fedshield.preaggregators.composed import ComposedRule

HONEST = torch.tensor([[1.0, 0.0], [3.0, 0.0], [2.0, 2.0]], dtype=torch.float64)
U = torch.tensor([3.0, 1.0], dtype=torch.float64) / math.sqrt(10.0)
C = torch.tensor([2.0, 0.0], dtype=torch.float64)


def _cohort() -> tuple[torch.Tensor, torch.Tensor]:
    own = torch.tensor([[9.0, 9.0], [-5.0, 4.0]], dtype=torch.float64)  # ignored
    return torch.cat([HONEST, own]), torch.tensor([False, False, False, True, True])


def _step_history(norms: list[float], window: int) -> dict[str, torch.Tensor]:
    """A step_bound history whose recorded steps have these norms (along (0.6, 0.8))."""
    steps = torch.zeros(window, 2, dtype=torch.float64)
    for i, n in enumerate(norms):
        steps[i] = n * torch.tensor([0.6, 0.8], dtype=torch.float64)
    return {"step_bound/steps": steps, "step_bound/count": torch.tensor(len(norms))}


def test_given_tau_is_the_issue_formula() -> None:
    x, m = _cohort()
    a = attacks.build("stealth", h=0.5, tau=3.0)
    out = a(x, m)
    want = C - 0.5 * 3.0 * 1.0 * U
    assert torch.allclose(out[3], want, atol=1e-15) and torch.equal(out[3], out[4])
    assert torch.equal(out[:3], HONEST)
    assert a.last_radius == 3.0 and a.last_source == "tau"


def test_nothing_published_uses_three_spreads() -> None:
    x, m = _cohort()
    a = attacks.build("stealth", h=1.0)
    out = a(x, m)
    assert torch.allclose(out[3], C - 3.0 * U, atol=1e-15)
    assert a.last_source == "default"


def test_reads_the_reputation_threshold() -> None:
    x, m = _cohort()
    ctx = AttackContext(defenses=(build_defense("reputation", tau=2.0),))
    a = attacks.build("stealth", h=0.9)
    out = a(x, m, context=ctx)
    assert a.last_source == "reputation" and a.last_radius == pytest.approx(2.0)
    assert torch.allclose(out[3], C - 0.9 * 2.0 * U, atol=1e-15)


def test_reads_the_step_bound_history_and_lr() -> None:
    # recorded norms 0.5, 0 (not counted), 1.0 → lower median 0.5; κ = 2 → B = 1.0.
    # ‖c − r·ū‖ = B/η_g: r = ⟨c,ū⟩ + √(⟨c,ū⟩² − ‖c‖² + (B/η_g)²).
    x, m = _cohort()
    bound = build_defense("step_bound", kappa=2.0, window=3)
    rep = build_defense("reputation", tau=5.0)  # r = 5: looser than the step bound
    cu = 6.0 / math.sqrt(10.0)
    for lr in (1.0, 0.5):
        ctx = AttackContext(
            defenses=(rep, bound), published=_step_history([0.5, 0.0, 1.0], 3), lr=lr
        )
        a = attacks.build("stealth", h=1.0)
        out = a(x, m, context=ctx)
        b = 1.0 / lr
        r = cu + math.sqrt(cu * cu - 4.0 + b * b)
        assert a.last_source == "step_bound" and a.last_radius == pytest.approx(r, rel=1e-12)
        # at h = 1 the row's step sits on the bound: η_g·‖x‖ = B
        assert lr * float(out[3].norm()) == pytest.approx(1.0, rel=1e-12)


def test_step_bound_before_any_history_reads_the_honest_norms() -> None:
    # honest norms 1, 3, √8 → lower median √8; κ = 2, η_g = 1: B = 2√8.
    x, m = _cohort()
    ctx = AttackContext(defenses=(build_defense("step_bound", kappa=2.0),))
    a = attacks.build("stealth", h=1.0)
    out = a(x, m, context=ctx)
    assert float(out[3].norm()) == pytest.approx(2.0 * math.sqrt(8.0), rel=1e-12)


def test_reads_clipping_radii_of_the_rule() -> None:
    x, m = _cohort()
    a = attacks.build("stealth", h=1.0)
    a(x, m, context=AttackContext(rule=build_rule("centered_clipping", tau=0.7)))
    assert (a.last_source, a.last_radius) == ("centered_clipping", 0.7)
    a(x, m, context=AttackContext(rule=build_rule("centered_clipping")))  # relative τ: D
    assert (a.last_source, a.last_radius) == ("centered_clipping", 1.0)
    clipped = ComposedRule([build_pre("clip", c=2.5)], build_rule("median"))
    out = a(x, m, context=AttackContext(rule=clipped))
    assert a.last_source == "clip" and float(out[3].norm()) == pytest.approx(2.5, rel=1e-12)


def test_other_centres() -> None:
    x, m = _cohort()
    mean = HONEST.mean(dim=0)
    d_mean = torch.linalg.vector_norm(HONEST - mean, dim=1).sort().values[1]
    out = attacks.build("stealth", h=0.5, tau=2.0, centre="mean")(x, m)
    assert torch.allclose(out[3], mean - 0.5 * 2.0 * float(d_mean) * U, atol=1e-15)
    # the rule's own output on the honest rows: the median rule gives c back
    ctx = AttackContext(rule=build_rule("median"))
    out = attacks.build("stealth", h=0.5, tau=2.0, centre="rule")(x, m, context=ctx)
    assert torch.allclose(out[3], C - 1.0 * U, atol=1e-15)


def test_jitter_is_seeded_and_small() -> None:
    x, m = _cohort()
    a = attacks.build("stealth", h=0.5, tau=3.0, jitter=0.1)
    out = a(x, m, generator=torch.Generator().manual_seed(4))
    again = a(x, m, generator=torch.Generator().manual_seed(4))
    assert torch.equal(out, again) and not torch.equal(out[3], out[4])
    centre = C - 1.5 * U
    # each copy moves by ≈ 0.1·D·‖N(0, I_2)‖/√2: far below the placement's 1.5
    assert float((out[3:] - centre).norm(dim=1).max()) < 0.5


def test_huge_finite_rows_give_finite_rows() -> None:
    x, m = _cohort()
    big = (x * 1e37).float()
    ctx = AttackContext(defenses=(build_defense("reputation", tau=1e6),))
    out = attacks.build("stealth", h=1.0)(big, m, context=ctx)
    assert torch.isfinite(out).all()


def test_the_rows_pass_the_defenses_own_checks() -> None:
    """Through fedshield.crossround's own code: with 3 of 10 rows the stealth rows are not
    flagged by reputation (eq. (1) against the median of the cohort), and with 3 or 6 of
    10 (the median then returns the attackers' row) the step bound clips nothing."""
    from fedshield.aggregators.median import coordinate_median
    from fedshield.core.context import ClientUpdate, RoundContext
    from fedshield.crossround.base import BoundInput
    from fedshield.crossround.reputation import flags

    g = torch.Generator().manual_seed(0)
    honest = torch.randn(10, 50, generator=g, dtype=torch.float64) * 0.3 + 0.2
    history = torch.randn(5, 50, generator=g, dtype=torch.float64) * 0.1 + 0.1
    rep = build_defense("reputation")
    bound = build_defense("step_bound", window=5)
    published = {"step_bound/steps": history.clone(), "step_bound/count": torch.tensor(5)}
    ctx = AttackContext(defenses=(bound, rep), published=published, lr=1.0)
    rctx = RoundContext(6, tuple(range(10)), (), 0, 10, torch.device("cpu"))
    for f in (3, 6):
        mask = torch.arange(10) < f
        out = attacks.build("stealth", h=0.99)(honest, mask, context=ctx)
        agg = coordinate_median(out)
        if f == 3:
            assert not flags(out, agg, rep.tau)[mask].any()
        else:
            assert torch.equal(agg, out[0])  # the attackers own the median's output
        rows = [ClientUpdate(i, out[i], 1, torch.zeros(0)) for i in range(10)]
        theta = torch.zeros(50, dtype=torch.float64)
        _, acted = bound.bound(BoundInput(theta, theta + agg, rows, 1.0), published, rctx)
        assert acted.metrics["defense/step_bound/clipped_blocks"] == 0.0


# --- evade = true: reading collusion's ρ and consistency's γ (eq. (2)) ---------------------


def _evade_cohort(seed: int = 0, n: int = 7, f: int = 3, d: int = 60):
    g = torch.Generator().manual_seed(seed)
    honest = torch.randn(n, d, generator=g, dtype=torch.float64) * 0.3 + 0.2
    x = torch.cat([honest, torch.zeros(f, d, dtype=torch.float64)])
    return x, torch.arange(n + f) >= n, honest


def _guarded(*extra: str) -> AttackContext:
    return AttackContext(
        defenses=tuple(build_defense(n) for n in ("collusion", "consistency", *extra))
    )


def test_simplex_and_side_directions() -> None:
    from fedshield.attacks._published import side_directions, simplex

    g = torch.Generator().manual_seed(2)
    span = torch.randn(4, 12, generator=g, dtype=torch.float64)
    noise = torch.randn(3, 12, generator=g, dtype=torch.float64)
    e = side_directions(span, 3, noise)
    assert e is not None
    torch.testing.assert_close(e @ e.T, torch.eye(3, dtype=torch.float64))
    assert float((e @ span.T).abs().max()) < 1e-12  # orthogonal to every spanning row
    v = simplex(e)
    torch.testing.assert_close(v.norm(dim=1), torch.ones(3, dtype=torch.float64))
    assert float(v.sum(dim=0).norm()) < 1e-12  # the copies' mean stays put
    assert torch.allclose(torch.pdist(v), torch.full((3,), math.sqrt(3.0), dtype=torch.float64))
    assert side_directions(span, 9, torch.randn(9, 12, generator=g)) is None  # 4 + 9 > 12
    assert torch.equal(simplex(e[:1]), e[:1])


def test_copy_spacing_is_collusions_threshold_with_its_margin() -> None:
    """t = (1 + m)·ρ·min(spread, ‖x_i‖) on the actual rows (collusion's eq. (1), spread and
    norms recomputed here from the rows), and collusion's own test flags the copies just
    closer than t/(1 + m) and not at t."""
    from fedshield.attacks._published import copy_spacing, side_directions, simplex
    from fedshield.crossround.collusion import near_duplicates

    x, m, honest = _evade_cohort()
    row = honest.median(dim=0).values - 0.5 * honest.mean(0)
    f, rho, margin = 3, 0.1, 0.05
    t = copy_spacing(honest, row, f, rho, margin)
    noise = torch.randn(f, 60, generator=torch.Generator().manual_seed(5), dtype=torch.float64)
    sides = side_directions(torch.cat([row[None], honest]), f, noise)
    assert sides is not None
    v = simplex(sides)

    def rows_at(spacing: float) -> torch.Tensor:
        q = spacing * math.sqrt((f - 1) / (2 * f))
        return torch.cat([honest, row + q * v])

    rows = rows_at(t)
    pairs = torch.pdist(rows)
    spread = float(pairs.sort().values[(pairs.numel() - 1) // 2])
    norm = float(rows[7:].norm(dim=1).min())
    assert float(torch.pdist(rows[7:]).min()) == pytest.approx(t, rel=1e-12)
    assert t == pytest.approx((1 + margin) * rho * min(spread, norm), rel=1e-9)
    assert not near_duplicates(rows, rho).any()
    assert near_duplicates(rows_at(0.98 * t / (1 + margin)), rho)[7:].all()
    assert copy_spacing(honest, row, 1, rho) == 0.0  # one row: no pair to separate


def test_evade_passes_collusion_and_consistency_on_their_own_code() -> None:
    """Every row at h·r from c with the rows' mean at c − α·ū; collusion's eq. (1) flags
    none and consistency's cosine is ≥ −γ·(1 − margin) for both predicted steps, with the
    bound reached (α is the largest that passes); the plain copies fail both."""
    from fedshield.aggregators.median import coordinate_median
    from fedshield.attacks._published import MARGIN, unit
    from fedshield.crossround.collusion import near_duplicates
    from fedshield.crossround.consistency import offset_cosines

    x, m, honest = _evade_cohort()
    ctx = _guarded("reputation")
    a = attacks.build("stealth", evade=True)
    out = a(x, m, generator=torch.Generator().manual_seed(1), context=ctx)
    c, u = coordinate_median(honest), unit(honest.mean(0))
    r = a.last_radius
    assert a.last_source == "reputation" and r is not None
    assert a.last_pull is not None and a.last_side is not None
    assert a.last_pull**2 + a.last_side**2 == pytest.approx((0.9 * r) ** 2, rel=1e-12)
    assert 0.0 < a.last_pull < 0.9 * r
    torch.testing.assert_close((out[7:] - c).norm(dim=1), torch.full((3,), 0.9 * r).double())
    torch.testing.assert_close(out[7:].mean(0), c - a.last_pull * u)
    assert not near_duplicates(out, 0.1).any()
    worst = min(float(offset_cosines(out, s)[7:].min()) for s in (u, out.median(0).values))
    assert worst >= -0.65 * (1 - MARGIN)
    assert worst == pytest.approx(-0.65 * (1 - MARGIN), abs=1e-6)  # α the largest that passes
    plain = attacks.build("stealth")(x, m, context=ctx)
    assert near_duplicates(plain, 0.1)[7:].all()
    assert float(offset_cosines(plain, u)[7:].max()) < -0.65


def test_evade_with_collusion_alone_spreads_the_copies_by_the_minimum() -> None:
    from fedshield.attacks._published import copy_spacing
    from fedshield.crossround.collusion import near_duplicates

    x, m, honest = _evade_cohort()
    a = attacks.build("stealth", evade=True, margin=0.05)
    ctx = AttackContext(defenses=(build_defense("collusion", rho=0.2),))
    out = a(x, m, generator=torch.Generator().manual_seed(1), context=ctx)
    assert a.last_pull is not None and a.last_side is not None
    centroid = out[7:].mean(0)
    t = copy_spacing(honest, centroid, 3, 0.2, 0.05)
    # the spacing found is collusion's (with margin) to the bisection's resolution
    assert a.last_side == pytest.approx(t * math.sqrt(1 / 3), rel=1e-6)
    assert not near_duplicates(out, 0.2).any()


def test_evade_without_those_defenses_is_the_plain_row() -> None:
    x, m, _ = _evade_cohort()
    ctx = AttackContext(defenses=(build_defense("reputation"),))
    a = attacks.build("stealth", evade=True)
    out = a(x, m, generator=torch.Generator().manual_seed(1), context=ctx)
    assert torch.equal(out, attacks.build("stealth")(x, m, context=ctx))
    assert a.last_side == 0.0


def test_evade_is_seeded_and_refuses_jitter() -> None:
    from fedshield.errors import ConfigError

    x, m, _ = _evade_cohort()
    ctx = _guarded()
    a = attacks.build("stealth", evade=True)
    one = a(x, m, generator=torch.Generator().manual_seed(3), context=ctx)
    assert torch.equal(one, a(x, m, generator=torch.Generator().manual_seed(3), context=ctx))
    assert not torch.equal(one, a(x, m, generator=torch.Generator().manual_seed(4), context=ctx))
    with pytest.raises((ConfigError, ValueError), match="jitter"):
        attacks.build("stealth", evade=True, jitter=0.1)


def test_evade_without_room_beside_the_honest_rows_sends_the_plain_row() -> None:
    x, m = _cohort()  # d = 2: no direction orthogonal to c and the honest rows
    a = attacks.build("stealth", evade=True, tau=3.0, h=0.5)
    out = a(x, m, generator=torch.Generator().manual_seed(0), context=_guarded())
    assert torch.allclose(out[3], C - 1.5 * U, atol=1e-15) and torch.equal(out[3], out[4])
    assert a.last_pull is None
