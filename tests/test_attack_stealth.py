"""``stealth`` (issue 32, SPEC §16 (a)): x = c − h·r·ū, r the radius the server publishes.

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
