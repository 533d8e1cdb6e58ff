"""``opportunist``: honest until the cohort's share wins (docs/security.md §6b).

Fixed attackers under sampled cohorts hold a varying share of each cohort. The opportunist
uploads its honest update (nothing to flag, nothing to suspend) in every round where the
cohort holds fewer attackers than the rule can outvote, and in the others, where the rule's
output is theirs, every attacker uploads

    x = −ρ · (B / |η_g|) · ū                                                       (1)

ū the unit honest mean, B the step bound the server publishes for this round
(:func:`fedshield.attacks._published.step_bound`) and ρ < 1 (``factor``): the applied step
η_g·x is just under the bound, so it is never clipped. With no step bound configured the
norm is ``scale`` × the lower median honest row norm instead.

"Can outvote": the count of attackers that wins is ``threshold`` when set, else the rule's
cohort f plus one (:func:`fedshield.algorithms.server.cohort.cohort_f`: the rule's own f,
else its breakdown on the cohort — ⌊(S − 1)/2⌋ for the median), read from the configured
rule; a rule without an honest-majority condition (a root reference) counts a majority of
the cohort; the plain mean, one attacker.
"""

from __future__ import annotations

from pydantic import Field
from torch import Tensor

from fedshield.aggregators._ops import row_norms, to_dtype
from fedshield.algorithms.server.cohort import breakdown_f, cohort_f
from fedshield.attacks._common import CohortAttack, Ctx, Rng, honest_pool, with_rows
from fedshield.attacks._published import step_bound, unit
from fedshield.attacks.base import ATTACKS, AttackContext
from fedshield.core.params import Params
from fedshield.crossround.step_bound import lower_median


class OpportunistParams(Params):
    factor: float = Field(
        0.99, gt=0.0, le=1.0, description="ρ: the attacked step's norm as a share of the bound"
    )
    threshold: int | None = Field(
        None,
        ge=1,
        description="attackers in the cohort needed to attack; unset: the rule's cohort f + 1",
    )
    scale: float = Field(
        1.0,
        gt=0.0,
        le=1e6,
        description="without a step bound: the norm as a multiple of the median honest norm",
    )


def winning_count(context: AttackContext | None, cohort: int) -> int:
    """The attackers a cohort of ``cohort`` clients must hold for the rule's output to be
    theirs (module docstring)."""
    rule = context.rule if context is not None else None
    if rule is None:
        return 1
    f = cohort_f(rule, cohort, None)
    if f is None:
        f = breakdown_f(rule, cohort)
    return f + 1


@ATTACKS.register("opportunist", tags=["kind=update", "omniscient", "needs_rule"])
class Opportunist(CohortAttack):
    """Honest unless the cohort holds enough attackers to own the rule's output, then −ū
    just under the published step bound (docs/security.md §6b).

    Uploads the attackers' honest updates when fewer than ``threshold`` (default: the rule's
    cohort f + 1) are in the cohort; else x = −ρ·(B/|η_g|)·ū (module docstring)."""

    params_schema = OpportunistParams
    needs_rule = True
    factor: float
    threshold: int | None
    scale: float

    #: Whether the last call attacked (None before the first call or with no attacker).
    last_attacked: bool | None = None

    def forget(self) -> None:
        self.last_attacked = None

    def craft(self, updates: Tensor, mask: Tensor, generator: Rng, context: Ctx) -> Tensor:
        cohort = context.cohort if context is not None and context.cohort else updates.shape[0]
        need = self.threshold if self.threshold is not None else winning_count(context, cohort)
        self.last_attacked = int(mask.sum()) >= need
        if not self.last_attacked:
            return updates.clone()
        pool = honest_pool(updates, mask)
        u = unit(pool.double().mean(dim=0))
        bound = step_bound(context, pool)
        lr = context.lr if context is not None else 1.0
        if bound is not None and lr != 0.0:
            norm = self.factor * bound / abs(lr)
        else:
            norm = self.scale * (lower_median(row_norms(pool)) or 0.0)
        return with_rows(updates, mask, to_dtype(u * -norm, updates.dtype))


__all__ = ["Opportunist", "winning_count"]
