"""Evidence of collusion: near-identical rows from different clients are left out, and
clients that send them again and again are suspended.

Honest clients train on different data (and different batches), so no two of their
uploads coincide; colluding attackers who place one crafted row for all of them — the
quiet "hug" row (docs/security.md §6b), an opportunist's −ū, a cache-poisoning direction — send rows
far closer to each other than any two honest ones. On the rows ``g_1..g_n`` it is handed,

    nn_i     = min_{j ≠ i} ‖g_i − g_j‖            (the nearest other row)
    spread   = lower median_{i < j} ‖g_i − g_j‖   (the cohort's pairwise spread)
    flag_i   = nn_i < ρ · min(spread, ‖g_i‖)                                       (1)

The pairwise median, not the median nn distance, so that attackers that are half the rows
cannot pull the scale to 0 (the pairs among k identical rows are k(k−1)/2 of n(n−1)/2);
capped by the row's own norm, so that far outliers (noise of σ = 100), which inflate the
pairwise median, do not make honest rows look near-identical next to them. On digits (mlp,
Dirichlet 0.5 and iid, seed 3) no honest row came closer to another than 0.4 × the spread
or 0.57 × its norm; ρ = 0.1 leaves that margin. Flagged rows are removed from the rule's
rows in the round they arrive, and the rule's f is lowered by the rows removed (they are
Byzantine, so f − removed still bounds the rest; the too-few check already passed on the
cohort). Across rounds each fresh upload's flag feeds a decayed
score (:mod:`fedshield.crossround.suspension`; FLDetector's per-client suspicion across
rounds, Zhang et al., KDD 2022, with (1) as the evidence), and a client whose score
reaches ``threshold`` is left out of later rounds too, including its cached rows (put
``collusion`` after ``cache`` for that), so colluders that jitter their rows past (1) in
some rounds stay out after the rounds they did not.

What it does not catch: attackers whose rows are as far apart as honest ones (jitter of
ρ·spread or more); those are the step bound's and the rule's. Distances are exact in
float64 for near-duplicates (:func:`fedshield.aggregators._ops.pairwise_sq_dists`). Rows
with a coverage mask (depth tiers) are not compared (their blocks differ).

Memory O(M): a score and an id per client (``collusion/ids``, ``collusion/scores``).
"""

from __future__ import annotations

import torch
from pydantic import Field
from torch import Tensor

from fedshield.aggregators._ops import pairwise_sq_dists
from fedshield.core.context import ClientUpdate, RoundContext
from fedshield.core.flat import stack_rows
from fedshield.crossround.base import ROUND_DEFENSES, Acted, BoundInput, State
from fedshield.crossround.suspension import Suspending, SuspensionParams


class CollusionParams(SuspensionParams):
    rho: float = Field(
        0.1,
        gt=0.0,
        lt=1.0,
        description="ρ: a row is flagged when its nearest other row is closer than ρ × the "
        "median pairwise distance",
    )
    decay: float = Field(0.9, ge=0.0, lt=1.0, description="λ: a score's decay per upload")


def near_duplicates(rows: Tensor, rho: float) -> Tensor:
    """Eq. (1): ``[n]`` bool, rows whose nearest other row is closer than ρ × the lower
    median pairwise distance (or ρ × their own norm, if smaller); none flagged below 3
    finite rows or with a zero spread."""
    n = rows.shape[0]
    out = torch.zeros(n, dtype=torch.bool, device=rows.device)
    d2, keep = pairwise_sq_dists(rows)
    k = keep.numel()
    if k < 3:
        return out
    dist = d2.clamp_min(0.0).sqrt()
    pairs = dist[torch.triu_indices(k, k, 1, device=dist.device).unbind(0)]
    spread = float(pairs.sort().values[(pairs.numel() - 1) // 2])
    if not spread > 0.0:
        return out
    nn = (dist + torch.diag(torch.full((k,), float("inf"), dtype=dist.dtype))).min(1).values
    own = rows.index_select(0, keep).to(torch.float64).norm(dim=1)
    out[keep] = nn < rho * own.clamp_max(spread)
    return out


def flagged_ids(rows: list[ClientUpdate], rho: float) -> dict[int, bool]:
    """Eq. (1) on the unmasked ``rows``, by client id."""
    plain = [u for u in rows if u.mask is None]
    if len(plain) < 3:
        return {}
    flags = near_duplicates(stack_rows([u.delta for u in plain]), rho).tolist()
    return {u.client_id: bool(f) for u, f in zip(plain, flags, strict=True)}


@ROUND_DEFENSES.register("collusion", tags=["memory=M", "changes_rows"])
class Collusion(Suspending):
    """Collusion evidence: near-identical rows of different clients are dropped the round
    they arrive, and clients that keep sending them are suspended.

    Memory O(M): one score per client, in the server state."""

    params_schema = CollusionParams
    rho: float

    def rows(
        self, kept: list[ClientUpdate], state: State, ctx: RoundContext
    ) -> tuple[list[ClientUpdate], Acted]:
        rows, acted = super().rows(kept, state, ctx)
        flags = flagged_ids(rows, self.rho)
        out = [u for u in rows if not flags.get(u.client_id, False)]
        acted.metrics[f"defense/{self.name}/duplicates"] = float(len(rows) - len(out))
        acted.identified = len(kept) - len(out)
        return out, acted

    def bound(self, step: BoundInput, state: State, ctx: RoundContext) -> tuple[Tensor, Acted]:
        scores, acted = self._scores(state)
        judged = flagged_ids(step.judged, self.rho)
        if judged:
            acted.state = self._judged(scores, judged, step.after.device)
        return step.after, acted


__all__ = ["Collusion", "flagged_ids", "near_duplicates"]
