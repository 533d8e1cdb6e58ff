"""Cached aggregation: the rule sees every client's latest screened upload, so the
Byzantine share it faces is the population's, not the sampled cohort's.

With fixed attackers and sampled cohorts the share of one cohort varies (docs/cross-round.md: at
M = 50, S = 10 and 30 % attackers, cohorts hold 1–6, and a 5- or 6-attacker cohort
outvotes Median). In the spirit of delayed momentum aggregation (D-Byz-SGDM, 2025: the
server aggregates the latest momentum of *every* worker, fresh or delayed), the server
keeps a table of the latest upload of every client it has seen and hands the rule, each
round,

    rows_t = {g_m^t : m ∈ kept_t} ∪ {g_m^{τ_m} : m ∉ kept_t, m seen, t − τ_m ≤ max_age}

where τ_m is the round of client m's latest upload. Each cached row is the client's own
upload that passed the upload checks of its round (with the count its round's cap left
it); a client never seen has no row, so the server updates only from rows it trusts as
much as this round's. Rows carry their coverage masks, so with depth tiers the rule runs
per coverage group on the population's holders of each block (a tier whose sampled
holders are attackers this round is outvoted by its cached honest holders).

A rule with a Byzantine count f configured for S rows gets f' = ⌈n·p + 2√(n·p(1 − p))⌉,
p = f/S, on the n rows (the same share plus two standard deviations: the cached rows are a
sample of the population), within what n rows allow. Cached rows are older than this round's θ
(stale by up to M/S rounds on average); ``max_age`` (rounds) drops older ones.

Memory: O(M·d) — per client slot its row (d values of θ's dtype), its coverage mask
(d bools), its buffers, its count, id and round — in the server state under ``cache/``,
so checkpoints, resumes and a Flower strategy's ``state`` carry it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch
from pydantic import Field
from torch import Tensor

from fedshield.core.context import ClientUpdate, RoundContext
from fedshield.core.params import Params
from fedshield.crossround.base import ROUND_DEFENSES, Acted, RoundDefense, State, reset_note


class CacheParams(Params):
    max_age: int | None = Field(
        None,
        ge=0,
        description="rounds a cached row stays usable (0: only this round's); unset: until "
        "the client uploads again",
    )


@dataclass
class Table:
    """The cache: slot s holds client ``ids[s]`` (−1: free), uploaded in ``rounds[s]``."""

    ids: Tensor  # [C] int64
    rounds: Tensor  # [C] int64
    counts: Tensor  # [C] int64
    rows: Tensor  # [C, d]
    masks: Tensor  # [C, d] bool
    has_mask: Tensor  # [C] bool
    buffers: Tensor  # [C, b]

    FIELDS = ("ids", "rounds", "counts", "rows", "masks", "has_mask", "buffers")

    @classmethod
    def empty(cls, capacity: int, delta: Tensor, buffers: Tensor) -> Table:
        c, d, dev = capacity, delta.numel(), delta.device
        i64 = torch.int64
        return cls(
            ids=torch.full((c,), -1, dtype=i64, device=dev),
            rounds=torch.zeros(c, dtype=i64, device=dev),
            counts=torch.zeros(c, dtype=i64, device=dev),
            rows=delta.new_zeros(c, d),
            masks=torch.zeros(c, d, dtype=torch.bool, device=dev),
            has_mask=torch.zeros(c, dtype=torch.bool, device=dev),
            buffers=buffers.new_zeros(c, buffers.numel()),
        )

    def grown(self, capacity: int) -> Table:
        """The same table with at least ``capacity`` slots (new slots free)."""
        extra = capacity - self.ids.shape[0]
        if extra <= 0:
            return self
        more = Table.empty(extra, self.rows[0], self.buffers[0])
        return Table(*(torch.cat([getattr(self, f), getattr(more, f)]) for f in Table.FIELDS))

    def clone(self) -> Table:
        return Table(*(getattr(self, f).clone() for f in Table.FIELDS))

    def slot_for(self, client_id: int) -> int:
        """The client's slot, else a free one, else the oldest (evicted)."""
        hit = (self.ids == client_id).nonzero()
        if hit.numel():
            return int(hit[0, 0])
        free = (self.ids < 0).nonzero()
        if free.numel():
            return int(free[0, 0])
        return int(torch.argmin(self.rounds))

    def put(self, u: ClientUpdate, rnd: int) -> None:
        s = self.slot_for(u.client_id)
        self.ids[s], self.rounds[s], self.counts[s] = u.client_id, rnd, int(u.num_examples)
        self.rows[s] = u.delta.to(self.rows.device, self.rows.dtype)
        self.has_mask[s] = u.mask is not None
        self.masks[s] = False if u.mask is None else u.mask.to(self.masks.device)
        if self.buffers.shape[1]:
            self.buffers[s] = u.buffers.to(self.buffers.device, self.buffers.dtype)

    def update_of(self, s: int) -> ClientUpdate:
        return ClientUpdate(
            client_id=int(self.ids[s]),
            delta=self.rows[s],
            num_examples=int(self.counts[s]),
            buffers=self.buffers[s],
            mask=self.masks[s] if bool(self.has_mask[s]) else None,
        )


