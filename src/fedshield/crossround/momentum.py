"""Worker momentum kept by the server: the rule sees each client's momentum, not its raw
upload (Karimireddy, He & Jaggi, ICML 2021, "Learning from history for Byzantine robust
optimization", Alg. 2 with the momentum computed server-side).

For client m's upload g_m^t the server keeps

    m_m ← β · m_m + (1 − β) · g_m^t        (m_m = g_m^t on the client's first upload)   (1)

and hands the rule m_m in place of g_m^t. With ``server.aggregator = "centered_clipping"``
(:mod:`fedshield.aggregators.clipping`, clipping around the previous aggregate kept in the
server state) this is the paper's momentum + centered clipping: averaging over rounds shrinks
the honest rows' variance by about (1 − β)/(1 + β), so the clipping radius (relative to the
honest distances) shrinks with it, and an attacker who moves the centre a little every round
(a time-coupled attack) moves it by at most (f/n)·τ per round against a smaller τ. Under
partial participation a client's momentum mixes uploads from the rounds it was sampled in
(every M/S rounds on average): β is smaller than the paper's 0.9 by default so that its
memory (1/(1 − β) uploads) stays within a few sampling periods.

Rows with a coverage mask (depth tiers) pass unchanged (their held blocks may change). The
momentum of an upload the defense never sees (a client suspended by an earlier defense in
``server.round_defenses``) is not updated: put ``momentum`` after the defenses that leave
rows out and before ``cache`` (which then caches momenta).

Memory O(M·d): one momentum row per client (a :class:`~fedshield.crossround.cache.Table`
under ``momentum/``).
"""

from __future__ import annotations

from dataclasses import replace

from pydantic import Field

from fedshield.core.context import ClientUpdate, RoundContext
from fedshield.core.params import Params
from fedshield.crossround.base import ROUND_DEFENSES, Acted, RoundDefense, State
from fedshield.crossround.cache import Table, load_table


class MomentumParams(Params):
    beta: float = Field(
        0.5, ge=0.0, lt=1.0, description="β: the weight of a client's previous momentum"
    )


@ROUND_DEFENSES.register("momentum", tags=["memory=M*d", "changes_rows"])
class WorkerMomentum(RoundDefense):
    """Worker momentum (Karimireddy 2021): the rule sees each client's momentum
    β·m + (1 − β)·g in place of its upload g.

    Memory O(M·d): one momentum row per client, in the server state."""

    state_parts = Table.FIELDS

    params_schema = MomentumParams
    beta: float

    def rows(
        self, kept: list[ClientUpdate], state: State, ctx: RoundContext
    ) -> tuple[list[ClientUpdate], Acted]:
        if not kept:
            return kept, Acted()
        table, acted = load_table(self, state, kept, max(ctx.num_clients, len(kept)))
        table = table.clone()
        out = []
        for u in kept:
            if u.mask is not None:
                out.append(u)
                continue
            hit = (table.ids == u.client_id).nonzero()
            g = u.delta.to(table.rows.dtype)
            if hit.numel():  # eq. (1); the first upload starts the momentum
                g = self.beta * table.rows[int(hit[0, 0])] + (1.0 - self.beta) * g
            moved = replace(u, delta=g.to(u.delta.dtype))
            table.put(moved, ctx.round)
            out.append(moved)
        acted.state = {self.key(f): getattr(table, f) for f in Table.FIELDS}
        return out, acted


__all__ = ["WorkerMomentum"]
