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

from fedshield.core.context import ClientUpdate, RoundContext
from fedshield.crossround.base import Acted, RoundDefense, State, reset_note


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

    def rows(
        self, kept: list[ClientUpdate], state: State, ctx: RoundContext
    ) -> tuple[list[ClientUpdate], Acted]:
        scores, acted = self._scores(state)
        drop = self.suspended(kept, scores)
        acted.metrics[f"defense/{self.name}/suspended"] = float(len(drop))
        return [u for u in kept if u.client_id not in drop], acted


__all__ = ["Suspending", "scores_after"]
