"""Divide-and-Conquer, DnC (Shejwalkar & Houmansadr, "Manipulating the Byzantine", NDSS 2021,
Algorithm 3).

Repeat ``niters`` times: draw ``sub_dim`` coordinates at random (all of them when d ≤
``sub_dim``), centre the rows' sub-vectors on their mean μ, take the top right singular
vector v of the centred [S, b] matrix, score every row by s_i = ⟨x_i − μ, v⟩², and keep the
S − ⌊c·f⌋ rows with the lowest scores (scores equal up to round-off, 2^-26 of the largest,
tie, and ties keep the lower index: the copies of a duplicated row are treated alike in
every draw, so the intersection drops one copy where Blades' union drops one, not both).
The rows kept in every iteration (the intersection,
as in the paper; Blades takes the union) are averaged. Defaults: Blades' ``sub_dim =
10000``, ``niters = 5``, ``c = 1``; f as the other Byzantine-count rules (2f < S).

The top singular direction comes from the S × S float64 Gram matrix of the centred
sub-vectors (its top eigenvector u gives s_i = σ² u_i²), so an iteration is one gather of
S × b values and an O(S²·b) product. The coordinates are drawn afresh every round from a
generator seeded by ``seed`` and the rows (:mod:`fedshield.aggregators._seeding`): the
rule stays a function of its input, whatever the row order. Should
the intersection be empty (only possible when niters·⌊c·f⌋ ≥ S), the last iteration's rows
are used (``agg/fallback = 1``). Weights play no part; rows holding NaN/Inf are dropped
first (``agg/nonfinite``).
"""

from __future__ import annotations

import torch
from pydantic import Field
from torch import Tensor

from fedshield.aggregators._majority import HonestMajorityRule
from fedshield.aggregators._ops import DIST_RTOL, W, combine_rows, row_sq_norms, snap_ties
from fedshield.aggregators._seeding import input_generator
from fedshield.aggregators.base import (
    AGGREGATORS,
    Diagnostics,
    f_field,
    normalised_weights,
)
from fedshield.core.params import Params


class DnCParams(Params):
    f: int | None = f_field(
        "number of Byzantine rows tolerated: each iteration removes the ⌊c·f⌋ rows of "
        "highest outlier score (needs 2f < S)"
    )
    niters: int = Field(5, ge=1, le=100, description="iterations (random coordinate draws)")
    sub_dim: int = Field(10_000, ge=1, description="coordinates drawn per iteration (b)")
    c: float = Field(1.0, gt=0.0, le=2.0, description="filtering fraction: ⌊c·f⌋ rows removed")
    seed: int = Field(0, ge=0, description="seed of the coordinate draws")


def dnc_keep(
    x: Tensor, rows: Tensor, removed: int, niters: int, sub_dim: int, gen: torch.Generator
) -> tuple[Tensor, bool]:
    """``(kept row indices, fell back)``: the rows kept in every iteration."""
    s, d = rows.numel(), x.shape[1]
    good = torch.ones(s, dtype=torch.bool, device=x.device)
    last = good
    for _ in range(niters):
        if d > sub_dim:
            cols = torch.randperm(d, generator=gen)[:sub_dim].sort().values.to(x.device)
            sub = x.index_select(1, cols).index_select(0, rows).to(W)
        else:
            sub = x.index_select(0, rows).to(W)
        centred = sub - sub.mean(dim=0)
        evals, evecs = torch.linalg.eigh(centred @ centred.T)
        scores = evals[-1].clamp_min(0.0) * evecs[:, -1].square()
        # equal scores (duplicated rows) tie exactly, so the stable sort drops the later copy
        # in every draw: round-off must not drop one copy here and the other there
        scores = snap_ties(scores, atol=DIST_RTOL * float(scores.max()))
        last = torch.zeros_like(good)
        last[scores.argsort(stable=True)[: s - removed]] = True
        good &= last
        if d <= sub_dim:  # every iteration would draw the same (all) coordinates
            break
    if not bool(good.any()):
        return rows[last], True
    return rows[good], False


@AGGREGATORS.register("dnc", tags=["robust", "reference_free", "min_clients"])
class DnC(HonestMajorityRule):
    """DnC (Shejwalkar 2021): drop the rows with the largest projections on the top singular
    direction of random coordinate subsets, average the rest."""

    params_schema = DnCParams
    niters: int
    sub_dim: int
    c: float
    seed: int

    def __init__(
        self,
        f: int | None = None,
        niters: int = 5,
        sub_dim: int = 10_000,
        c: float = 1.0,
        seed: int = 0,
    ) -> None:
        self._configure(f=f, niters=niters, sub_dim=sub_dim, c=c, seed=seed)

    def aggregate(
        self, updates: Tensor, weights: Tensor | None = None, *, reference: Tensor | None = None
    ) -> tuple[Tensor, Diagnostics]:
        normalised_weights(updates, weights)  # weights play no part
        sq = row_sq_norms(updates)
        ok = torch.isfinite(sq)
        rows = ok.nonzero().squeeze(1)
        s = rows.numel()
        dropped = updates.shape[0] - s
        f = self.checked_f(s, dropped)
        removed = min(int(self.c * f), s - 1)
        gen = input_generator(self.seed, sq, "dnc")
        kept, fell_back = dnc_keep(updates, rows, removed, self.niters, self.sub_dim, gen)
        coef = torch.zeros(updates.shape[0], dtype=W, device=updates.device)
        coef[kept] = 1.0 / kept.numel()
        out = combine_rows(coef, updates, skip=~ok if dropped else None)
        return out, {
            "agg/num_selected": float(kept.numel()),
            "agg/fallback": float(fell_back),
            "agg/nonfinite": float(dropped),
        }
