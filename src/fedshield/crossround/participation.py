"""Equal participation: no client's rows reach the rule more often per invitation than the
typical client's, so attackers who always answer keep the cohort's share of the rows.

Faults take rows from honest clients only: an attacker never drops out and is never late.
At 30 % fixed attackers and 60 % honest dropout the rows that arrive are 0.3 / (0.3 + 0.7 ·
0.4) ≈ 52 % Byzantine, a majority no reference-free rule outvotes, however many clients
are invited (over-selection scales both). The server cannot tell who is Byzantine, but it
knows whom it invited and who answered: an honest client answers a fraction p of its
invitations (1 − dropout, the deadline's share), an always-answering attacker all of them.
Each client holds a credit of rows, as a token bucket:

    c_m ← min(C, c_m + r̂)            on each invitation of m                     (1)
    m's row reaches the rule iff c_m ≥ 1; then c_m ← c_m − 1                      (2)

with r̂ the median over clients (invited at least ``min_invitations`` times) of their
answered / invited ratio before this round: the clients' typical answer rate, set by the
honest majority. An honest client's rows pass (its credit grows by its own rate on
average); an attacker's pass at rate r̂ instead of 1, so the attackers' share of the rows
that reach the rule is their share of the invited cohort again (30 % instead of 52 %
above). An attacker who answers only when its credit allows gets no more rows; saving
credit buys at most ``cap`` rows in one round, and such a round is short (its f is the
invited cohort's), so padding or ``fill`` completes it toward the honest side. Without
faults every client answers every invitation (r̂ = 1): no row is held back.

A held-back row is not evidence: it neither lowers the round's f nor counts as a rejected
upload, and its client is not filled in from the cache (it answered). Rows of clients never
invited this round (impossible in the simulator and the Flower strategy, whose admission
keeps the cohort's) pass unchanged. Memory O(M): an id, a credit and two counts per client
(``participation/...``), in the server state.
"""

from __future__ import annotations

import torch
from pydantic import Field
from torch import Tensor

from fedshield.algorithms.server.base import ServerRound
from fedshield.core.context import ClientUpdate
from fedshield.core.params import Params
from fedshield.crossround.base import ROUND_DEFENSES, Acted, RoundDefense, State, reset_note


class ParticipationParams(Params):
    cap: float = Field(
        2.0,
        ge=1.0,
        le=1e6,
        description="C: the most credit (rows) a client may save for one round",
    )
    min_invitations: int = Field(
        3,
        ge=1,
        description="clients invited fewer times do not enter the median answer rate",
    )


def typical_rate(invited: Tensor, answered: Tensor, min_invitations: int) -> float:
    """r̂ of eq. (1): the lower median answered / invited ratio over the clients invited at
    least ``min_invitations`` times; 1 when there are none (no evidence: hold nothing back)."""
    seen = invited >= min_invitations
    if not bool(seen.any()):
        return 1.0
    ratio = (answered[seen] / invited[seen]).clamp(0.0, 1.0)
    return float(ratio.sort().values[(ratio.numel() - 1) // 2])


def admit_rows(
    credit: Tensor, cohort: Tensor, rows: Tensor, rate: float, cap: float
) -> tuple[Tensor, Tensor]:
    """Eqs. (1)-(2) for one round: ``credit`` [k] per client slot, ``cohort`` the slots of
    the invited clients, ``rows`` the slots of the rows kept, in order. Returns the credit
    after the round and a [len(rows)] bool mask of the rows that reach the rule."""
    credit = credit.clone()
    credit[cohort] = (credit[cohort] + rate).clamp(max=cap)
    passed = torch.zeros(rows.numel(), dtype=torch.bool)
    for i, slot in enumerate(rows.tolist()):
        if credit[slot] >= 1.0 - 1e-9:
            credit[slot] -= 1.0
            passed[i] = True
    return credit, passed


@ROUND_DEFENSES.register("participation", tags=["memory=M", "changes_rows"])
class Participation(RoundDefense):
    """Rows reach the rule at most at the typical client's answer rate per invitation
    (module docstring): always-answering attackers keep the invited cohort's share.

    Memory O(M): an id, a credit and two counts per client, in the server state."""

    params_schema = ParticipationParams
    state_parts = ("ids", "credit", "invited", "answered")
    cap: float
    min_invitations: int

    def _load(self, state: State) -> tuple[dict[int, tuple[float, float, float]], Acted]:
        parts = [state.get(self.key(p)) for p in self.state_parts]
        if all(t is None for t in parts):
            return {}, Acted()
        ids, credit, invited, answered = parts
        ok = (
            ids is not None
            and ids.dim() == 1
            and ids.dtype == torch.int64
            and all(
                t is not None
                and t.shape == ids.shape
                and t.dtype == torch.float64
                and bool(torch.isfinite(t).all())
                and bool((t >= 0).all())
                for t in (credit, invited, answered)
            )
        )
        if not ok:
            return {}, reset_note(self.name, "(ids/credit/invited/answered)")
        assert ids is not None and credit is not None and invited is not None
        assert answered is not None
        table = zip(
            ids.tolist(),
            credit.clamp(max=self.cap).tolist(),
            invited.tolist(),
            torch.minimum(answered, invited).tolist(),  # a count read back is bounded too
            strict=True,
        )
        return {i: (c, n, a) for i, c, n, a in table}, Acted()

    def complete(
        self, rnd: ServerRound, needed: int | None, sent: set[int]
    ) -> tuple[list[ClientUpdate], Acted]:
        kept, ctx = rnd.updates, rnd.ctx
        table, acted = self._load(rnd.state)
        invited = sorted(set(ctx.cohort))
        ids = sorted(set(table) | set(invited) | {u.client_id for u in kept})
        slot = {cid: i for i, cid in enumerate(ids)}
        credit = torch.tensor([table.get(i, (1.0, 0.0, 0.0))[0] for i in ids], dtype=torch.float64)
        count = torch.tensor([table.get(i, (1.0, 0.0, 0.0))[1] for i in ids], dtype=torch.float64)
        answer = torch.tensor([table.get(i, (1.0, 0.0, 0.0))[2] for i in ids], dtype=torch.float64)
        rate = typical_rate(count, answer, self.min_invitations)
        cohort = torch.tensor([slot[i] for i in invited], dtype=torch.int64)
        in_cohort = set(invited)
        # this round's answers only: rows another defense took from the cache are not
        judged = [u for u in kept if u.client_id in sent and u.client_id in in_cohort]
        rows = torch.tensor([slot[u.client_id] for u in judged], dtype=torch.int64)
        credit, passed = admit_rows(credit, cohort, rows, rate, self.cap)
        held = {id(u) for u, ok in zip(judged, passed.tolist(), strict=True) if not ok}
        count[cohort] += 1.0
        answered_now = [slot[c] for c in sent if c in in_cohort]
        if answered_now:
            answer[torch.tensor(answered_now, dtype=torch.int64)] += 1.0
        device = rnd.params.device
        acted.state = {
            self.key("ids"): torch.tensor(ids, dtype=torch.int64, device=device),
            self.key("credit"): credit.to(device),
            self.key("invited"): count.to(device),
            self.key("answered"): answer.to(device),
        }
        acted.metrics[f"defense/{self.name}/rate"] = rate
        if held:
            acted.metrics[f"defense/{self.name}/held"] = float(len(held))
        return [u for u in kept if id(u) not in held], acted


__all__ = ["Participation", "ParticipationParams", "admit_rows", "typical_rate"]
