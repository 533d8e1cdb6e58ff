"""``opportunist`` (docs/security.md §6b): honest until the cohort holds the rule's
breakdown count + 1 of attackers, then x = −ρ·(B/η_g)·ū, just under the step bound."""

from __future__ import annotations

import math

import pytest
import torch

from fedshield import attacks
from fedshield.aggregators import build as build_rule
from fedshield.attacks.base import AttackContext
from fedshield.attacks.opportunist import winning_count
from fedshield.crossround import build as build_defense


def _cohort(attackers: int, s: int = 10) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(5)
    x = torch.randn(s, 6, generator=g, dtype=torch.float64) + 1.0
    mask = torch.zeros(s, dtype=torch.bool)
    mask[:attackers] = True
    return x, mask


def test_winning_count_reads_the_rule() -> None:
    assert winning_count(AttackContext(rule=build_rule("median")), 10) == 5  # ⌊9/2⌋ + 1
    assert winning_count(AttackContext(rule=build_rule("krum", f=2)), 10) == 3
    assert winning_count(AttackContext(rule=build_rule("trimmed_mean")), 10) == 5
    assert winning_count(None, 10) == 1  # the plain mean: one row moves it


def test_honest_below_the_breakdown_count() -> None:
    ctx = AttackContext(rule=build_rule("median"), cohort=10)
    a = attacks.build("opportunist")
    x, m = _cohort(4)
    out = a(x, m, context=ctx)
    assert torch.equal(out, x) and a.last_attacked is False
    x, m = _cohort(5)
    out = a(x, m, context=ctx)
    assert a.last_attacked is True and not torch.equal(out[m], x[m])
    # the cohort the server asked counts, not the rows given (two honest replies missing)
    out = a(x[:8], m[:8], context=ctx)
    assert a.last_attacked is True
    assert a(x, m, context=AttackContext(rule=build_rule("median"), cohort=12)) is not None
    assert a.last_attacked is False  # 5 of 12 asked: the median still outvotes them


def test_threshold_overrides_the_rule() -> None:
    x, m = _cohort(2)
    a = attacks.build("opportunist", threshold=2)
    a(x, m, context=AttackContext(rule=build_rule("median")))
    assert a.last_attacked is True


def test_just_under_the_published_step_bound() -> None:
    # recorded step norms 2 and 4 → lower median 2; κ = 3 → B = 6; η_g = 0.5 → ‖x‖ = ρ·12
    steps = torch.zeros(4, 6, dtype=torch.float64)
    steps[0, 0], steps[1, 1] = 2.0, 4.0
    bound = build_defense("step_bound", kappa=3.0, window=4)
    ctx = AttackContext(
        rule=build_rule("median"),
        defenses=(bound,),
        published={"step_bound/steps": steps, "step_bound/count": torch.tensor(2)},
        lr=0.5,
        cohort=10,
    )
    x, m = _cohort(6)
    out = attacks.build("opportunist", factor=0.99)(x, m, context=ctx)
    u = x[~m].mean(dim=0)
    u = u / u.norm()
    assert torch.allclose(out[m], (-0.99 * 12.0 * u).expand(6, 6), atol=1e-12)
    assert 0.5 * float(out[m][0].norm()) < 6.0  # the applied step is not clipped


def test_without_a_step_bound_uses_the_honest_norm() -> None:
    x, m = _cohort(6)
    out = attacks.build("opportunist", scale=2.0)(x, m)
    norms = x[~m].norm(dim=1).sort().values
    assert float(out[m][0].norm()) == pytest.approx(2.0 * float(norms[1]), rel=1e-12)
    u = x[~m].mean(dim=0)
    cos = float(out[m][0] @ u) / (float(out[m][0].norm()) * float(u.norm()))
    assert math.isclose(cos, -1.0, rel_tol=1e-12)


def test_the_attacked_step_passes_the_step_bound_itself() -> None:
    """Through StepBound.bound: the median's output (the attackers' row, 6 of 10) as the
    applied step is not clipped, and the ratio to the radius is the factor."""
    from fedshield.aggregators.median import coordinate_median
    from fedshield.core.context import ClientUpdate, RoundContext
    from fedshield.crossround.base import BoundInput

    g = torch.Generator().manual_seed(1)
    history = torch.randn(5, 6, generator=g, dtype=torch.float64)
    bound = build_defense("step_bound", window=5)
    published = {"step_bound/steps": history, "step_bound/count": torch.tensor(5)}
    ctx = AttackContext(rule=build_rule("median"), defenses=(bound,), published=published)
    x, m = _cohort(6)
    out = attacks.build("opportunist")(x, m, context=ctx)
    agg = coordinate_median(out)
    rows = [ClientUpdate(i, out[i], 1, torch.zeros(0)) for i in range(10)]
    theta = torch.zeros(6, dtype=torch.float64)
    rctx = RoundContext(6, tuple(range(10)), (), 0, 10, torch.device("cpu"))
    _, acted = bound.bound(BoundInput(theta, theta + agg, rows, 1.0), published, rctx)
    assert acted.metrics["defense/step_bound/clipped_blocks"] == 0.0
    assert acted.metrics["defense/step_bound/ratio"] == pytest.approx(0.99, rel=1e-9)
