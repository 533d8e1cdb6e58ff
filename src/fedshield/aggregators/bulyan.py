"""Bulyan (El Mhamdi, Guerraoui & Rouault, ICML 2018), with Krum as the selector.

With n rows and f Byzantine ones (n ≥ 4f + 3):

1. select θ = n − 2f rows by repeated Krum: pick the row with the lowest Krum score, remove
   it, rescore the rest; on the shrinking set of n′ rows a score sums the squared distances
   to the max(1, n′ − f − 2) nearest others (Flower's neighbour count);
2. per coordinate, keep the β = θ − 2f selected values closest to the coordinate-wise median
   of the θ selected rows (the mean of the two middle values for even θ) and average them.

This is Flower's ``aggregate_bulyan(results, f, aggregate_krum, to_keep=0)`` on the same
inputs (a reference test). Weights play no part. Ties go to the first row, as in Flower;
they do occur (late rounds score over one neighbour, so two mutual nearest neighbours tie
exactly), which makes Bulyan, unlike the other rules, depend on the row order.

The S² distances are computed once (the float64 Gram pass with cancellation repair of
``_ops.pairwise_sq_dists``); each Krum round only re-reads that matrix. In step 2 the β
values closest to the median are a window of the sorted column
(:func:`~fedshield.aggregators._select.window_mean`; on ties the lowest window); the window
mean is taken in float64. Rows holding
NaN/Inf are dropped first (``agg/nonfinite``).
"""

from __future__ import annotations

import torch
from torch import Tensor

from fedshield.aggregators._ops import pairwise_sq_dists, snap_ties, to_dtype
from fedshield.aggregators._select import window_mean
from fedshield.aggregators.base import (
    AGGREGATORS,
    ByzantineCountRule,
    ConfigError,
    Diagnostics,
    dropped_note,
    f_field,
    normalised_weights,
)
from fedshield.core.params import Params


class BulyanParams(Params):
    f: int | None = f_field("number of Byzantine rows tolerated (needs S ≥ 4f + 3)")


def krum_selection(d2: Tensor, f: int, count: int) -> list[int]:
    """Indices of ``count`` rows chosen by repeated Krum on ``[n, n]`` squared distances."""
    remaining = list(range(d2.shape[0]))
    chosen: list[int] = []
    for _ in range(count):
        n = len(remaining)
        idx = torch.tensor(remaining, device=d2.device)
        sub = d2[idx][:, idx].fill_diagonal_(torch.inf)
        k = min(max(1, n - f - 2), n - 1)
        scores = sub.topk(k, dim=1, largest=False).values.sum(1) if k > 0 else sub[:, 0] * 0
        chosen.append(remaining.pop(int(scores.argmin())))
    return chosen


@AGGREGATORS.register("bulyan", tags=["robust", "reference_free", "min_clients"])
class Bulyan(ByzantineCountRule):
    """Bulyan (El Mhamdi 2018): repeated Krum selection, then a trimmed mean around the median."""

    params_schema = BulyanParams

    @staticmethod
    def largest_f(num_rows: int) -> int | None:
        return (num_rows - 3) // 4 if num_rows >= 3 else None

    def check_f(self, f: int, num_rows: int, dropped: int = 0) -> None:
        if num_rows < 4 * f + 3:
            after = dropped_note(dropped)
            raise ConfigError(
                f"bulyan: f={f} needs at least 4f + 3 = {4 * f + 3} rows per round, "
                f"got S={num_rows}{after}"
            )

    def aggregate(
        self, updates: Tensor, weights: Tensor | None = None, *, reference: Tensor | None = None
    ) -> tuple[Tensor, Diagnostics]:
        normalised_weights(updates, weights)  # weights play no part
        d2, keep = pairwise_sq_dists(updates)
        d2 = snap_ties(d2)  # equal distances compare equal: ties go to the first row
        n = keep.numel()
        dropped = updates.shape[0] - n
        f = self.checked_f(n, dropped)
        theta = n - 2 * f
        chosen = keep[torch.tensor(krum_selection(d2, f, theta), device=keep.device)]
        out = window_mean(updates[chosen], theta - 2 * f)
        return to_dtype(out, updates.dtype), {
            "agg/num_selected": float(theta),
            "agg/nonfinite": float(dropped),
        }
