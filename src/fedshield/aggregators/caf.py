"""Covariance-bound Agnostic Filter, CAF (Allouah, Guerraoui & Stephan, "Towards Trustworthy
Federated Learning with Untrusted Participants", ICML 2025), as ByzFL 0.0.11's ``CAF(f)``.

Start with weights c_i = 1 and, while Σ c_i > S − 2f:

1. μ_c = Σ c_i x_i / Σ c_i and Σ_c = Σ c_i (x_i − μ_c)(x_i − μ_c)ᵀ / Σ c_i;
2. (λ, v) = the top eigenpair of Σ_c;
3. τ_i = ⟨x_i − μ_c, v⟩², c_i ← c_i (1 − τ_i / max_j τ_j)   (the most aligned row drops to 0).

Return the μ_c with the smallest λ met. Needs 2f < S. With f = 0 the loop never runs and
the rule is the mean (ByzFL returns None there).

**Eigenpairs.** ``power_iters`` unset (the paper): the exact top eigenpair, from the S × S
matrix diag(√c) G_c diag(√c) / Σc (G_c: the Gram matrix of the x_i − μ_c, see
:mod:`fedshield.aggregators._spectral`): O(S³) per step, no pass over d. ``power_iters = k``:
k steps of the power method from a random unit vector drawn from a generator seeded with
``seed``, one fresh vector per loop step — ByzFL's estimator (k = 1, ``torch.randn`` from
the global generator); with the same stream it is ByzFL's result. One GEMV over the rows
per step, the power steps then in Gram space.

Weights play no part (every c_i starts at 1, as in the paper). Rows holding NaN/Inf are
dropped first (``agg/nonfinite``); S is then the number of finite rows. The loop stops
early when the weighted covariance is 0 (every row equal, nothing left to filter), when a
step leaves every weight unchanged in float64 (ByzFL would loop for ever; ``agg/stalled``),
and after ``_MAX_STEPS`` steps (``agg/stalled``: see there).
"""

from __future__ import annotations

import math

import numpy as np
import torch
from torch import Tensor

from fedshield.aggregators._majority import HonestMajorityRule
from fedshield.aggregators._ops import combine_rows
from fedshield.aggregators._spectral import PowerMethodParams, RobustGram, random_unit
from fedshield.aggregators.base import AGGREGATORS, Diagnostics, f_field, normalised_weights

#: Steps before the filter stops (keeping the best μ_c so far, ``agg/stalled``). τ_max is
#: taken over every row, as in ByzFL, so a step need not zero a weight: once the extreme rows
#: have weight 0 the others shrink by (1 − τ_i/τ_max) a step, and no bound on the steps
#: follows from the rule: on 24 seeds of 13 Gaussian rows (d = 1, f = 6) ByzFL's filter ends
#: after 156–98,352 steps in 21, after 391,337 in one, and not within 10⁶ in two. The filter
#: stops at once where a step changes no weight in float64 (an outlier at 1e30: ByzFL's loop
#: never ends); this bound caps the work of the slow cases (0.05–0.3 ms a step at S = 13).
_MAX_STEPS = 100_000


class CAFParams(PowerMethodParams):
    f: int | None = f_field(
        "number of Byzantine rows tolerated: the filter stops once the weights sum to "
        "S − 2f (needs 2f < S)"
    )


def _centred(g: np.ndarray, a: np.ndarray) -> np.ndarray:
    """The Gram matrix of the rows x_i − Σ a_j x_j (Σ a = 1) from ``g`` (about any centre)."""
    ga = g @ a
    out: np.ndarray = g - ga[:, None] - ga[None, :] + a @ ga
    return out


def caf_weights(
    rg: RobustGram, f: int, power_iters: int | None, seed: int
) -> tuple[Tensor, dict[str, float]]:
    """``([k] float64 coefficients of the chosen μ_c over the kept rows, diagnostics)``.

    The loop runs on the host in numpy: its matrices are S × S, where torch's per-call
    overhead (~0.5 ms a step) would dominate a filter of 10⁴–10⁵ steps."""
    g = rg.g.cpu().numpy()
    k = g.shape[0]
    c = np.ones(k)
    gen = torch.Generator().manual_seed(seed) if power_iters is not None else None
    best_lam, best = math.inf, c / k
    steps, stalled = 0, False
    while c.sum() > k - 2 * f and steps < _MAX_STEPS:
        steps += 1
        total = c.sum()
        a = c / total
        gd = _centred(g, a)
        if power_iters is None:
            root = np.sqrt(c)
            evals, evecs = np.linalg.eigh(root[:, None] * gd * root[None, :] / total)
            lam = float(evals[-1])
            proj = gd @ (root * evecs[:, -1]) / math.sqrt(max(lam, 0.0) * total or 1.0)
        else:
            assert gen is not None
            q = rg.projections(random_unit(gen, rg.x.shape[1], rg.x.device)).cpu().numpy()
            proj = q - a @ q  # ⟨x_i − μ_c, v⟩
            lam = 0.0
            for _ in range(power_iters):
                w = c * proj / total  # Σ_c v = Σ_i w_i (x_i − μ_c)
                lam = math.sqrt(max(float(w @ gd @ w), 0.0))  # ‖Σ_c v‖
                if lam == 0.0:
                    break
                proj = gd @ w / lam  # ⟨x_i − μ_c, Σ_c v / ‖Σ_c v‖⟩
        if lam < best_lam:
            best_lam, best = lam, a
        tau = proj * proj
        tmax = tau.max()
        if not tmax > 0:  # a zero covariance: every weighted row is μ_c
            break
        nxt = c * (1.0 - tau / tmax)
        if np.array_equal(nxt, c):  # a fixed point in float64: the loop could never end
            stalled = True
            break
        c = nxt
    diag = {
        "agg/iterations": float(steps),
        "agg/eigenvalue": best_lam if steps else 0.0,
        "agg/stalled": float(stalled or steps >= _MAX_STEPS),
    }
    return torch.from_numpy(best).to(rg.g.device), diag


@AGGREGATORS.register("caf", tags=["robust", "reference_free", "min_clients"])
class CAF(HonestMajorityRule):
    """CAF (Allouah 2025): down-weight rows along the top covariance direction, keep the
    weighted mean whose covariance had the smallest top eigenvalue."""

    params_schema = CAFParams
    power_iters: int | None
    seed: int

    def __init__(self, f: int | None = None, power_iters: int | None = None, seed: int = 0):
        self._configure(f=f, power_iters=power_iters, seed=seed)

    def aggregate(
        self, updates: Tensor, weights: Tensor | None = None, *, reference: Tensor | None = None
    ) -> tuple[Tensor, Diagnostics]:
        normalised_weights(updates, weights)  # weights play no part
        rg = RobustGram("caf", updates)
        f = self.checked_f(rg.keep.numel(), rg.dropped)
        a, diag = caf_weights(rg, f, self.power_iters, self.seed)
        coef = torch.zeros(updates.shape[0], dtype=a.dtype, device=a.device)
        coef[rg.keep] = a
        skip = None
        if rg.dropped:
            skip = torch.ones(updates.shape[0], dtype=torch.bool, device=a.device)
            skip[rg.keep] = False
        out = combine_rows(coef, updates, skip=skip)
        return out, diag | {"agg/nonfinite": float(rg.dropped)}
