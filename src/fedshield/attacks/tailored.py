"""``agr_tailored``: the AGR-tailored attack of Shejwalkar & Houmansadr (NDSS 2021,
"Manipulating the Byzantine", §IV-B), beside the AGR-agnostic Min-Max / Min-Sum.

Every attacker uploads ∇^m = ḡ + γ∇^p (ḡ the benign mean, ∇^p the perturbation of
:func:`fedshield.attacks.minmax.perturbation`: −ḡ/‖ḡ‖, −std or −sign(ḡ)), with γ found by
one of the authors' two searches, each driven by the configured rule A called as a black
box (plugins and composed rules get their own tailored attack):

* ``deviation`` (their attacks on Trimmed Mean and Median): γ maximising the deviation
  ‖A(∇^m, …, ∇^m, g_{f+1}, …, g_n) − ḡ‖ (eq. 4): γ = γ_init, step = γ_init/2, γ_succ = 0;
  while |γ_succ − γ| > τ: if the deviation grew over the previous step's, γ_succ = γ and
  γ += step, else γ −= step; step /= 2.
* ``selection`` (their attacks on Krum and Multi-Krum, ``our_attack_krum`` /
  ``our_attack_mkrum``): the largest γ for which the rule still selects the crafted rows,
  by the same halving with "selected" as success (:func:`~fedshield.attacks.minmax.
  halving_search`). The deviation of a selection rule is flat while the crafted rows are
  not selected, so the first search would stay at γ_init, which Krum never selects.
  Bulyan, which the authors attack like Multi-Krum, keeps ``deviation``: its repeated Krum
  re-ranks the rows when one identical copy is nudged (late rounds score over a single
  neighbour), so "selected" cannot be read from its output by a small probe.

``objective = "auto"`` (default) takes ``selection`` for rules tagged ``selects`` (the
registry's word for "its output is built from rows it selects": ``selects=one`` for Krum,
where one selected attacker is success, ``selects=subset`` for Multi-Krum, where every
attacker must be selected, as in the authors' code;
:func:`~fedshield.attacks._oracle.selects`) and ``deviation`` for the others.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field
from torch import Tensor

from fedshield.attacks._common import CohortAttack, Ctx, Rng, with_rows
from fedshield.attacks._oracle import benign_oracle, distance, selects
from fedshield.attacks.base import ATTACKS
from fedshield.attacks.minmax import MinMaxParams, halving_search, perturbation
from fedshield.registry import tags_of


def tailored_search(deviation: Any, gamma_init: float = 10.0, tau: float = 1e-5) -> float:
    """The NDSS'21 authors' search of the AGR-tailored attack on Trimmed Mean / Median (module
    docstring), step for step: ``deviation(γ)`` is evaluated once per step and compared with
    the previous step's (the first step always succeeds against the initial −1)."""
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


class TailoredParams(MinMaxParams):
    objective: Literal["auto", "deviation", "selection"] = Field(
        "auto",
        description="γ search: the largest γ still selected by the rule (selection: the "
        "authors' attack on Krum / Multi-Krum), the γ maximising the rule's "
        "deviation from the benign mean (deviation: on Trimmed Mean / Median); auto: "
        "selection for rules tagged 'selects', else deviation",
    )


@ATTACKS.register("agr_tailored", tags=["kind=update", "omniscient", "needs_rule"])
class AGRTailored(CohortAttack):
    """Shejwalkar & Houmansadr 2021's AGR-tailored attack: ḡ + γ∇^p with γ tailored to the rule.

    ``vector`` ∈ unit_vec/std/sign (default std), ``gamma_init`` = 10, ``tau`` = 1e-5 as
    for ``min_max``; ``objective`` picks the search (module docstring). The γ found is kept
    in ``last_gamma``, the search used in ``last_objective``."""

    params_schema = TailoredParams
    needs_own_update = False
    needs_rule = True
    vector: str
    gamma_init: float
    tau: float
    objective: str

    #: γ found in the last call (None before the first call or with no attacker)
    last_gamma: float | None = None
    #: search used in the last call ("deviation" or "selection"; None as last_gamma)
    last_objective: str | None = None

    def forget(self) -> None:
        self.last_gamma = None
        self.last_objective = None

    def craft(self, updates: Tensor, mask: Tensor, generator: Rng, context: Ctx) -> Tensor:
        pool, mean, oracle = benign_oracle(updates, mask, context)
        direction = perturbation(pool, self.vector)
        objective = self.objective
        if objective == "auto":
            objective = "selection" if "selects" in tags_of(oracle.rule) else "deviation"
        # Krum keeps one row (the authors: "the Krum candidate is an attacker"); Multi-Krum
        # a subset, which must hold every attacker (their our_attack_mkrum).
        every = tags_of(oracle.rule).get("selects", frozenset()) != {"one"}

        if objective == "selection":

            def selected(gamma: float) -> bool:
                nudge = (1e-9 * max(gamma, self.tau)) * direction  # 1e-9 of the step γ∇^p
                rows = mean + gamma * direction
                return selects(oracle, updates, mask, rows, nudge, every=every)

            gamma = halving_search(selected, self.gamma_init, self.tau)
        else:

            def deviation(gamma: float) -> float:
                return distance(oracle(with_rows(updates, mask, mean + gamma * direction)), mean)

            gamma = tailored_search(deviation, self.gamma_init, self.tau)
        self.last_gamma = gamma
        self.last_objective = objective
        return with_rows(updates, mask, mean + gamma * direction)


__all__ = ["AGRTailored", "TailoredParams", "tailored_search"]
