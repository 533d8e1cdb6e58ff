"""``cache_poison`` (docs/security.md §6b): x = −s·n̄·v in every upload, so a cached row
outlives its round. Worked example: honest rows (3, 4), (0, 2), (6, 8): norms 5, 2, 10, so
n̄ = 5 (lower median); mean (3, 14/3)."""

from __future__ import annotations

import math

import torch

from fedshield import attacks
from fedshield.attacks.cache_poison import fixed_direction
from fedshield.core.context import ClientUpdate, RoundContext
from fedshield.crossround import build as build_defense

HONEST = torch.tensor([[3.0, 4.0], [0.0, 2.0], [6.0, 8.0]], dtype=torch.float64)
OWN = torch.tensor([[0.0, -3.0], [1.0, 0.0]], dtype=torch.float64)
X = torch.cat([HONEST, OWN])
M = torch.tensor([False, False, False, True, True])


def test_against_the_honest_mean() -> None:
    out = attacks.build("cache_poison", scale=2.0)(X, M)
    mean = torch.tensor([3.0, 14.0 / 3.0], dtype=torch.float64)
    want = -2.0 * 5.0 * mean / mean.norm()
    assert torch.allclose(out[3], want, atol=1e-14) and torch.equal(out[3], out[4])
    assert torch.equal(out[:3], HONEST)


def test_against_the_own_update() -> None:
    a = attacks.build("cache_poison", direction="own")
    assert a.needs_own_update
    out = a(X, M)
    want = torch.tensor([[0.0, 5.0], [-5.0, 0.0]], dtype=torch.float64)
    assert torch.allclose(out[3:], want, atol=1e-14)


def test_fixed_direction_is_the_same_every_round() -> None:
    a = attacks.build("cache_poison", direction="fixed", seed=3)
    assert not a.needs_own_update
    v = fixed_direction(2, 3)
    assert math.isclose(float(v.norm()), 1.0, rel_tol=1e-15)
    first = a(X, M)
    later = a(torch.cat([HONEST * 2.0, OWN]), M)  # another round: n̄ = 10
    assert torch.allclose(first[3], -5.0 * v, atol=1e-14)
    assert torch.allclose(later[3], -10.0 * v, atol=1e-14)
    assert not torch.allclose(fixed_direction(2, 4), v)


def test_a_poisoned_row_outlives_its_round_in_the_cache() -> None:
    cache = build_defense("cache")
    poisoned = attacks.build("cache_poison")(X, M)

    def ups(rows: torch.Tensor, ids: list[int]) -> list[ClientUpdate]:
        return [ClientUpdate(i, r, 1, torch.zeros(0)) for i, r in zip(ids, rows, strict=True)]

    def ctx(rnd: int, cohort: list[int]) -> RoundContext:
        return RoundContext(rnd, tuple(cohort), (3, 4), 0, 10, torch.device("cpu"))

    rows, acted = cache.rows(ups(poisoned, [0, 1, 2, 3, 4]), {}, ctx(1, [0, 1, 2, 3, 4]))
    # round 2: only honest clients 0 and 5 answer; the attackers' round-1 rows still count
    later, _ = cache.rows(ups(HONEST[:2], [0, 5]), acted.state, ctx(2, [0, 5]))
    kept = {u.client_id: u.delta for u in later}
    assert torch.equal(kept[3], poisoned[3]) and torch.equal(kept[4], poisoned[4])
