"""``quiet``: the quiet attacks as one parametrised family, for a search rather than a menu
(docs/cross-round.md, "Searched attacker").

Every attacking round, attacker i of the cohort uploads

    x_i = c − h · r · v + s_i                                                      (1)

* c, the centre (``centre``): the coordinate-wise median of the honest rows, their mean,
  the configured rule's output on them (:func:`fedshield.attacks.stealth.honest_centre`),
  or the median of their Nearest-Neighbour Mixing (Allouah et al., AISTATS 2023: each row
  the mean of its n − f nearest, f = ⌊(n − 1)/2⌋);
* v, the direction (``direction``, ``cosine``): b = ū, the unit honest mean, or the unit
  of sign(ū); with ``cosine`` κ < 1, v = κ·b + √(1 − κ²)·w, w a seeded unit vector
  orthogonal to b (a fresh one each round), so ⟨v, b⟩ = κ;
* r, the radius the server publishes along −v from c (the smallest of
  :func:`fedshield.attacks._published.radii`; ``tau`` set: τ × the median honest distance
  D from c; nothing published: 3·D, as ``stealth``), and h the placement (h > 1 leaves it);
* s_i, the spread (``spread``): 0 (``copies``: identical rows), the regular simplex just
  past collusion's ρ and consistency's γ of ``stealth``'s ``evade``
  (:func:`fedshield.attacks._published.evading_rows`, which then sets the whole row), or
  j × the attacker's own honest update's deviation from the attackers' mean (``own``): the
  rows are as distinct as honest ones and their mean is the hug row c − h·r·v.

``timing``: ``always`` attacks in every round; ``outvote`` only in rounds where the
cohort holds enough attackers to own the rule's output
(:func:`fedshield.attacks.opportunist.winning_count`); ``sleep`` = k > 0 uploads the
honest updates for the first k rounds with attackers in the cohort, whatever ``timing``.
In a round that does not attack every attacker uploads its own honest update.

With the defaults (median, ū, κ = 1, h = 0.9, copies, always, no sleep) the rows are
``stealth``'s; with ``spread = "simplex"`` they are ``stealth``'s with ``evade = true``.
"""

from __future__ import annotations

import math
from typing import Any, Literal

import torch
from pydantic import Field
from torch import Tensor

from fedshield.aggregators._ops import W, to_dtype
from fedshield.aggregators.median import coordinate_median
from fedshield.attacks._common import CohortAttack, Ctx, Rng, honest_pool, with_rows
from fedshield.attacks._published import MARGIN, unit
from fedshield.attacks.base import ATTACKS
from fedshield.attacks.opportunist import winning_count
from fedshield.attacks.stealth import TAU, evading_placement, honest_centre, hug_radius
from fedshield.core.params import Params
from fedshield.preaggregators.nnm import default_f, nnm


class QuietParams(Params):
    centre: Literal["median", "mean", "rule", "nnm"] = Field(
        "median",
        description="c: the honest rows' coordinate-wise median, mean, the configured rule's "
        "output on them, or the median of their nearest-neighbour mixing",
    )
    direction: Literal["mean", "sign"] = Field(
        "mean", description="b: the unit honest mean ū, or the unit of sign(ū)"
    )
    cosine: float = Field(
        1.0,
        ge=-1.0,
        le=1.0,
        description="κ: the row is pushed along −v, v = κ·b + √(1 − κ²)·w (w seeded, ⊥ b)",
    )
    tau: float | None = TAU
    h: float = Field(
        0.9, gt=0.0, le=10.0, description="placement: the fraction of the published radius"
    )
    spread: Literal["copies", "simplex", "own"] = Field(
        "copies",
        description="the attackers' rows: identical copies, stealth evade's simplex past "
        "collusion and consistency, or the hug row plus j × each attacker's own honest "
        "deviation from the attackers' mean",
    )
    j: float = Field(1.0, ge=0.0, le=100.0, description="with spread = own: the deviation's scale")
    margin: float = Field(
        MARGIN, ge=0.0, le=0.5, description="with spread = simplex: stealth evade's margin"
    )
    timing: Literal["always", "outvote"] = Field(
        "always",
        description="attack every round, or only when the cohort holds the rule's f + 1 attackers",
    )
    sleep: int = Field(
        0, ge=0, description="upload honestly for the first k rounds with attackers in the cohort"
    )


