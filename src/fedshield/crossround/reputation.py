"""Per-client reputation across rounds: a client whose uploads are repeatedly far from the
applied aggregate is suspended (its rows no longer reach the rule).

After each applied step, every upload of this round is judged against the aggregate
direction a = Δθ / η_g the server applied (consistency in the spirit of FLDetector, Zhang
et al., KDD 2022, with the aggregate as the prediction):

    flag_m = ‖g_m − a‖ > τ · med_{j kept} ‖g_j − a‖                                  (1)
    s_m ← λ · s_m + flag_m          (on each of client m's uploads; s_m = 0 before)    (2)

and client m's rows are left out of the rule's rows while s_m ≥ ``threshold``. With the
defaults (τ = 3, λ = 0.8, threshold 1.5) a client is suspended after two flagged uploads
in a row (1, then 1.8) and one flag alone never suspends (1 → 0.8 → 0.64 …). A suspended
client's uploads are still judged, so an honest client flagged in a bad round is restored
by its next consistent uploads (1.8 → 1.44 < 1.5). Rounds the attackers win flag the
honest clients instead: put ``step_bound`` and ``cache`` before it so the aggregate it
judges against is bounded. It never leaves the rule fewer rows than half of this round's
(the most suspicious ones are dropped first), so a wrong suspension cannot starve a round.
Uploads with a coverage mask (depth tiers) are not judged: a partial row is not comparable
with the whole aggregate.

Memory O(M): a score and an id per client (``reputation/ids``, ``reputation/scores``).
"""

from __future__ import annotations

from pydantic import Field
from torch import Tensor

from fedshield.aggregators._ops import row_dists
from fedshield.crossround.base import ROUND_DEFENSES
from fedshield.crossround.suspension import Suspending, SuspensionParams


class ReputationParams(SuspensionParams):
    tau: float = Field(
        3.0, gt=1.0, le=1e6, description="τ: an upload is flagged beyond τ × the median distance"
    )


def flags(rows: Tensor, aggregate: Tensor, tau: float) -> Tensor:
    """Eq. (1): ``[n]`` bool, rows farther than τ × the lower median distance from it."""
    dist = row_dists(rows, aggregate)
    med = dist.sort().values[(dist.numel() - 1) // 2]
    return dist > tau * med


@ROUND_DEFENSES.register("reputation", tags=["memory=M", "changes_rows"])
class Reputation(Suspending):
    """Per-client reputation: clients whose uploads are repeatedly far from the applied
    aggregate are suspended from the rule's rows.

    Memory O(M): one score per client, in the server state."""

    params_schema = ReputationParams
    tau: float

    def flag(self, rows: Tensor, step: Tensor) -> Tensor:
        return flags(rows, step, self.tau)


__all__ = ["Reputation", "flags"]
