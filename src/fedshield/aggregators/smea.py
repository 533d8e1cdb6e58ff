"""Smallest Maximum Eigenvalue Averaging, SMEA (Allouah, Guerraoui, Gupta, Pinot & Stephan,
"On the Privacy-Robustness-Utility Trilemma in Distributed Learning", ICML 2023), as ByzFL
0.0.11's ``SMEA(f)``.

SMEA_f = mean of K*,  K* ∈ argmin_{|K| = S − f} λ_max(Σ_K),  Σ_K the empirical covariance of
the rows in K; ties go to the lexicographically first K (ByzFL keeps the first strict
minimum of ``itertools.combinations``; here eigenvalues within round-off of the minimum
count as ties, :func:`smea_exact`). Needs 2f < S. ``agg/eigenvalue`` is λ_max(Σ_K*) of the
chosen subset (Σ_K normalised by |K|).

**Eigenvalues.** ``power_iters`` unset (the paper): exact, λ_max(Σ_K) from the |K| × |K|
centred Gram matrix J G_K J of the subset (:mod:`fedshield.aggregators._spectral`), batched
``eigvalsh`` over the subsets — no pass over d per subset. ``power_iters = k``: k power
steps from a random unit vector per subset, drawn from a generator seeded with ``seed`` in
enumeration order — ByzFL's estimator (k = 1, ``torch.randn`` from the global generator);
with the same stream it is ByzFL's result (one GEMV over the rows per subset).

**Cost.** The search is combinatorial (C(S, f) subsets, as in the paper and ByzFL). Beyond
``max_subsets`` the rule degrades to the spectral filter (f times, drop the row with the
largest projection on the top eigenvector of the remaining rows' covariance), reports
``agg/exact = 0`` and logs it once. Weights play no part; rows holding NaN/Inf are dropped
first (``agg/nonfinite``), S is then the number of finite rows.
"""

from __future__ import annotations

import itertools
import logging
import math

import torch
from pydantic import Field
from torch import Tensor

from fedshield.aggregators._majority import HonestMajorityRule
from fedshield.aggregators._ops import combine_rows
from fedshield.aggregators._spectral import PowerMethodParams, RobustGram, random_unit
from fedshield.aggregators.base import AGGREGATORS, Diagnostics, f_field, normalised_weights

log = logging.getLogger("fedshield")

#: Subsets scored per batched eigvalsh call.
_CHUNK = 4096


class SMEAParams(PowerMethodParams):
    f: int | None = f_field(
        "number of Byzantine rows tolerated: the mean of the S − f rows whose covariance "
        "has the smallest top eigenvalue (needs 2f < S)"
    )
    max_subsets: int = Field(
        100_000,
        ge=1,
        description="the most subsets searched exactly; beyond, the spectral filter "
        "approximation (agg/exact = 0)",
    )


def _centre_batch(gs: Tensor) -> Tensor:
    """J G J for a batch ``[B, m, m]`` of Gram matrices (J = I − 11ᵀ/m)."""
    rm = gs.mean(dim=2, keepdim=True)
    return gs - rm - rm.transpose(1, 2) + gs.mean(dim=(1, 2), keepdim=True)


def smea_exact(g: Tensor, m: int) -> tuple[list[int], float]:
    """The first subset of ``m`` rows with the smallest λ_max of J G_K J, and that λ.

    Eigenvalues equal in exact arithmetic (duplicated rows, integer grids) come out of
    ``eigvalsh`` a few ulps apart, in either order: values within the solver's backward
    error, 8·m·ε·max_i G_ii, of the minimum count as ties, so the lexicographically first
    subset wins as in ByzFL (which compares exact-enough power estimates in order).
    """
    lams: list[Tensor] = []
    combos = list(itertools.combinations(range(g.shape[0]), m))
    for lo in range(0, len(combos), _CHUNK):
        idx = torch.tensor(combos[lo : lo + _CHUNK], device=g.device)
        gs = g[idx[:, :, None], idx[:, None, :]]
        lams.append(torch.linalg.eigvalsh(_centre_batch(gs))[:, -1])
    lam = torch.cat(lams)
    tol = 8 * m * torch.finfo(g.dtype).eps * float(g.diagonal().abs().max())
    i = int((lam <= lam.min() + tol).to(torch.int8).argmax())  # the first near-minimum
    return list(combos[i]), float(lam[i])