def load_table(
    defense: RoundDefense, state: State, kept: list[ClientUpdate], capacity: int
) -> tuple[Table, Acted]:
    """``defense``'s :class:`Table` from the server state (its ``<name>/<field>`` entries), at
    least ``capacity`` slots; a fresh one (and a reset note) when they are malformed."""
    like, buffers = kept[0].delta, kept[0].buffers
    fresh = Table.empty(capacity, like, buffers)
    stored = {f: state.get(defense.key(f)) for f in Table.FIELDS}
    if all(v is None for v in stored.values()):
        return fresh, Acted()
    if any(v is None for v in stored.values()):
        return fresh, reset_note(defense.name, "(missing fields)")
    t = Table(**{f: v.to(like.device) for f, v in stored.items() if v is not None})
    c, d, b = t.ids.shape[0] if t.ids.dim() == 1 else -1, like.numel(), buffers.numel()
    shapes = {
        "ids": ((c,), torch.int64),
        "rounds": ((c,), torch.int64),
        "counts": ((c,), torch.int64),
        "rows": ((c, d), like.dtype),
        "masks": ((c, d), torch.bool),
        "has_mask": ((c,), torch.bool),
        "buffers": ((c, b), buffers.dtype),
    }
    for f, (shape, dtype) in shapes.items():
        v = getattr(t, f)
        if c < 0 or tuple(v.shape) != shape or v.dtype != dtype:
            return fresh, reset_note(defense.name, f"{f}")
    if bool((t.counts < 0).any()) or bool((t.ids < -1).any()):
        return fresh, reset_note(defense.name, "(negative counts or ids)")
    return t.grown(capacity), Acted()


def cached_rows(
    table: Table, kept: list[ClientUpdate], rnd: int, max_age: int | None
) -> tuple[Table, list[ClientUpdate], int]:
    """Put ``kept`` into a copy of ``table``; return it (rows older than ``max_age`` freed),
    the rows the rule sees (``kept`` in order, then the other clients' cached rows by client
    id) and the age of the oldest row used."""
    table = table.clone()
    for u in kept:
        table.put(u, rnd)
    if max_age is not None:
        old = (table.ids >= 0) & (rnd - table.rounds > max_age)
        table.ids[old] = -1
    fresh = {u.client_id for u in kept}
    others = sorted(
        (int(cid), s) for s, cid in enumerate(table.ids.tolist()) if cid >= 0 and cid not in fresh
    )
    rows = list(kept) + [table.update_of(s) for _, s in others]
    ages = [rnd - int(table.rounds[s]) for _, s in others]
    return table, rows, max(ages, default=0)


def scaled_f(f: int, num_rows: int, cohort: int, largest: int | None) -> int:
    """f' = ⌈n·p + 2·√(n·p·(1 − p))⌉ with p = f/S: the share the rule was configured for on
    the n rows, plus two standard deviations of a binomial count — the cached rows are a
    sample of the population (and under ``per_round`` any client's latest row may be a
    Byzantine one), so their Byzantine count fluctuates around n·p; at most ``largest``."""
    p = min(max(f / max(cohort, 1), 0.0), 1.0)
    expected = num_rows * p
    out = math.ceil(expected + 2.0 * math.sqrt(expected * (1.0 - p)) - 1e-9)
    return out if largest is None else max(0, min(out, largest))


# adds_uninvited: rows of clients outside the cohort reach the rule, so zero rows padding a
# short round bound nothing there (their attackers are the population's): it is skipped.
@ROUND_DEFENSES.register(
    "cache", tags=["memory=M*d", "changes_rows", "caches_uploads", "adds_uninvited"]
)
class CachedAggregation(RoundDefense):
    """Cached aggregation (D-Byz-SGDM-style): the rule sees every client's latest screened
    upload, so the attacker share is the population's.

    Memory O(M·d): one row, mask and buffers per client, in the server state."""

    state_parts = Table.FIELDS

    params_schema = CacheParams
    max_age: int | None

    def rows(
        self, kept: list[ClientUpdate], state: State, ctx: RoundContext
    ) -> tuple[list[ClientUpdate], Acted]:
        if not kept:
            return kept, Acted()
        capacity = max(ctx.num_clients, len(kept))
        table, acted = load_table(self, state, kept, capacity)
        table, rows, oldest = cached_rows(table, kept, ctx.round, self.max_age)
        acted.state = {self.key(f): getattr(table, f) for f in Table.FIELDS}
        acted.metrics |= {
            f"defense/{self.name}/rows": float(len(rows)),
            f"defense/{self.name}/cached": float(len(rows) - len(kept)),
            f"defense/{self.name}/oldest": float(oldest),
        }
        return rows, acted

    def rule(self, rule: Any, num_rows: int, ctx: RoundContext) -> Any:
        """The rule with its f scaled to the rows (:func:`scaled_f`); itself without f."""
        f = getattr(rule, "f", None)
        if not isinstance(f, int) or isinstance(f, bool) or num_rows <= len(ctx.cohort):
            return rule
        largest_f = getattr(rule, "largest_f", None)
        largest = largest_f(num_rows) if callable(largest_f) else None
        new = scaled_f(f, num_rows, len(ctx.cohort), largest)
        return rule if new == f else rule.replace(f=new)


__all__ = ["CachedAggregation", "Table", "cached_rows", "load_table", "scaled_f"]
