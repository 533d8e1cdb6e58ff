"""``stealth``: colluding attackers who "hug" the defense's radius (docs/security.md §6b).

Every attacker of the cohort uploads the same row

    x = c − h · r · ū                                                              (1)

c the centre of the honest rows (the coordinate-wise median by default; their mean, or the
configured rule's own output on them), ū the unit mean of the honest rows, h ∈ (0, 1] the
placement, and r the radius the server's defenses publish along −ū from c: the smallest of
the radii of :mod:`fedshield.attacks._published` (reputation's τ × the median honest
distance D from c, the step bound's κ × its history read as a distance, a clipping radius).
With ``tau`` set, r = τ · D whatever is published — the attack of the quiet-attacker measurement
(docs/security.md §6b) (x = med − 0.9·τ·med_j‖h_j − med‖·ū). With nothing published and ``tau``
unset, r = 3 · D (reputation's default τ).

The rows stay inside every published radius, so no defense that thresholds on them fires
(no suspension, no clipped step), while each round's aggregate is pulled against the honest
direction. ``jitter`` > 0 adds seeded noise of norm about ``jitter`` · D to each copy, so
the rows are not bit-identical (a duplicate check would see identical rows at once).

``evade = true`` reads the two round defenses that judge rows by something other than a
radius (:func:`fedshield.attacks._published.evading_rows`): the f rows are

    x_i = c − α·ū + q·v_i,   α² + q² = (h·r)²                                     (2)

v_i the unit vertices of a regular simplex in seeded directions orthogonal to c and to the
honest rows (so the rows' mean stays c − α·ū), with the largest pull α at which
``collusion`` sees no two rows nearer than (1 + margin) × ρ × its scale and
``consistency`` sees every row's offset at cosine ≥ −γ·(1 − margin) with the predicted
step; with neither configured, (2) is (1).
"""

from __future__ import annotations

import math
from typing import Literal

import torch
from pydantic import Field, model_validator
from torch import Tensor

from fedshield.aggregators._ops import to_dtype
from fedshield.aggregators.median import coordinate_median
from fedshield.attacks._common import CohortAttack, Ctx, Rng, honest_pool, with_rows
from fedshield.attacks._oracle import RuleOracle
from fedshield.attacks._published import (
    MARGIN,
    collusion_rho,
    consistency_gamma,
    evading_rows,
    radii,
    side_directions,
    spread,
    unit,
)
from fedshield.attacks.base import ATTACKS
from fedshield.core.params import Params

#: r = DEFAULT_TAU · D when the server publishes no radius (reputation's default τ).
DEFAULT_TAU = 3.0


#: ``tau`` of the attacks that read the published radius (stealth, quiet).
TAU = Field(
    None,
    gt=0.0,
    le=1e6,
    description="radius as τ × the median honest distance from the centre; unset: the "
    "tightest radius the server's defenses publish (3 × that distance when none)",
)


class StealthParams(Params):
    h: float = Field(
        0.9, gt=0.0, le=1.0, description="placement h ∈ (0, 1]: the fraction of the radius used"
    )
    tau: float | None = TAU
    centre: Literal["median", "mean", "rule"] = Field(
        "median",
        description="centre c of the honest rows: coordinate-wise median, mean, or the "
        "configured rule's output on them",
    )
    jitter: float = Field(
        0.0,
        ge=0.0,
        le=1.0,
        description="seeded noise of norm ≈ jitter × the median honest distance on each copy",
    )
    evade: bool = Field(
        False,
        description="read collusion's ρ and consistency's γ: the rows spread on a seeded "
        "simplex just past collusion's test, turned sideways until consistency's cosine "
        "passes, at the same distance h·r from the centre",
    )
    margin: float = Field(
        MARGIN,
        ge=0.0,
        le=0.5,
        description="with evade: the copies (1 + margin) × collusion's threshold apart, "
        "cosine ≥ −γ·(1 − margin)",
    )

    @model_validator(mode="after")
    def _one_spread(self) -> StealthParams:
        # Both would spread the copies; evade's spread is the one chosen from the defenses.
        if self.evade and self.jitter > 0.0:
            raise ValueError("evade = true sets the copies' spread: leave jitter at 0")
        return self


def honest_centre(pool: Tensor, how: str, context: Ctx) -> Tensor:
    """c of eq. (1): the coordinate-wise median, the mean, or the configured rule run on
    the honest rows alone (the median when it cannot run on them)."""
    if how == "mean":
        return pool.to(torch.float64).mean(dim=0).to(pool.dtype)
    if how == "rule":
        out = RuleOracle(context, stand_in=pool.mean(dim=0))(pool)
        if out is not None and bool(torch.isfinite(out).all()):
            return out.to(pool.dtype)
    return coordinate_median(pool)


