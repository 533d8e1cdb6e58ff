"""Short rounds padded with the server's own zero rows (docs/faults.md, "Liveness").

A robust rule outvotes the f Byzantine rows of the sampled cohort only on enough rows
(Median 2f + 1, Krum 2f + 3, …), and f belongs to the cohort the server *asked*: silence
never lowers it. When honest clients drop out, time out or send rows the checks refuse, a
round keeps fewer rows than that. Skipping it keeps θ safe but stops training: at M = 50,
S = 10, 30 % fixed attackers and 30 % honest dropout a Median run skipped 20–25 of 30
rounds, and ended 44 points under its clean twin.

Padding completes the round instead with p = needed − n rows the server makes itself:

    rows_t = kept_t ∪ {0, …, 0}   (p zero pseudo-gradients: votes to keep θ)

Each zero row is honest by construction, so the rows hold at most f Byzantine ones among
at least ``needed`` — the condition under which the rule outvotes f — whatever made the
honest rows go missing (an attacker who silences honest clients gets zeros in their
place). The rule's output then lies within what it would give on honest rows and "no
step" (a coordinate-wise Median or Trimmed Mean between the honest rows' values and 0): a
padded round moves θ less, never further than the honest rows would. It is the same
safety as a skipped round (which is the all-zero step), bought per missing row instead of
per round.

A zero row carries the server's current buffers (no BatchNorm change), the lower median
of the kept rows' (already capped) counts as its weight, and full coverage of the blocks
the kept rows' masks use; client ids are negative, never a client's. Rows with method
extras (SCAFFOLD's Δh, FedCART's prototypes) have no neutral value: such a round is
skipped as before. Pad rows reach the rule only: round defenses judge, cache and bound on
the clients' own rows.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

import torch
from torch import Tensor

from fedshield.algorithms.server.cohort import cap_for_f
from fedshield.core.context import ClientUpdate


def can_pad(rows: Sequence[ClientUpdate]) -> bool:
    """True when zero rows are a neutral vote next to ``rows``: at least one row to take
    the shapes from, and no method extras (they have no neutral value)."""
    return bool(rows) and not any(u.extras for u in rows)


def zero_rows(rows: Sequence[ClientUpdate], count: int, buffers: Tensor) -> list[ClientUpdate]:
    """``count`` zero rows shaped like ``rows`` (module docstring): delta 0, ``buffers``
    (the server's current ones), the lower median count, a full mask where rows have
    masks; client ids −1, −2, …"""
    if count <= 0:
        return []
    like = rows[0]
    counts = sorted(int(u.num_examples) for u in rows)
    weight = counts[(len(counts) - 1) // 2]
    masks = [u.mask for u in rows if u.mask is not None]
    mask = None if not masks else torch.ones_like(masks[0], dtype=torch.bool)
    delta = torch.zeros_like(like.delta)
    return [
        ClientUpdate(-(k + 1), delta, weight, buffers.to(like.buffers.device), mask=mask)
        for k in range(count)
    ]


def padded(
    rows: list[ClientUpdate], needed: int | None, buffers: Tensor, f: int = 0
) -> tuple[list[ClientUpdate], int]:
    """``rows`` followed by the zero rows that bring them to ``needed`` (none when already
    there, when ``needed`` is None or when :func:`can_pad` refuses) and how many were added.
    The counts are then capped again so that no ``f`` rows hold half of the weight
    (:func:`~fedshield.algorithms.server.cohort.cap_for_f`): the cap the round step applied
    before could not act on fewer than 2f + 1 rows."""
    if needed is None or len(rows) >= needed or not can_pad(rows):
        return rows, 0
    extra = zero_rows(rows, needed - len(rows), buffers)
    out = rows + extra
    limit = cap_for_f([int(u.num_examples) for u in out], f)
    if limit is not None:
        out = [replace(u, num_examples=limit) if u.num_examples > limit else u for u in out]
    return out, len(extra)


__all__ = ["can_pad", "padded", "zero_rows"]
