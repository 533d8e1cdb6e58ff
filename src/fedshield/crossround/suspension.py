"""Per-client suspicion scores and suspension, shared by the defenses that judge clients
across rounds (:mod:`~fedshield.crossround.reputation`, :mod:`~fedshield.crossround.collusion`).

Each judged upload adds its flag to its client's decayed score,

    s_m ← λ · s_m + flag_m          (on each of client m's uploads; s_m = 0 before)

and client m's rows are left out of the rule's rows while s_m ≥ ``threshold``, never more
than half of the rows the defense is handed (the most suspicious first), so a wrong
suspension cannot starve a round. Memory O(M): a score and an id per client
(``<name>/ids``, ``<name>/scores``).
"""

from __future__ import annotations

import torch
from pydantic import Field
from torch import Tensor

from fedshield.core.context import ClientUpdate, RoundContext
from fedshield.core.flat import stack_rows
from fedshield.core.params import Params
from fedshield.crossround.base import Acted, BoundInput, RoundDefense, State, reset_note


class SuspensionParams(Params):
    """λ and the threshold of the scores (module docstring); a defense's schema adds its
    own evidence parameter (and may change λ's default)."""

    decay: float = Field(0.8, ge=0.0, lt=1.0, description="λ: a score's decay per upload")
    threshold: float = Field(
        1.5, gt=0.0, le=1e6, description="a client is suspended while its score is at least this"
    )


def scores_after(
    scores: dict[int, float], judged: dict[int, bool], decay: float
) -> dict[int, float]:
    """The decayed scores after this round's flags; clients not judged keep their score."""
    out = dict(scores)
    for cid, flag in judged.items():
        out[cid] = decay * out.get(cid, 0.0) + float(flag)
    return out


class Suspending(RoundDefense):
    """A defense that keeps one decayed score per client and suspends high scorers
    (module docstring); subclasses judge the uploads in :meth:`bound`."""

    state_parts = ("ids", "scores")

    decay: float
    threshold: float

    def _scores(self, state: State) -> tuple[dict[int, float], Acted]:
        ids, scores = state.get(self.key("ids")), state.get(self.key("scores"))
        if ids is None and scores is None:
            return {}, Acted()
        ok = (
            ids is not None
            and scores is not None
            and ids.dim() == 1
            and ids.dtype == torch.int64
            and scores.shape == ids.shape
            and scores.dtype == torch.float64
            and bool((scores >= 0).all())
        )
        if not ok:
            return {}, reset_note(self.name, "(ids/scores)")
        assert ids is not None and scores is not None
        return dict(zip(ids.tolist(), scores.tolist(), strict=True)), Acted()

    def _state(self, scores: dict[int, float], device: torch.device) -> State:
        ids = sorted(scores)
        return {
            self.key("ids"): torch.tensor(ids, dtype=torch.int64, device=device),
            self.key("scores"): torch.tensor(
                [scores[i] for i in ids], dtype=torch.float64, device=device
            ),
        }

    def _judged(
        self, scores: dict[int, float], judged: dict[int, bool], device: torch.device
    ) -> State:
        return self._state(scores_after(scores, judged, self.decay), device)

    def suspended(self, rows: list[ClientUpdate], scores: dict[int, float]) -> set[int]:
        """The ids of ``rows`` left out: score ≥ threshold, at most half of the rows."""
        bad = [u for u in rows if scores.get(u.client_id, 0.0) >= self.threshold]
        bad.sort(key=lambda u: -scores[u.client_id])
        return {u.client_id for u in bad[: len(rows) // 2]}

    def judge(self, step: BoundInput, acted: Acted, scores: dict[int, float]) -> None:
        """Score this round's own unmasked uploads by :meth:`flag` against the applied step
        Δθ/η_g (into ``acted``); nothing is judged with fewer than 3 of them, a zero server
        step or non-finite values."""
        fresh = [u for u in step.judged if u.mask is None]
        delta = (step.after - step.before).flatten()
        if len(fresh) < 3 or step.lr == 0 or not bool(torch.isfinite(delta).all()):
            return
        rows = stack_rows([u.delta for u in fresh])
        if not bool(torch.isfinite(rows).all()):
            return
        flagged = self.flag(rows, delta / step.lr)
        judged = {u.client_id: bool(f) for u, f in zip(fresh, flagged.tolist(), strict=True)}
        acted.state = self._judged(scores, judged, delta.device)
        acted.metrics[f"defense/{self.name}/flagged"] = float(flagged.sum())

    def flag(self, rows: Tensor, step: Tensor) -> Tensor:
        """``[n]`` bool: which of ``rows`` this defense's evidence flags, given the applied
        step per unit of server step size (for :meth:`judge`)."""
        raise NotImplementedError

    def bound(self, step: BoundInput, state: State, ctx: RoundContext) -> tuple[Tensor, Acted]:
        """The step is applied unchanged; the uploads behind it are judged (:meth:`judge`)."""
        scores, acted = self._scores(state)
        self.judge(step, acted, scores)
        return step.after, acted

    def rows(
        self, kept: list[ClientUpdate], state: State, ctx: RoundContext
    ) -> tuple[list[ClientUpdate], Acted]:
        scores, acted = self._scores(state)
        drop = self.suspended(kept, scores)
        acted.metrics[f"defense/{self.name}/suspended"] = float(len(drop))
        return [u for u in kept if u.client_id not in drop], acted


__all__ = ["SuspensionParams", "Suspending", "scores_after"]
