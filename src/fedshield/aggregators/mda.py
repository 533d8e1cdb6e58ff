"""Minimum Diameter Averaging, MDA (El Mhamdi, Guerraoui, Guirguis, Hoang & Rouault, PODC
2020), as ByzFL 0.0.11's ``MDA(f)``.

MDA_f = (1/(S − f)) Σ_{i ∈ K*} x_i,  K* ∈ argmin_{|K| = S − f} max_{i, j ∈ K} ‖x_i − x_j‖,

ties going to the lexicographically first K (ByzFL enumerates ``itertools.combinations``
and keeps the first strict minimum). Needs 2f < S.

**Exact without enumerating the C(S, f) subsets.** Keeping K means removing R = the other f
rows, and K has diameter ≤ t exactly when R touches every pair farther apart than t: R is
a vertex cover of size ≤ f of the graph H_t of those pairs. The optimal diameter t* is the
smallest pair distance t for which H_t has such a cover (a binary search over the sorted
distances), decided by a bounded search tree (Buss's rule: a vertex of degree > k must be
in the cover; else branch on the highest-degree vertex v: v in the cover, or all of its
neighbours are), O(2^f) nodes at worst where enumeration is O(S^f). The lexicographically
first K of diameter t* is then built greedily: row 0, 1, … is kept whenever the rest can
still be covered. At S = 40, f = 8 this is milliseconds where ByzFL's enumeration would
visit 7.7·10⁷ subsets.

The search stops after ``_MAX_NODES`` nodes (an adversarial geometry at large f); the rule
then degrades to the greedy approximation (repeatedly drop the endpoint of the current
diameter whose removal leaves the smaller diameter), says so in ``agg/exact = 0`` and logs
it once. Distances come from the float64 Gram pass with cancellation repair
(``_ops.pairwise_sq_dists``); distances within their round-off (a relative 2^-26) of a
smaller one are made equal to it first (``_ops.snap_ties``), so exact ties — 4.000000000000001
against 4.0 for two pairs both 2 apart — go to the first subset as in ByzFL, not to
whichever the Gram pass rounded down. Weights play no part; rows holding NaN/Inf are dropped first
(``agg/nonfinite``), S is then the number of finite rows.
"""

from __future__ import annotations

import logging

import torch
from torch import Tensor

from fedshield.aggregators._majority import HonestMajorityRule
from fedshield.aggregators._ops import combine_rows, pairwise_sq_dists, snap_ties
from fedshield.aggregators.base import (
    AGGREGATORS,
    Diagnostics,
    f_params,
    normalised_weights,
)

log = logging.getLogger("fedshield")

#: Search-tree nodes per aggregation before MDA falls back to the greedy approximation.
_MAX_NODES = 200_000


MDAParams = f_params(
    "MDAParams",
    "number of Byzantine rows tolerated: the mean of the S − f rows of smallest "
    "diameter (needs 2f < S)",
    __name__,
)


class _Budget(Exception):
    """The search used up its node budget."""


class _CoverSearch:
    """Vertex covers of the graph ``adj`` (bitsets), with a node budget."""

    def __init__(self, adj: list[int]) -> None:
        self.adj = adj
        self.nodes = 0

    def coverable(self, alive: int, k: int) -> bool:
        """True when the edges among the vertices in ``alive`` have a cover of size ≤ k."""
        self.nodes += 1
        if self.nodes > _MAX_NODES:
            raise _Budget
        best, best_deg, edges2 = -1, 0, 0
        rest = alive
        while rest:
            v = (rest & -rest).bit_length() - 1
            rest &= rest - 1
            deg = (self.adj[v] & alive).bit_count()
            edges2 += deg
            if deg > best_deg:
                best, best_deg = v, deg
        if best_deg == 0:
            return True
        if k <= 0 or edges2 // 2 > k * best_deg:  # k vertices cover at most k·Δ edges
            return False
        without = alive & ~(1 << best)
        if best_deg > k:  # Buss: v must be in the cover (else its > k neighbours are)
            return self.coverable(without, k - 1)
        if self.coverable(without, k - 1):
            return True
        nbrs = self.adj[best] & alive
        return self.coverable(without & ~nbrs, k - best_deg)


