"""Min-Max and Min-Sum (Shejwalkar & Houmansadr, "Manipulating the Byzantine", NDSS 2021).

Shejwalkar & Houmansadr (NDSS 2021; the DRAG paper's Min-Max/Min-Sum, Sec. I-A): every attacker
uploads the same ∇^m = ḡ + γ∇^p, ḡ the mean benign update and ∇^p ∈ {unit_vec: −ḡ/‖ḡ‖, std:
−std(g), sign: −sign(ḡ)}. γ is the largest value (to τ) that keeps ∇^m inside the benign cloud:

* Min-Max: max_i ‖∇^m − g_i‖² ≤ max_{i,j} ‖g_i − g_j‖²
* Min-Sum: Σ_i ‖∇^m − g_i‖² ≤ max_i Σ_j ‖g_i − g_j‖²

found by the authors' halving search (:func:`halving_search`). The authors' released code
compares squared distances, as we do, and uses min_i instead of max_i in the Min-Sum
bound; the paper's equation says max_i, our default. ``bound="min"``
reproduces the code.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Literal

import torch
from pydantic import Field, ValidationInfo, field_validator
from pydantic_core import PydanticCustomError
from torch import Tensor

from fedshield.attacks._common import CohortAttack, Ctx, Rng, coord_std, honest_pool, with_rows
from fedshield.attacks.base import ATTACKS
from fedshield.core.params import Params

VECTORS = ("unit_vec", "std", "sign")
RULES = ("min_max", "min_sum")
BOUNDS = ("max", "min")


def perturbation(benign: Tensor, vector: str) -> Tensor:
    """∇^p of Shejwalkar & Houmansadr for the ``[n, d]`` benign rows (always pointing away from
    ḡ)."""
    mean = benign.mean(dim=0)
    if vector == "unit_vec":
        norm = torch.linalg.vector_norm(mean)
        # The reference divides by ‖ḡ‖ unguarded (NaN for ḡ = 0); a zero direction instead
        # makes ∇^m = ḡ, the only sensible "unit vector" of nothing.
        return -mean / norm if bool(norm > 0) else torch.zeros_like(mean)
    if vector == "sign":
        return -torch.sign(mean)
    if vector == "std":
        return -coord_std(benign)
    raise ValueError(f"vector must be one of {VECTORS}, got {vector!r}")


def halving_search(
    passes: Callable[[float], bool], gamma_init: float = 10.0, tau: float = 1e-5
) -> float:
    """The NDSS'21 reference search, step for step (their ``lamda``/``lamda_fail``/
    ``lamda_succ``): γ = γ_init, step = γ_init/2, γ_succ = 0; while |γ_succ − γ| > τ: on
    success γ_succ = γ, γ += step, else γ −= step; step /= 2. Returns γ_succ.

    For a feasible set [0, γ*] the result satisfies γ_succ ≤ γ* < γ_succ + 2τ, except that
    γ_succ never exceeds the ceiling 2γ_init (minus the last step): if even γ_init passes,
    the search climbs γ_init + γ_init/2 + ... and stops just below 2γ_init. If nothing
    passes it returns 0 (∇^m = ḡ).
    """
    gamma, step, succ = gamma_init, gamma_init / 2, 0.0
    while abs(succ - gamma) > tau:
        if passes(gamma):
            succ = gamma
            gamma += step
        else:
            gamma -= step
        step /= 2
    return succ


def find_gamma(
    benign: Tensor,
    direction: Tensor,
    rule: str = "min_max",
    *,
    gamma_init: float = 10.0,
    tau: float = 1e-5,
    bound: str = "max",
) -> float:
    """γ for ∇^m = ḡ + γ·``direction`` under ``rule`` ("min_max" or "min_sum"), a pure
    function of the ``[n, d]`` benign rows. ``bound`` picks max_i (paper, default) or min_i
    (authors' code) in the Min-Sum threshold; Min-Max ignores it.

    Why not evaluate ‖∇^m − g_i‖² afresh for every γ as the reference does: with D_i =
    g_i − ḡ it equals a_i − 2γ b_i + γ² c (a_i = ‖D_i‖², b_i = ⟨D_i, ∇^p⟩, c = ‖∇^p‖²),
    so one O(nd) pass gives the coefficients and each of the ~20 search steps costs O(n).
    The pairwise bound uses the Gram matrix of the centred rows (less cancellation than
    raw rows). Coefficients are reduced in the input dtype and searched in float64.
    """
    if rule not in RULES or bound not in BOUNDS:
        raise ValueError(f"rule must be in {RULES} and bound in {BOUNDS}, got {rule!r}, {bound!r}")
    centred = benign - benign.mean(dim=0)
    a = (centred * centred).sum(dim=1).double()
    b = (centred @ direction).double()
    c = float((direction * direction).sum())
    gram = (centred @ centred.T).double()
    pairwise = (a[:, None] + a[None, :] - 2 * gram).clamp_min(0)

    if rule == "min_max":
        threshold = float(pairwise.max())

        def passes(g: float) -> bool:
            return float((a - 2 * g * b + g * g * c).max()) <= threshold
    else:
        scores = pairwise.sum(dim=1)
        threshold = float(scores.max() if bound == "max" else scores.min())
        a_sum, b_sum, n = float(a.sum()), float(b.sum()), a.numel()

        def passes(g: float) -> bool:
            return a_sum - 2 * g * b_sum + n * g * g * c <= threshold

    return halving_search(passes, gamma_init, tau)


class MinMaxParams(Params):
    vector: Literal["unit_vec", "std", "sign"] = Field(
        "std", description="perturbation ∇^p: −ḡ/‖ḡ‖ (unit_vec), −std(g) (std) or −sign(ḡ)"
    )
    gamma_init: float = Field(10.0, gt=0.0, description="first γ of the halving search")
    tau: float = Field(1e-5, gt=0.0, description="halving search tolerance τ (< gamma_init)")

    @field_validator("tau")
    @classmethod
    def _tau_below_gamma_init(cls, tau: float, info: ValidationInfo) -> float:
        gamma_init = info.data.get("gamma_init")  # absent when gamma_init itself failed
        if gamma_init is not None and tau >= gamma_init:
            raise PydanticCustomError("tau_range", "must be < gamma_init ({g})", {"g": gamma_init})
        return tau


class MinSumParams(MinMaxParams):
    bound: Literal["max", "min"] = Field(
        "max", description="threshold max_i (paper) or min_i (authors' released code)"
    )


class _GammaAttack(CohortAttack):
    rule = "min_max"
    needs_own_update = False  # omniscient: built from the benign rows only
    vector: str
    gamma_init: float
    tau: float
    bound: str = "max"

    #: γ found in the last call (None before the first call or with no attacker)
    last_gamma: float | None = None

    def forget(self) -> None:
        self.last_gamma = None

    def craft(self, updates: Tensor, mask: Tensor, generator: Rng, context: Ctx) -> Tensor:
        pool = honest_pool(updates, mask)
        direction = perturbation(pool, self.vector)
        gamma = find_gamma(
            pool, direction, self.rule, gamma_init=self.gamma_init, tau=self.tau, bound=self.bound
        )
        self.last_gamma = gamma
        return with_rows(updates, mask, pool.mean(dim=0) + gamma * direction)


@ATTACKS.register("min_max", tags=["kind=update", "omniscient"])
class MinMax(_GammaAttack):
    """Min-Max: upload ḡ + γ∇^p, γ max with max_i ‖∇^m − g_i‖ ≤ max_ij ‖g_i − g_j‖.

    Shejwalkar & Houmansadr, NDSS'21 (the DRAG paper's ref. [26]). ``vector`` ∈
    unit_vec/std/sign (default std), ``gamma_init`` = 10, ``tau`` = 1e-5. The γ found is
    kept in ``last_gamma``."""

    params_schema = MinMaxParams
    rule = "min_max"


@ATTACKS.register("min_sum", tags=["kind=update", "omniscient"])
class MinSum(_GammaAttack):
    """Min-Sum: upload ḡ + γ∇^p, γ max with Σ_i ‖∇^m − g_i‖² ≤ max_i Σ_j ‖g_i − g_j‖².

    Shejwalkar & Houmansadr, NDSS'21 (the DRAG paper's ref. [26]). ``bound="min"`` uses min_i,
    as the authors' released code does."""

    params_schema = MinSumParams
    rule = "min_sum"
