"""Short rounds padded with zero rows (fedshield.algorithms.server.padding)."""

from __future__ import annotations

import torch

from fedshield.aggregators import AGGREGATORS
from fedshield.algorithms.server.cohort import rows_needed
from fedshield.algorithms.server.padding import can_pad, padded, zero_rows
from fedshield.core.context import ClientUpdate

D = 6


def _row(cid: int, value: float, n: int = 10, mask: torch.Tensor | None = None) -> ClientUpdate:
    return ClientUpdate(cid, torch.full((D,), value), n, torch.arange(3.0), mask=mask)


def test_zero_rows_are_neutral_votes_shaped_like_the_kept_rows() -> None:
    mask = torch.tensor([True, True, False, False, True, False])
    rows = [_row(0, 1.0, 7, mask), _row(1, 2.0, 30), _row(2, 3.0, 12)]
    buffers = torch.tensor([5.0, 6.0, 7.0])
    out = zero_rows(rows, 2, buffers)
    assert [u.client_id for u in out] == [-1, -2]
    for u in out:
        assert torch.equal(u.delta, torch.zeros(D)) and torch.equal(u.buffers, buffers)
        assert u.num_examples == 12  # the lower median of 7, 12, 30
        assert u.mask is not None and bool(u.mask.all()) and u.mask.dtype == torch.bool
        assert not u.extras
    assert zero_rows(rows, 0, buffers) == []
    assert zero_rows([_row(0, 1.0)], 1, buffers)[0].mask is None  # no masks: full coverage


def test_padded_adds_up_to_needed_and_recaps_the_counts() -> None:
    """Two attackers claiming 1000 samples each among 2 honest rows of 10 (the round step's
    cap cannot act on 4 rows with f = 2): after 1 zero row the counts are capped so that the
    2 largest hold less than half of the weight."""
    rows = [_row(0, 0.1), _row(1, 0.2), _row(2, 9.0, 1000), _row(3, 9.0, 1000)]
    out, added = padded(rows, 5, torch.zeros(0), f=2)
    assert added == 1 and len(out) == 5 and out[:4][0].client_id == 0
    counts = sorted((u.num_examples for u in out), reverse=True)
    assert sum(counts[:2]) < sum(counts[2:])
    assert padded(rows, 4, torch.zeros(0), f=2) == (rows, 0)  # enough rows already
    assert padded(rows, None, torch.zeros(0)) == (rows, 0)


def test_rows_with_method_extras_are_not_padded() -> None:
    extra = ClientUpdate(1, torch.ones(D), 10, torch.zeros(0), extras={"h": torch.ones(2)})
    rows = [_row(0, 0.1), extra]
    assert not can_pad(rows) and not can_pad([])
    assert padded(rows, 5, torch.zeros(0)) == (rows, 0)


def test_a_padded_median_stays_between_the_honest_rows_and_no_step() -> None:
    """The safety the module promises, on random rounds: f attackers at ±1e30 among n < 2f + 1
    kept rows; after padding to 2f + 1 the coordinate-wise median lies in
    [min(honest ∪ 0), max(honest ∪ 0)] on every coordinate."""
    g = torch.Generator().manual_seed(0)
    median = AGGREGATORS.build("median")
    for trial in range(200):
        f = int(torch.randint(1, 6, (1,), generator=g))
        honest = int(torch.randint(1, f + 1, (1,), generator=g))  # n = f + honest ≤ 2f
        sign = 1.0 if trial % 2 else -1.0
        rows = [
            ClientUpdate(k, torch.randn(D, generator=g), 10, torch.zeros(0))
            for k in range(honest)
        ]
        rows += [_row(honest + k, sign * 1e30) for k in range(f)]
        need = rows_needed(median, f)
        assert need == 2 * f + 1
        out, added = padded(rows, need, torch.zeros(0), f)
        assert added == need - honest - f
        got = median(torch.stack([u.delta for u in out]))
        good = torch.stack([u.delta for u in rows[:honest]] + [torch.zeros(D)])
        assert bool((got >= good.min(0).values).all() and (got <= good.max(0).values).all())