def _graph(d2: Tensor, t: float) -> list[int]:
    far = (d2 > t).cpu().tolist()
    return [sum(1 << j for j, b in enumerate(row) if b) for row in far]


def mda_subset(d2: Tensor, f: int) -> list[int]:
    """The lexicographically first S − f rows of minimum diameter (``d2``: [S, S] squared
    distances); raises :class:`_Budget` when the search is too large."""
    s = d2.shape[0]
    everyone = (1 << s) - 1
    cand = torch.unique(d2.triu(1)[torch.triu(torch.ones_like(d2, dtype=torch.bool), 1)])
    if cand.numel() == 0:
        return list(range(s))
    cand = torch.cat([cand.new_zeros(1), cand]).unique()
    lo, hi = 0, cand.numel() - 1  # cand[hi] (the largest distance) is always feasible
    while lo < hi:
        mid = (lo + hi) // 2
        if _CoverSearch(_graph(d2, float(cand[mid]))).coverable(everyone, f):
            hi = mid
        else:
            lo = mid + 1
    search = _CoverSearch(_graph(d2, float(cand[lo])))
    alive, k = everyone, f
    kept: list[int] = []
    for v in range(s):
        if len(kept) == s - f:
            break
        if not (alive >> v) & 1:
            continue
        nbrs = search.adj[v] & alive
        need = nbrs.bit_count()
        rest = alive & ~nbrs & ~(1 << v)
        if need <= k and search.coverable(rest, k - need):
            kept.append(v)  # keep v: its far neighbours are removed
            alive, k = rest, k - need
        else:
            alive, k = alive & ~(1 << v), k - 1
    return kept


def greedy_subset(d2: Tensor, f: int) -> list[int]:
    """The greedy approximation: f times, drop the endpoint of the current diameter whose
    removal leaves the smaller diameter."""
    keep = list(range(d2.shape[0]))
    for _ in range(f):
        sub = d2[keep][:, keep]
        flat = int(sub.argmax())
        i, j = divmod(flat, len(keep))
        after = []
        for drop in (i, j):
            rest = [a for a in range(len(keep)) if a != drop]
            after.append(float(sub[rest][:, rest].max()))
        keep.pop(i if after[0] <= after[1] else j)
    return keep


@AGGREGATORS.register("mda", tags=["robust", "reference_free", "min_clients"])
class MDA(HonestMajorityRule):
    """MDA (El Mhamdi 2020): the mean of the S − f rows whose diameter is smallest."""

    params_schema = MDAParams
    _warned = False

    def aggregate(
        self, updates: Tensor, weights: Tensor | None = None, *, reference: Tensor | None = None
    ) -> tuple[Tensor, Diagnostics]:
        normalised_weights(updates, weights)  # weights play no part
        d2, keep = pairwise_sq_dists(updates)
        d2 = snap_ties(d2)  # equal distances compare equal: the first subset wins ties
        s = keep.numel()
        dropped = updates.shape[0] - s
        f = self.checked_f(s, dropped)
        exact = True
        try:
            chosen = mda_subset(d2, f)
        except _Budget:
            exact = False
            chosen = greedy_subset(d2, f)
            if not MDA._warned:
                MDA._warned = True
                log.warning(
                    "mda: the exact search for the minimum-diameter subset (S=%d, f=%d) "
                    "exceeded %d nodes; using the greedy approximation (agg/exact = 0)",
                    s,
                    f,
                    _MAX_NODES,
                )
        idx = keep[torch.tensor(chosen, dtype=torch.long, device=keep.device)]
        coef = torch.zeros(updates.shape[0], dtype=d2.dtype, device=updates.device)
        coef[idx] = 1.0 / len(chosen)
        skip = None
        if dropped:
            skip = torch.ones(updates.shape[0], dtype=torch.bool, device=updates.device)
            skip[keep] = False
        out = combine_rows(coef, updates, skip=skip)
        return out, {
            "agg/num_selected": float(len(chosen)),
            "agg/diameter": float(d2[chosen][:, chosen].max().sqrt()),
            "agg/exact": float(exact),
            "agg/nonfinite": float(dropped),
        }
