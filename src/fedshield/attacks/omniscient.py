"""Omniscient update attacks built from benign statistics: ``alie`` and ``ipm``.

Both read the round's benign rows (as in the papers) and ignore the attacker's own
update; every attacker uploads the same vector. With no benign row the statistics come
from all rows (see :func:`fedshield.attacks._common.honest_pool`).
"""

from __future__ import annotations

import math
from statistics import NormalDist

from pydantic import Field
from torch import Tensor

from fedshield.attacks._common import CohortAttack, Ctx, Rng, coord_std, honest_pool, with_rows
from fedshield.attacks.base import ATTACKS
from fedshield.core.params import Params


def alie_z(n: int, f: int) -> float:
    """z_max of Baruch et al. (NeurIPS 2019, "A Little Is Enough", §4):
    s = ⌊n/2 + 1⌋ − f workers must be won over, z_max = Φ⁻¹((n − s)/n).

    When attackers are a majority the paper's s ≤ 0 and z_max = +∞; we cap s at 1, i.e.
    use the largest finite z for that n (our choice: per-round Byzantine counts vary under
    partial participation, and an infinite upload would only be a NaN factory). The cdf
    is also floored at 1/2 (z ≥ 0), which only matters for the degenerate n = 1.
    """
    if n < 1 or not 0 <= f <= n:
        raise ValueError(f"need n >= 1 and 0 <= f <= n, got n={n}, f={f}")
    s = max(math.floor(n / 2 + 1) - f, 1)
    cdf = max((n - s) / n, 0.5)
    return NormalDist().inv_cdf(cdf)


class ALIEParams(Params):
    z: float | None = Field(
        None,
        description="multiplier z of σ; unset: the paper's z_max for this round's n and f",
    )


class IPMParams(Params):
    epsilon: float = Field(0.1, gt=0.0, description="scale ε of the reversed benign mean −ε·ḡ")


@ATTACKS.register("alie", tags=["kind=update", "omniscient"])
class ALIE(CohortAttack):
    """Upload μ − z·σ of the benign coordinate-wise mean and std (ALIE, Baruch et al. 2019).

    Baruch et al. 2019; σ is the unbiased std. ``z`` unset (default) uses the paper's z_max
    for n = S rows and f = number of Byzantine rows in this round (:func:`alie_z`); a
    number overrides it. ByzFL's ``ALittleIsEnough(tau)`` computes μ + τσ with the same
    std, i.e. τ = −z.
    """

    params_schema = ALIEParams
    needs_own_update = False
    z: float | None

    #: z used in the last call (None before the first call or with no attacker)
    last_z: float | None = None

    def forget(self) -> None:
        self.last_z = None

    def craft(self, updates: Tensor, mask: Tensor, generator: Rng, context: Ctx) -> Tensor:
        f = int(mask.sum())
        pool = honest_pool(updates, mask)
        z = self.z if self.z is not None else alie_z(updates.shape[0], f)
        self.last_z = z
        return with_rows(updates, mask, pool.mean(dim=0) - z * coord_std(pool))


@ATTACKS.register("ipm", tags=["kind=update", "omniscient"])
class IPM(CohortAttack):
    """Upload −ε·ḡ, ḡ the mean benign update: inner-product manipulation (Xie et al. 2020).

    Xie, Koyejo & Gupta, UAI 2019. Default ε = 0.1, the paper's small-ε setting that makes
    the inner product with the true gradient negative while staying close to the benign
    cloud. ByzFL's ``InnerProductManipulation(tau)`` is the same rule with τ = ε (its
    default 2.0).
    """

    params_schema = IPMParams
    needs_own_update = False
    epsilon: float

    def craft(self, updates: Tensor, mask: Tensor, generator: Rng, context: Ctx) -> Tensor:
        pool = honest_pool(updates, mask)
        return with_rows(updates, mask, pool.mean(dim=0) * -self.epsilon)
