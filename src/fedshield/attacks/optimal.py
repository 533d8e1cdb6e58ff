"""``alie_opt`` and ``ipm_opt``: ALIE and IPM with the attack factor searched against the
configured rule (Allouah et al., AISTATS 2023, "Fixing by Mixing"; ByzFL's
``Optimal_ALittleIsEnough`` / ``Optimal_InnerProductManipulation``).

Every attacker uploads the same vector b(τ): μ + τσ (ALIE, μ and σ the benign coordinate
mean and unbiased std) or −τμ (IPM). τ maximises the distance ‖A(x(τ)) − μ‖ of the rule's
aggregate from the benign mean, x(τ) the round's matrix with the Byzantine rows set to
b(τ), A the configured rule (:class:`~fedshield.attacks._oracle.RuleOracle`). The search is
ByzFL 0.0.11's line search, step for step (:func:`line_search`), so with the same rule and
inputs the uploads are equal.
"""

from __future__ import annotations

from collections.abc import Callable

from pydantic import Field
from torch import Tensor

from fedshield.attacks._common import CohortAttack, Ctx, Rng, coord_std, with_rows
from fedshield.attacks._oracle import benign_oracle, distance
from fedshield.attacks.base import ATTACKS
from fedshield.core.params import Params


def line_search(
    objective: Callable[[float], float],
    start: float = 0.0,
    delta: float = 10.0,
    evals: int = 20,
    ratio: float = 0.8,
) -> float:
    """ByzFL's search for the τ maximising ``objective`` with ``evals`` evaluations.

    Expansion: from τ = ``start``, try τ + δ, doubling δ after each improvement; at the
    first failure δ ← ratio·δ. Contraction: with the evaluations left, try best + δ and
    shrink δ by ``ratio`` after every try, keeping improvements. Only the direction of
    the sign of ``delta`` is explored (ByzFL's choice; a negative δ searches the other side).
    """
    best_x, best_y = start, objective(start)
    expanding = True
    for _ in range(evals - 1):
        prop = best_x + delta
        y = objective(prop)
        better = y > best_y
        if better:
            best_x, best_y = prop, y
        expanding = expanding and better  # the first failure ends the expansion for good
        delta *= 2 if expanding else ratio
    return best_x


class OptimalParams(Params):
    evals: int = Field(20, ge=1, description="rule evaluations of the line search (ByzFL: 20)")
    start: float = Field(0.0, description="first attack factor τ tried (ByzFL: 0.0)")
    delta: float = Field(
        10.0, description="first step of the search; its sign is the side searched (ByzFL: 10.0)"
    )
    ratio: float = Field(
        0.8, gt=0.5, lt=1.0, description="step contraction ratio in (0.5, 1) (ByzFL: 0.8)"
    )


class _OptimalAttack(CohortAttack):
    """Shared search; subclasses give the Byzantine vector b(τ) from the benign rows."""

    params_schema = OptimalParams
    needs_own_update = False
    needs_rule = True
    evals: int
    start: float
    delta: float
    ratio: float

    def vector(self, pool: Tensor, tau: float) -> Tensor:
        raise NotImplementedError

    #: τ chosen in the last call (None before the first call or with no attacker)
    last_tau: float | None = None

    def forget(self) -> None:
        self.last_tau = None

    def craft(self, updates: Tensor, mask: Tensor, generator: Rng, context: Ctx) -> Tensor:
        pool, mean, oracle = benign_oracle(updates, mask, context)

        def objective(tau: float) -> float:
            return distance(oracle(with_rows(updates, mask, self.vector(pool, tau))), mean)

        tau = line_search(objective, self.start, self.delta, self.evals, self.ratio)
        self.last_tau = tau
        return with_rows(updates, mask, self.vector(pool, tau))


@ATTACKS.register("alie_opt", tags=["kind=update", "omniscient", "needs_rule"])
class OptimalALIE(_OptimalAttack):
    """ALIE with τ searched against the configured rule: upload μ + τσ (ByzFL Optimal_ALIE).

    Allouah et al. 2023 (the ByzFL team's attack). τ maximises ‖A(x) − μ‖ for the
    configured rule A (a ByzFL-identical line search, ``evals`` rule calls per round); the
    uploaded vector and ByzFL's ``Optimal_ALittleIsEnough(agg=A, pre_agg_list=[], f)`` are
    equal on the same inputs. σ is the unbiased std; τ = −z of ``alie``."""

    def vector(self, pool: Tensor, tau: float) -> Tensor:
        return pool.mean(dim=0) + tau * coord_std(pool)


@ATTACKS.register("ipm_opt", tags=["kind=update", "omniscient", "needs_rule"])
class OptimalIPM(_OptimalAttack):
    """IPM with ε searched against the configured rule: upload −τμ (ByzFL Optimal_IPM).

    Allouah et al. 2023. τ maximises ‖A(x) − μ‖ for the configured rule A with ByzFL's
    line search; equal to ``Optimal_InnerProductManipulation(agg=A, pre_agg_list=[], f)``
    on the same inputs."""

    def vector(self, pool: Tensor, tau: float) -> Tensor:
        return pool.mean(dim=0) * -tau


__all__ = ["OptimalALIE", "OptimalIPM", "line_search"]
