"""``mimic``: the heterogeneity attack of Karimireddy, He & Jaggi (ICLR 2022, "Byzantine-
robust learning on heterogeneous datasets via bucketing", §4 and App. "Mimic").

Every attacker uploads a copy of one benign worker's update. Nothing is out of the benign
cloud, so no outlier filter can reject it, yet the rule's output is pulled towards that
worker's (non-IID) data: under heterogeneity the over-represented worker biases the model.
"""

from __future__ import annotations

import torch
from pydantic import Field
from torch import Tensor

from fedshield.attacks._common import CohortAttack, Ctx, Rng, honest_pool, with_rows
from fedshield.attacks.base import ATTACKS
from fedshield.core.params import Params


class MimicParams(Params):
    target: int | None = Field(
        None,
        ge=0,
        description="index among the benign rows of the worker to copy (ByzFL's epsilon); "
        "unset: the paper's choice, the worker most extreme along the top principal direction",
    )


def principal_target(pool: Tensor) -> int:
    """The row of ``pool`` most extreme along the top principal direction z of the centred
    rows: argmax_i |⟨g_i − μ, z⟩| (Karimireddy et al.'s Mimic chooses the worker that
    maximises the variance it adds along z; we take z from this round's rows, computed
    from the [n, n] Gram matrix in float64, so the choice is a pure function of the round)."""
    if pool.shape[0] < 2:
        return 0
    centred = (pool - pool.mean(dim=0)).double()
    gram = centred @ centred.T
    _, vecs = torch.linalg.eigh(gram)
    # Projections of the rows on z are the top eigenvector of the Gram matrix times √λ:
    # the argmax of |projection| is the argmax of |eigenvector entry|.
    return int(vecs[:, -1].abs().argmax())


@ATTACKS.register("mimic", tags=["kind=update", "omniscient"])
class Mimic(CohortAttack):
    """Every attacker uploads a copy of one benign worker's update (Karimireddy et al. 2022).

    ``target`` fixes that worker (an index into the benign rows, as ByzFL's
    ``Mimic(epsilon)``, which it then equals; out of range: the last benign row). Unset,
    the worker is the one most extreme along the top principal direction of the round's
    benign updates (the paper's heuristic, recomputed every round, so runs resume
    exactly). The chosen index is kept in ``last_target``."""

    params_schema = MimicParams
    needs_own_update = False
    target: int | None

    #: benign row copied in the last call (None before the first call or with no attacker)
    last_target: int | None = None

    def forget(self) -> None:
        self.last_target = None

    def craft(self, updates: Tensor, mask: Tensor, generator: Rng, context: Ctx) -> Tensor:
        pool = honest_pool(updates, mask)
        i = principal_target(pool) if self.target is None else min(self.target, len(pool) - 1)
        self.last_target = i
        return with_rows(updates, mask, pool[i])


__all__ = ["Mimic", "principal_target"]