def smea_power(rg: RobustGram, m: int, iters: int, seed: int) -> tuple[list[int], float]:
    """ByzFL's search: per subset in order, λ ≈ ‖Σ_K v‖ after ``iters`` power steps."""
    gen = torch.Generator().manual_seed(seed)
    best_lam, best = math.inf, list(range(m))
    for combo in itertools.combinations(range(rg.g.shape[0]), m):
        idx = torch.tensor(combo, device=rg.g.device)
        gc = _centre_batch(rg.g[idx][:, idx][None])[0]
        q = rg.projections(random_unit(gen, rg.x.shape[1], rg.x.device))[idx]
        p = q - q.mean()  # ⟨x_i − μ_K, v⟩
        lam = 0.0
        for _ in range(iters):
            lam = float((p @ gc @ p).clamp_min(0.0).sqrt())  # ‖Σ_i (x_i − μ_K) p_i‖
            if lam == 0.0:
                break
            p = gc @ p / lam
        if lam < best_lam:
            best_lam, best = lam, list(combo)
    return best, best_lam


def spectral_filter(g: Tensor, f: int) -> tuple[list[int], float]:
    """f times, drop the row with the largest projection on the top covariance direction."""
    keep = list(range(g.shape[0]))
    lam = 0.0
    for step in range(f + 1):
        idx = torch.tensor(keep, device=g.device)
        gc = _centre_batch(g[idx][:, idx][None])[0]
        evals, evecs = torch.linalg.eigh(gc)
        lam = float(evals[-1])
        if step == f:
            break
        proj = (gc @ evecs[:, -1]).abs()  # ∝ |⟨x_i − μ, v⟩|
        keep.pop(int(proj.argmax()))
    return keep, lam


@AGGREGATORS.register("smea", tags=["robust", "reference_free", "min_clients"])
class SMEA(HonestMajorityRule):
    """SMEA (Allouah 2023): the mean of the S − f rows whose covariance has the smallest
    top eigenvalue."""

    params_schema = SMEAParams
    power_iters: int | None
    seed: int
    max_subsets: int
    _warned = False

    def __init__(
        self,
        f: int | None = None,
        power_iters: int | None = None,
        seed: int = 0,
        max_subsets: int = 100_000,
    ) -> None:
        self._configure(f=f, power_iters=power_iters, seed=seed, max_subsets=max_subsets)

    def aggregate(
        self, updates: Tensor, weights: Tensor | None = None, *, reference: Tensor | None = None
    ) -> tuple[Tensor, Diagnostics]:
        normalised_weights(updates, weights)  # weights play no part
        rg = RobustGram("smea", updates)
        s = rg.keep.numel()
        f = self.checked_f(s, rg.dropped)
        exact = math.comb(s, f) <= self.max_subsets
        if not exact:
            chosen, lam = spectral_filter(rg.g, f)
            if not SMEA._warned:
                SMEA._warned = True
                log.warning(
                    "smea: C(%d, %d) = %d subsets exceed max_subsets=%d; using the spectral "
                    "filter approximation (agg/exact = 0)",
                    s,
                    f,
                    math.comb(s, f),
                    self.max_subsets,
                )
        elif self.power_iters is None:
            chosen, lam = smea_exact(rg.g, s - f)
        else:
            chosen, lam = smea_power(rg, s - f, self.power_iters, self.seed)
        idx = rg.keep[torch.tensor(chosen, dtype=torch.long, device=rg.keep.device)]
        coef = torch.zeros(updates.shape[0], dtype=rg.g.dtype, device=rg.g.device)
        coef[idx] = 1.0 / len(chosen)
        skip = None
        if rg.dropped:
            skip = torch.ones(updates.shape[0], dtype=torch.bool, device=coef.device)
            skip[rg.keep] = False
        out = combine_rows(coef, updates, skip=skip)
        return out, {
            "agg/num_selected": float(len(chosen)),
            "agg/eigenvalue": lam / len(chosen),  # λ_max(Σ_K): J G_K J is |K|·Σ_K
            "agg/exact": float(exact),
            "agg/nonfinite": float(rg.dropped),
        }
