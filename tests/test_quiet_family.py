"""``quiet`` (docs/cross-round.md, "Searched attacker"): the quiet attacks as one family.

Its defaults are ``stealth``'s rows, ``spread = "simplex"`` is ``stealth``'s ``evade``, and
``spread = "own"`` gives distinct rows whose mean is the hug row.
"""

from __future__ import annotations

import math

import pytest
import torch

from fedshield import attacks
from fedshield.aggregators import build as build_rule
from fedshield.attacks.base import AttackContext
from fedshield.attacks.quiet_family import nnm_centre
from fedshield.crossround import build as build_defense


def _cohort(
    seed: int = 0, n: int = 7, f: int = 3, d: int = 40
) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n + f, d, generator=g, dtype=torch.float64) + 0.5
    mask = torch.zeros(n + f, dtype=torch.bool)
    mask[n:] = True
    return x, mask


def _context() -> AttackContext:
    defenses = tuple(
        build_defense(name) for name in ("collusion", "consistency", "step_bound", "reputation")
    )
    return AttackContext(rule=build_rule("median"), defenses=defenses, lr=1.0)


@pytest.mark.parametrize("stealth", [{}, {"h": 0.5, "tau": 2.0}, {"centre": "mean"}])
def test_defaults_give_stealths_rows(stealth: dict[str, object]) -> None:
    x, m = _cohort()
    ctx = _context()
    want = attacks.build("stealth", **stealth)(x, m, context=ctx)
    got = attacks.build("quiet", **stealth)(x, m, context=ctx)
    assert torch.equal(got, want)


def test_simplex_spread_gives_stealth_evades_rows() -> None:
    x, m = _cohort(1)
    ctx = _context()
    gen = lambda: torch.Generator().manual_seed(5)  # noqa: E731 - the same draw for both
    want = attacks.build("stealth", evade=True)(x, m, generator=gen(), context=ctx)
    got = attacks.build("quiet", spread="simplex")(x, m, generator=gen(), context=ctx)
    assert torch.equal(got, want)
    assert not torch.equal(got[7], got[8])  # the evading rows are spread


def test_own_spread_rows_are_distinct_with_the_hug_row_as_mean() -> None:
    x, m = _cohort(2)
    ctx = _context()
    hug = attacks.build("quiet")(x, m, context=ctx)[m][0]
    for j in (1.0, 2.5):
        rows = attacks.build("quiet", spread="own", j=j)(x, m, context=ctx)[m]
        assert len({tuple(r.tolist()) for r in rows}) == 3
        # mean of j·(g_i − ḡ) is 0 up to float64 round-off of a few ulps of ‖g‖·j
        assert torch.allclose(rows.mean(dim=0), hug, rtol=0.0, atol=1e-12 * j)
        own = x[m]
        assert torch.allclose(rows - hug, j * (own - own.mean(dim=0)), rtol=0.0, atol=1e-12 * j)
    assert torch.equal(attacks.build("quiet")(x, m, context=ctx)[~m], x[~m])


def test_turned_direction_has_the_chosen_cosine() -> None:
    x, m = _cohort(3)
    honest = x[~m]
    a = attacks.build("quiet", cosine=0.6, tau=2.0)
    row = a(x, m, generator=torch.Generator().manual_seed(1))[m][0]
    centre = honest.median(dim=0).values
    push = centre - row
    u = honest.mean(dim=0)
    cos = float(push @ u) / float(push.norm() * u.norm())
    assert cos == pytest.approx(0.6, abs=1e-9)
    assert float(push.norm()) == pytest.approx(
        2.0 * a.h * (honest - centre).norm(dim=1).sort().values[3], rel=1e-9
    )


def test_sleeper_and_outvote_upload_honest_updates() -> None:
    x, m = _cohort()
    sleeper = attacks.build("quiet", sleep=2)
    for _ in range(2):
        assert torch.equal(sleeper(x, m), x) and sleeper.last_attacked is False
    assert not torch.equal(sleeper(x, m), x) and sleeper.last_attacked is True
    # the median of 10 rows is owned by 5 attackers; 3 do not attack under outvote
    ctx = AttackContext(rule=build_rule("median"))
    waiting = attacks.build("quiet", timing="outvote")
    assert torch.equal(waiting(x, m, context=ctx), x)
    m5 = m.clone()
    m5[5:] = True
    assert not torch.equal(waiting(x, m5, context=ctx), x)


def test_nnm_centre_and_sign_direction() -> None:
    x, m = _cohort(4)
    a = attacks.build("quiet", centre="nnm", direction="sign", tau=1.0, h=1.0)
    row = a(x, m)[m][0]
    u = torch.sign(x[~m].mean(dim=0))
    assert a.last_source == "tau" and a.last_radius is not None and math.isfinite(a.last_radius)
    # the push is along −sign(ū): c − row is a positive multiple of sign(ū), of norm r
    diff = nnm_centre(x[~m]) - row
    assert torch.allclose(diff / diff.norm(), u / u.norm(), atol=1e-12)
    assert float(diff.norm()) == pytest.approx(a.last_radius, rel=1e-12)
