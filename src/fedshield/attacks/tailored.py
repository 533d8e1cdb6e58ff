"""``agr_tailored``: the AGR-tailored attack of Shejwalkar & Houmansadr (NDSS 2021,
"Manipulating the Byzantine", §IV-B), beside the AGR-agnostic Min-Max / Min-Sum.

Every attacker uploads ∇^m = ḡ + γ∇^p (ḡ the benign mean, ∇^p the perturbation of
:func:`fedshield.attacks.minmax.perturbation`: −ḡ/‖ḡ‖, −std or −sign(ḡ)), with γ chosen to
maximise the deviation ‖A(∇^m, …, ∇^m, g_{f+1}, …, g_n) − ḡ‖ of the configured rule A —
the paper's objective (eq. 4) — by the authors' search for the tailored attacks on
Trimmed Mean and Median: γ = γ_init, step = γ_init/2, γ_succ = 0; while |γ_succ − γ| > τ:
if the deviation grew over the previous step's, γ_succ = γ and γ += step, else γ −= step;
step /= 2. The rule is called as a black box, so any configured rule (plugins, composed
rules) gets its own tailored attack.
"""

from __future__ import annotations

from typing import Any

from torch import Tensor

from fedshield.attacks._common import CohortAttack, Ctx, Rng, with_rows
from fedshield.attacks._oracle import benign_oracle, distance
from fedshield.attacks.base import ATTACKS
from fedshield.attacks.minmax import MinMaxParams, perturbation


def tailored_search(deviation: Any, gamma_init: float = 10.0, tau: float = 1e-5) -> float:
    """The NDSS'21 authors' search of the AGR-tailored attack (module docstring), step for
    step: ``deviation(γ)`` is evaluated once per step and compared with the previous step's
    (the first step always succeeds against the initial −1)."""
    gamma, step, succ, prev = gamma_init, gamma_init / 2, 0.0, -1.0
    while abs(succ - gamma) > tau:
        loss = deviation(gamma)
        if prev < loss:
            succ = gamma
            gamma += step
        else:
            gamma -= step
        step /= 2
        prev = loss
    return succ


@ATTACKS.register("agr_tailored", tags=["kind=update", "omniscient", "needs_rule"])
class AGRTailored(CohortAttack):
    """Shejwalkar & Houmansadr 2021's AGR-tailored attack: ḡ + γ∇^p with γ maximising the rule's
    deviation.

    ``vector`` ∈ unit_vec/std/sign (default std), ``gamma_init`` = 10, ``tau`` = 1e-5 as
    for ``min_max``; the deviation is measured through the configured rule (module
    docstring). The γ found is kept in ``last_gamma``."""

    params_schema = MinMaxParams
    needs_own_update = False
    needs_rule = True
    vector: str
    gamma_init: float
    tau: float

    #: γ found in the last call (None before the first call or with no attacker)
    last_gamma: float | None = None

    def forget(self) -> None:
        self.last_gamma = None

    def craft(self, updates: Tensor, mask: Tensor, generator: Rng, context: Ctx) -> Tensor:
        pool, mean, oracle = benign_oracle(updates, mask, context)
        direction = perturbation(pool, self.vector)

        def deviation(gamma: float) -> float:
            return distance(oracle(with_rows(updates, mask, mean + gamma * direction)), mean)

        gamma = tailored_search(deviation, self.gamma_init, self.tau)
        self.last_gamma = gamma
        return with_rows(updates, mask, mean + gamma * direction)


__all__ = ["AGRTailored", "tailored_search"]
