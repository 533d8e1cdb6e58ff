"""Direction consistency across rounds: a client whose upload leaves the cohort's centre
against the applied step, round after round, is suspended.

A quiet colluder stays inside every radius (the "hug" x = c − h·r·ū of docs/security.md §6b), so
distance tests never fire; but its offset from the centre points against the honest mean every
round, whatever h and whatever jitter it adds. After each applied step a = Δθ/η_g, every
fresh upload g_m is judged by the cosine of its offset from the coordinate-wise median c
of the round's uploads with the applied step,

    flag_m = cos(g_m − c, a) < −γ                                                   (1)

and the flag feeds client m's decayed score (:mod:`fedshield.crossround.suspension`;
FLDetector's idea, Zhang et al., KDD 2022, of judging a client by the consistency of its
updates over rounds, with (1) as the per-round evidence). On digits (mlp, Dirichlet 0.5)
an honest offset's cosine has its 1 % quantile near −0.58 (its median near −0.1: the
median, not the mean, is the centre), while the hug row's is cos(−ū, a) ≈ −0.7 … −0.93;
with γ = 0.65 and two flags needed for suspension an honest client is rarely suspended and
never for long. An attacker can raise its cosine above −γ only by turning its offset away
from −ū, which shrinks what it takes from each step by the same cosine. Suspicion alone
does not lower the rule's f, and never more than half of the rows are left out. Rows with a
coverage mask are not judged.

Memory O(M): a score and an id per client (``consistency/ids``, ``consistency/scores``).
"""

from __future__ import annotations

import torch
from pydantic import Field
from torch import Tensor

from fedshield.crossround.base import ROUND_DEFENSES
from fedshield.crossround.suspension import Suspending, SuspensionParams


class ConsistencyParams(SuspensionParams):
    gamma: float = Field(
        0.65,
        gt=0.0,
        lt=1.0,
        description="γ: an upload is flagged when its offset from the centre has cosine "
        "below −γ with the applied step",
    )


def offset_cosines(rows: Tensor, step: Tensor) -> Tensor:
    """The left side of eq. (1): ``[n]`` float64, the cosine of each row's offset from the
    coordinate-wise (lower) median of ``rows`` with ``step``; 0 for a zero offset or step."""
    x = rows.to(torch.float64)
    a = step.to(torch.float64).flatten()
    off = x - x.median(dim=0).values
    norms = off.norm(dim=1) * a.norm()
    return torch.where(norms > 0, (off @ a) / torch.where(norms > 0, norms, 1.0), 0.0)


def against_step(rows: Tensor, step: Tensor, gamma: float) -> Tensor:
    """Eq. (1): ``[n]`` bool, rows whose offset from the coordinate-wise median has cosine
    below −γ with ``step`` (float64; a zero offset or step flags nothing)."""
    return offset_cosines(rows, step) < -gamma


@ROUND_DEFENSES.register("consistency", tags=["memory=M", "changes_rows"])
class Consistency(Suspending):
    """Direction consistency: clients whose uploads leave the centre against the applied
    step round after round are suspended.

    Memory O(M): one score per client, in the server state."""

    params_schema = ConsistencyParams
    gamma: float

    def flag(self, rows: Tensor, step: Tensor) -> Tensor:
        return against_step(rows, step, self.gamma)


__all__ = ["Consistency", "against_step", "offset_cosines"]
