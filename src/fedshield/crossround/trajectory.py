"""Trajectory consistency: a client whose uploads point against the run's recent direction,
round after round, is suspended.

A sign flipper uploads −g, g its own honest update. Against the step of the round it
joins, its row looks like a heterogeneous honest one: on digits (mlp, Dirichlet 0.5, 30 %
fixed sign flippers, S/M 10/50, the median with the default round defenses; seed 3, the
seed the other defenses' thresholds were set from) the cosine of a flipped row with the
applied step has its median at 0.01, inside the honest rows' range (10 % quantile 0.07),
because the step it is compared with is partly its own doing and one client's data pulls
one way. Against the run's trajectory — the exponential moving average ā of the steps the
server applied in *earlier* rounds, which no attacker of this round has moved — the honest
rows' cosine has its median at 0.21 and its 10 % quantile at −0.07, the flipped rows'
median at −0.15 (γ = 0.1 flags about one honest upload in twelve and over half of the
flipped ones). So, after each applied step a^t = Δθ/η_g,

    flag_m = cos(g_m, ā^{t−1}) < −γ                                                 (1)
    ā^t = β · ā^{t−1} + (1 − β) · a^t                                               (2)

and the flag feeds client m's decayed score (:mod:`fedshield.crossround.suspension`): with
λ = 0.8 and the threshold 1.5, two flagged uploads close together suspend a client, one
alone never does. The reference is the same idea as the server-side momentum of Karimireddy,
He & Jaggi (ICML 2021) — the direction averaged over rounds is less noisy than any one
round's — used here as the prediction FLDetector (Zhang et al., KDD 2022) checks each
client against. A round that moved θ by nothing (a skipped round) leaves ā as it was; the
first round judges nothing. It needs the attackers to be a minority of the rows over the
rounds that make ā: where they are the majority of most cohorts (attackers always online
under ``availability``), ā follows them and the honest clients are the ones flagged, which
makes things worse (docs/cross-round.md, "trajectory"). An attacker who knows (1) keeps its rows' cosine above −γ,
which bounds what each of them takes from the trajectory; the quiet attacks of
docs/cross-round.md do. Suspicion alone does not lower the rule's f, and never more than
half of the rows are left out. Rows with a coverage mask are not judged.

Memory O(M + d): a score and an id per client and ā (``trajectory/ids``,
``trajectory/scores``, ``trajectory/ema``); a stored ā of the wrong shape or dtype, or not
finite, starts over and says so.
"""

from __future__ import annotations

import torch
from pydantic import Field
from torch import Tensor

from fedshield.core.context import RoundContext
from fedshield.crossround.base import ROUND_DEFENSES, Acted, BoundInput, State, reset_note
from fedshield.crossround.suspension import Suspending, SuspensionParams


class TrajectoryParams(SuspensionParams):
    gamma: float = Field(
        0.1,
        ge=0.0,
        lt=1.0,
        description="γ: an upload is flagged when its cosine with the trajectory is below −γ",
    )
    beta: float = Field(
        0.8, ge=0.0, lt=1.0, description="β: the trajectory's decay per applied step, eq. (2)"
    )


def trajectory_cosines(rows: Tensor, reference: Tensor) -> Tensor:
    """The left side of eq. (1): ``[n]`` float64 cosines of ``rows`` with ``reference``;
    0 for a zero row or reference."""
    x = rows.to(torch.float64)
    r = reference.to(torch.float64).flatten()
    norms = x.norm(dim=1) * r.norm()
    return torch.where(norms > 0, (x @ r) / torch.where(norms > 0, norms, 1.0), 0.0)


@ROUND_DEFENSES.register("trajectory", tags=["memory=M", "changes_rows"])
class Trajectory(Suspending):
    """Trajectory consistency: clients whose uploads point against the moving average of
    the applied steps, round after round, are suspended from the rule's rows.

    Memory O(M + d): one score per client and the average, in the server state."""

    params_schema = TrajectoryParams
    state_parts = (*Suspending.state_parts, "ema")
    gamma: float
    beta: float

    def flag(self, rows: Tensor, step: Tensor) -> Tensor:
        return trajectory_cosines(rows, step) < -self.gamma

    def _ema(self, state: State, like: Tensor) -> tuple[Tensor | None, Acted]:
        ema = state.get(self.key("ema"))
        if ema is None:
            return None, Acted()
        if ema.shape != (like.numel(),) or ema.dtype != like.dtype:
            return None, reset_note(self.name, "(ema)")
        if not bool(torch.isfinite(ema).all()):
            return None, reset_note(self.name, "(ema)")
        return ema.to(like.device), Acted()

    def bound(self, step: BoundInput, state: State, ctx: RoundContext) -> tuple[Tensor, Acted]:
        """The step is applied unchanged; this round's uploads are judged against the
        average of the earlier steps (eq. 1), then the average takes this step in (eq. 2)."""
        scores, acted = self._scores(state)
        ema, noted = self._ema(state, step.after)
        acted.metrics |= noted.metrics
        delta = (step.after - step.before).flatten()
        moved = step.lr != 0 and bool(torch.isfinite(delta).all()) and bool(delta.any())
        if ema is not None and bool(ema.any()):
            self.judge(step, acted, scores, reference=ema)
        if moved:
            a = delta / step.lr
            ema = a.clone() if ema is None else ema * self.beta + a * (1.0 - self.beta)
        if ema is not None:
            acted.state = {**acted.state, self.key("ema"): ema}
        return step.after, acted


__all__ = ["Trajectory", "trajectory_cosines"]