def hug_radius(
    pool: Tensor, centre: Tensor, v: Tensor, tau: float | None, context: Ctx
) -> tuple[float, str]:
    """The radius r of eq. (1) along −v from ``centre`` and what set it: τ × the median
    honest distance D when ``tau`` is set, else the smallest radius the server's defenses
    publish (:func:`fedshield.attacks._published.radii`), else DEFAULT_TAU × D."""
    dist = spread(pool, centre)
    if tau is not None:
        return tau * dist, "tau"
    published = radii(context, pool, centre, v)
    if not published:
        return DEFAULT_TAU * dist, "default"
    source = min(published, key=lambda k: published[k])
    return published[source], source


def stealth_row(pool: Tensor, centre: Tensor, h: float, radius: float) -> Tensor:
    """Eq. (1), in float64 and clamped to ``pool``'s finite range: c − h·r·ū."""
    u = unit(pool.to(torch.float64).mean(dim=0))
    return to_dtype(centre.to(torch.float64) - (h * radius) * u, pool.dtype)


def evading_placement(
    pool: Tensor,
    centre: Tensor,
    u: Tensor,
    radius: float,
    noise: Tensor,
    context: Ctx,
    margin: float,
) -> tuple[Tensor, float, float] | None:
    """Eq. (2)'s ``[f, d]`` rows at distance ``radius`` from c, pulled along −u, with α
    and q (:func:`fedshield.attacks._published.evading_rows`), the simplex's directions
    from the seeded ``noise`` (``[f, d]``); None when d leaves no room beside the honest
    rows."""
    span = torch.cat([centre.to(torch.float64)[None], pool.to(torch.float64)])
    sides = side_directions(span, noise.shape[0], noise.to(span.device))
    if sides is None:
        return None
    return evading_rows(
        pool, centre, u, radius, sides, collusion_rho(context), consistency_gamma(context), margin
    )


@ATTACKS.register("stealth", tags=["kind=update", "omniscient", "needs_rule"])
class Stealth(CohortAttack):
    """Colluding rows at a fraction h of the defense's published radius from the honest
    centre, opposite the honest mean (the "hug" of docs/security.md §6b).

    Uploads x = c − h·r·ū (module docstring), r read from the configured server's round
    defenses and rule (``tau`` set: r = τ × the median honest distance from c)."""

    params_schema = StealthParams
    needs_own_update = False
    needs_rule = True
    h: float
    tau: float | None
    centre: str
    jitter: float
    evade: bool
    margin: float

    #: r used in the last call and the defense that set it ("tau" when given, "default"
    #: when nothing is published); None before the first call or with no attacker.
    last_radius: float | None = None
    last_source: str | None = None
    #: With ``evade``: α and q of eq. (2) in the last call (None before, without evade, or
    #: when d leaves no room beside the honest rows: then the rows are (1)'s copies).
    last_pull: float | None = None
    last_side: float | None = None

    def forget(self) -> None:
        self.last_radius = self.last_source = None
        self.last_pull = self.last_side = None

    def radius(self, pool: Tensor, centre: Tensor, context: Ctx) -> tuple[float, str]:
        """r of eq. (1) and what set it."""
        u = unit(pool.to(torch.float64).mean(dim=0))
        return hug_radius(pool, centre, u, self.tau, context)

    def craft(self, updates: Tensor, mask: Tensor, generator: Rng, context: Ctx) -> Tensor:
        pool = honest_pool(updates, mask)
        centre = honest_centre(pool, self.centre, context)
        r, source = self.radius(pool, centre, context)
        self.last_radius, self.last_source = r, source
        row = stealth_row(pool, centre, self.h, r)
        f, d = int(mask.sum()), updates.shape[1]
        if f == 0 or (self.jitter == 0.0 and not self.evade):
            return with_rows(updates, mask, row)
        device = generator.device if generator is not None else updates.device
        noise = torch.randn((f, d), generator=generator, dtype=torch.float64, device=device)
        if self.evade:
            return self.evading(updates, mask, pool, centre, r, noise, context)
        scale = self.jitter * spread(pool, centre) / math.sqrt(d)
        rows = row.to(torch.float64) + noise.to(updates.device) * scale
        return with_rows(updates, mask, to_dtype(rows, updates.dtype))

    def evading(
        self,
        updates: Tensor,
        mask: Tensor,
        pool: Tensor,
        centre: Tensor,
        r: float,
        noise: Tensor,
        context: Ctx,
    ) -> Tensor:
        """Eq. (2)'s rows (module docstring)."""
        u = unit(pool.to(torch.float64).mean(dim=0))
        placed = evading_placement(pool, centre, u, self.h * r, noise, context, self.margin)
        if placed is None:
            return with_rows(updates, mask, stealth_row(pool, centre, self.h, r))
        rows, alpha, q = placed
        self.last_pull, self.last_side = alpha, q
        return with_rows(updates, mask, to_dtype(rows, updates.dtype))


__all__ = [
    "DEFAULT_TAU", "TAU", "Stealth", "evading_placement", "honest_centre", "hug_radius",
    "stealth_row",
]  # fmt: skip
