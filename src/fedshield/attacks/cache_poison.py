"""``cache_poison``: a directed row in every upload (docs/security.md §6b).

Cached aggregation (:mod:`fedshield.crossround.cache`) hands the rule every client's latest
upload, so an attacker's row keeps counting in the rounds after its own: a row pointing the
same way every round makes the attackers' share of the cache the population's, all of it
pulling one direction. Every attacker uploads

    x = −s · n̄ · v                                                                 (1)

n̄ the lower median norm of the honest rows, s the ``scale``, and v a unit direction:
``mean`` the unit honest mean ū (x opposes the honest step), ``own`` the attacker's own
honest update (a sign flip at norm s·n̄), ``fixed`` a unit vector drawn once from ``seed``
(the same every round: cached rows of different rounds add up exactly).
"""

from __future__ import annotations

from typing import Any, Literal

import torch
from pydantic import Field
from torch import Tensor

from fedshield.aggregators._ops import row_norms, to_dtype
from fedshield.attacks._common import CohortAttack, Ctx, Rng, honest_pool, with_rows
from fedshield.attacks._published import unit
from fedshield.attacks.base import ATTACKS
from fedshield.core.params import Params
from fedshield.crossround.step_bound import lower_median


class CachePoisonParams(Params):
    scale: float = Field(
        1.0, gt=0.0, le=1e6, description="s: the row's norm as a multiple of the median honest norm"
    )
    direction: Literal["mean", "own", "fixed"] = Field(
        "mean",
        description="v: mean (against the unit honest mean), own (against the attacker's own "
        "update), fixed (a seeded unit vector, the same every round)",
    )
    seed: int = Field(0, ge=0, description="seed of the fixed direction")


def fixed_direction(d: int, seed: int) -> Tensor:
    """The unit vector of ``direction = "fixed"``: a N(0, I_d) draw from ``seed``, normalised
    (float64, CPU; the same for a given (d, seed) on every machine)."""
    g = torch.Generator().manual_seed(seed)
    return unit(torch.randn(d, generator=g, dtype=torch.float64))


@ATTACKS.register("cache_poison", tags=["kind=update", "omniscient"])
class CachePoison(CohortAttack):
    """A directed row in every upload, so that a cached row outlives its round: x = −s·n̄·v,
    v the unit honest mean, the attacker's own update or a fixed seeded direction.

    See docs/security.md §6b and the module docstring."""

    params_schema = CachePoisonParams
    #: On Flower it runs in the strategy: its norm reads the round's honest rows.
    omniscient = True
    scale: float
    direction: str
    seed: int

    def __init__(self, **params: Any) -> None:
        super().__init__(**params)
        # only ``own`` reads the attacker's update: the engine may skip training the others
        self.needs_own_update = self.direction == "own"

    def craft(self, updates: Tensor, mask: Tensor, generator: Rng, context: Ctx) -> Tensor:
        pool = honest_pool(updates, mask)
        norm = self.scale * (lower_median(row_norms(pool)) or 0.0)
        if self.direction == "own":
            own = updates[mask].double()
            n = row_norms(updates[mask]).unsqueeze(1)
            dirs = torch.where(n > 0, own / n.clamp_min(1e-300), 0.0)
            dirs = torch.nan_to_num(dirs, nan=0.0, posinf=0.0, neginf=0.0)
            return with_rows(updates, mask, to_dtype(dirs * -norm, updates.dtype))
        if self.direction == "fixed":
            v = fixed_direction(updates.shape[1], self.seed).to(updates.device)
        else:
            v = unit(pool.double().mean(dim=0))
        return with_rows(updates, mask, to_dtype(v * -norm, updates.dtype))


__all__ = ["CachePoison", "fixed_direction"]