def nnm_centre(pool: Tensor) -> Tensor:
    """The coordinate-wise median of the NNM-mixed honest rows (f = ⌊(n − 1)/2⌋), over the
    finite ones: an honest client's non-finite upload is the server's to reject, and NNM's
    distances are defined on finite rows only."""
    finite = pool[torch.isfinite(pool).all(dim=1)]
    n = finite.shape[0]
    if n < 2:
        return coordinate_median(finite if n else pool)
    mixed = nnm(finite.to(W), default_f(None, n))
    return coordinate_median(mixed).to(pool.dtype)


def turned(b: Tensor, cosine: float, noise: Tensor) -> Tensor:
    """v = κ·b + √(1 − κ²)·w, w the unit of ``noise`` projected off the unit ``b``
    (float64); b itself when κ = 1 or no orthogonal direction is left."""
    if cosine >= 1.0:
        return b
    g = noise.to(W) - (noise.to(W) @ b) * b
    w = unit(g)
    if not bool(w.any()):
        return b
    return cosine * b + math.sqrt(max(1.0 - cosine * cosine, 0.0)) * w


@ATTACKS.register("quiet", tags=["kind=update", "omniscient", "needs_rule"])
class Quiet(CohortAttack):
    """The quiet attacks as one family with centre, direction, placement, spread and
    timing as parameters, for a search (module docstring).

    :mod:`fedshield.search.attack_search` tunes them against a defense."""

    params_schema = QuietParams
    needs_rule = True
    centre: str
    direction: str
    cosine: float
    h: float
    tau: float | None
    spread: str
    j: float
    margin: float
    timing: str
    sleep: int

    def __init__(self, **params: Any) -> None:
        super().__init__(**params)
        #: rounds with attackers in the cohort seen so far (the sleeper's clock)
        self.seen = 0
        #: whether the last call attacked; r and what set it (None before, or when honest)
        self.last_attacked: bool | None = None
        self.last_radius: float | None = None
        self.last_source: str | None = None

    def state_dict(self) -> dict[str, Any]:
        return {"seen": self.seen}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.seen = int(state.get("seen", 0))

    def forget(self) -> None:
        self.last_attacked = self.last_radius = self.last_source = None

    def attacks_now(self, mask: Tensor, cohort: int, context: Ctx) -> bool:
        self.seen += 1
        if self.seen <= self.sleep:
            return False
        return self.timing == "always" or int(mask.sum()) >= winning_count(context, cohort)

    def craft(self, updates: Tensor, mask: Tensor, generator: Rng, context: Ctx) -> Tensor:
        cohort = context.cohort if context is not None and context.cohort else updates.shape[0]
        self.last_attacked = self.attacks_now(mask, cohort, context)
        if not self.last_attacked:
            return updates.clone()
        pool = honest_pool(updates, mask)
        centre = (
            nnm_centre(pool) if self.centre == "nnm" else honest_centre(pool, self.centre, context)
        )
        f, d = int(mask.sum()), updates.shape[1]
        device = generator.device if generator is not None else updates.device
        noise = None
        if self.spread == "simplex":  # drawn first, as stealth's evade draws it
            noise = torch.randn((f, d), generator=generator, dtype=W, device=device)
        mean = pool.to(W).mean(dim=0)
        b = unit(mean) if self.direction == "mean" else unit(torch.sign(mean))
        if self.cosine < 1.0:
            turn = torch.randn((d,), generator=generator, dtype=W, device=device)
            b = turned(b, self.cosine, turn.to(b.device))
        r = self.radius(pool, centre, b, context)
        if noise is not None:
            placed = evading_placement(pool, centre, b, self.h * r, noise, context, self.margin)
            if placed is not None:
                return with_rows(updates, mask, to_dtype(placed[0], updates.dtype))
        row = to_dtype(centre.to(W) - (self.h * r) * b, pool.dtype)
        if self.spread != "own" or f < 2:
            return with_rows(updates, mask, row)
        own = updates[mask].to(W)
        rows = row.to(W) + self.j * (own - own.mean(dim=0))
        return with_rows(updates, mask, to_dtype(rows, updates.dtype))

    def radius(self, pool: Tensor, centre: Tensor, v: Tensor, context: Ctx) -> float:
        """r of eq. (1) along −v, recording what set it."""
        self.last_radius, self.last_source = hug_radius(pool, centre, v, self.tau, context)
        return self.last_radius


__all__ = ["Quiet", "QuietParams", "nnm_centre", "turned"]
