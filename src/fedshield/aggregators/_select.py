"""Column-wise order statistics by selection (``numpy.partition``), for Median and
Trimmed Mean on CPU, and the one window mean of the trimmed rules (Trimmed Mean, MeaMed,
Bulyan's second step).

A full sort of each coordinate's S values does more than either rule needs: the median
needs the one or two middle values, the trimmed mean the multiset between the f-th and the
(S − f − 1)-th. ``numpy.partition`` with those ranks as ``kth`` places exactly those
values (in some order) at those positions, in O(S) per coordinate — what Flower's
``aggregate_median`` (``numpy.median``) does. bench/bench_aggregators.py times it against
the sort and ``torch.quantile`` it replaces (S = 40, d = 10^5, one thread).

Only for CPU tensors of float32/float64 (numpy's dtypes; on accelerators and for other
dtypes the rules keep their torch kernels). NaN is not ordered by ``partition`` the way the
rules need (it moves to the end), so the callers mark NaN columns themselves.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import Tensor

from fedshield.aggregators._ops import W, column_blocks


def selectable(x: Tensor) -> bool:
    """Whether :func:`partitioned` applies to ``x`` (a 2-D CPU float32/float64 tensor)."""
    return x.device.type == "cpu" and x.dtype in (torch.float32, torch.float64) and x.dim() == 2


#: Elements per column block of a selection: the partition copies its block (in the input's
#: dtype, not float64), and blocks of 2^22 (16 MiB in float32) measured ~15 % faster than
#: the 2^18 of the float64 helpers (``_ops.column_blocks``), bounding the copy all the same.
_SELECT_ELEMS = 1 << 22


def selection_blocks(x: Tensor) -> list[slice]:
    """Column slices of ``x`` for :func:`partitioned`, about ``_SELECT_ELEMS`` each."""
    s, d = x.shape
    step = max(1024, _SELECT_ELEMS // max(s, 1))
    return [slice(i, min(i + step, d)) for i in range(0, d, step)]


def partitioned(x: Tensor, ranks: list[int]) -> np.ndarray:
    """``x`` partitioned column-wise at ``ranks`` (a numpy copy; ``x`` is not modified):
    row r holds the value of rank r for every r in ``ranks``, and the rows between two
    ranks the values between them, in some order. NaN ranks last, so with rank S − 1 among
    ``ranks`` the last row says which columns hold a NaN (as ``numpy.median`` checks)."""
    return np.partition(x.detach().numpy(), sorted(set(ranks)), axis=0)


def closest_window_start(s: Tensor, size: int) -> Tensor:
    """Per column of the sorted ``[n, b]`` float64 block ``s``, the first start k of a window
    ``s[k : k + size]`` holding ``size`` values closest to the column's median (the mean of
    the two middle values for even n).

    Distances to the median fall then rise along a sorted column, so such a set of values is
    a window, and a window is one exactly when its farthest value is no farther than the
    nearest value outside it: max(δ_k, δ_{k+size−1}) ≤ min(δ_{k−1}, δ_{k+size}). (The
    smallest *largest* distance alone is not enough: on [−1, −1, 0, 0, 1] with size 3 the
    window [−1, −1, 0] ties with [−1, 0, 0] but drops a 0.) On ties the lowest window wins;
    ByzFL's ``argpartition`` is arbitrary there, so any tied window is a valid answer.
    Computed distances keep both monotone runs (rounding is monotone), so a window passes
    the test in floating point too.
    """
    n = s.shape[0]
    mid = n // 2
    med = s[mid] if n % 2 else 0.5 * (s[mid - 1] + s[mid])
    dist = (s - med).abs()
    far = dist.new_full((1, s.shape[1]), torch.inf)
    inner = torch.maximum(dist[: n - size + 1], dist[size - 1 :])
    outer = torch.minimum(torch.cat([far, dist[: n - size]]), torch.cat([dist[size:], far]))
    return (inner <= outer).to(torch.int8).argmax(dim=0)  # the first valid start


def window_mean(x: Tensor, size: int, start: int | None = None) -> Tensor:
    """``[d]`` float64: per column of ``x`` ([n, d], finite), the mean of ``size``
    consecutive values of the sorted column — from rank ``start`` on (the trimmed mean:
    start = f, size = n − 2f), or, with ``start`` None, the ``size`` values closest to the
    column's median (:func:`closest_window_start`: MeaMed, Bulyan).

    A fixed window on CPU selects its ranks (:func:`partitioned`) instead of sorting. The
    mean is a float64 sum of the kept values, not (sum − dropped values): that subtraction
    cancels catastrophically when one Byzantine value is huge, the case the rules exist for.
    """
    out = torch.empty(x.shape[1], dtype=W, device=x.device)
    if start is not None and selectable(x):
        for blk in selection_blocks(x):
            kept = partitioned(x[:, blk], [start, start + size - 1])[start : start + size]
            out[blk] = torch.from_numpy(kept.mean(axis=0, dtype=np.float64))
        return out
    span = torch.arange(size, device=x.device)[:, None]
    for blk in column_blocks(x):
        s = torch.sort(x[:, blk], dim=0).values.to(W)
        first = closest_window_start(s, size) if start is None else torch.full_like(s[0], start)
        out[blk] = torch.gather(s, 0, first.long()[None, :] + span).mean(dim=0)
    return out


__all__ = [
    "closest_window_start",
    "partitioned",
    "selectable",
    "selection_blocks",
    "window_mean",
]
