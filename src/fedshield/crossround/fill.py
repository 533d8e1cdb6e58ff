"""Filling a short round from cached rows: an invited client that did not answer lends the
rule its latest screened upload, so ordinary faults do not stop a robust run
(docs/faults.md, "Liveness").

A robust rule outvotes f rows only on enough rows (Median 2f + 1, Krum 2f + 3, ...), and f
belongs to the *invited* cohort — silence never lowers it (:mod:`fedshield.algorithms.
server.cohort`). With honest clients dropping out, a round that keeps fewer rows than that
is skipped: at M = 50, S = 10, Median f = 4 and 30 % honest dropout, 85 % of rounds. The
server keeps each client's latest screened upload (as the ``cache`` defense does) and, when
a round keeps fewer rows than the rule needs,

    rows_t = kept_t ∪ {g_m^{τ_m} : m ∈ invited_t, m sent nothing, freshest first}

until the rule has the rows it needs (``max_age`` rounds at most). Every row belongs to an
invited client and each invited client gives at most one row, so the Byzantine rows are at
most the attackers of the invited cohort — the f the rule already outvotes — whatever the
faults: an attacker who silences k honest clients of the cohort hands the rule their
cached honest rows, and training stops for no k while the silenced clients have a row in
the cache. A client whose upload the checks rejected this round is not filled in (the
round's f was lowered for it), and a client never seen has no row. (Under ``attack.mode =
"per_round"`` a cached row may come from a round its client attacked in, so the builder
refuses the pair.) Unlike ``cache``, rows
of clients that were not invited never reach the rule: the share it faces is the invited
cohort's, stated at build time, not the population's. Cached rows are stale (a client's
latest upload is some rounds old); fresh rows always come first.

Pair it with ``faults.invite = "population"`` when clients are unavailable: drawn from the
clients online, a cohort over-represents the always-online attackers (46 % instead of 30 %
at availability 0.5) and filling cannot undo that; drawn from all M, an offline invitee is
a missing row that its cached row fills.

Memory O(M·d), in the server state under ``fill/`` (checkpoints and resumes carry it).
"""

from __future__ import annotations

from pydantic import Field

from fedshield.algorithms.server.base import ServerRound
from fedshield.core.context import ClientUpdate
from fedshield.core.params import Params
from fedshield.crossround.base import ROUND_DEFENSES, Acted, RoundDefense
from fedshield.crossround.cache import Table, load_table


class FillParams(Params):
    max_age: int | None = Field(
        None,
        ge=1,
        description="rounds a cached row may be old to fill in; unset: any age",
    )


def fill_rows(
    table: Table,
    kept: list[ClientUpdate],
    invited: tuple[int, ...],
    sent: set[int],
    rnd: int,
    needed: int | None,
    max_age: int | None,
) -> tuple[Table, list[ClientUpdate], int]:
    """Put ``kept`` into a copy of ``table``; return it, ``kept`` followed by the cached rows
    of invited clients that sent nothing (not in ``sent``), freshest first, until there are
    ``needed`` rows (none when ``needed`` is None or already met), and the oldest row's age."""
    table = table.clone()
    for u in kept:
        table.put(u, rnd)
    if needed is None or len(kept) >= needed:
        return table, list(kept), 0
    missing = set(invited) - sent - {u.client_id for u in kept}
    slots = [
        (int(table.rounds[s]), s)
        for s, cid in enumerate(table.ids.tolist())
        if cid in missing and (max_age is None or rnd - int(table.rounds[s]) <= max_age)
    ]
    slots.sort(key=lambda p: (-p[0], int(table.ids[p[1]])))  # freshest, then by client id
    chosen = slots[: needed - len(kept)]
    rows = list(kept) + [table.update_of(s) for _, s in chosen]
    return table, rows, max((rnd - r for r, _ in chosen), default=0)


@ROUND_DEFENSES.register("fill", tags=["memory=M*d", "changes_rows", "caches_uploads"])
class FillMissing(RoundDefense):
    """A short round is completed with the latest cached rows of the invited clients that
    did not answer, up to the rows the rule needs for the cohort's f (module docstring).

    Memory O(M·d): one row, mask and buffers per client, in the server state."""

    state_parts = Table.FIELDS

    params_schema = FillParams
    max_age: int | None

    def complete(
        self, rnd: ServerRound, needed: int | None, sent: set[int]
    ) -> tuple[list[ClientUpdate], Acted]:
        kept, state, ctx = rnd.updates, rnd.state, rnd.ctx
        if not kept:
            return kept, Acted()
        capacity = max(ctx.num_clients, len(kept))
        table, acted = load_table(self, state, kept, capacity)
        table, rows, oldest = fill_rows(
            table, kept, ctx.cohort, sent, ctx.round, needed, self.max_age
        )
        acted.state = {self.key(f): getattr(table, f) for f in Table.FIELDS}
        if len(rows) > len(kept):
            acted.metrics |= {
                f"defense/{self.name}/filled": float(len(rows) - len(kept)),
                f"defense/{self.name}/oldest": float(oldest),
            }
        return rows, acted


__all__ = ["FillMissing", "fill_rows"]
