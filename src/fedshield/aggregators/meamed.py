"""Mean around the median, MeaMed (Xie, Koyejo & Gupta, "Generalized Byzantine-tolerant SGD",
2018), as ByzFL 0.0.11's ``Meamed(f)``.

Per coordinate k, the mean of the S − f values closest to the coordinate's median (the mean
of the two middle values for even S, ``torch.quantile(q=0.5)`` as ByzFL):

    [MeaMed_f(x_1..x_S)]_k = (1/(S − f)) Σ_{j ≤ S−f} [x_{π_k(j)}]_k,
    |[x_{π_k(1)}]_k − med_k| ≤ … ≤ |[x_{π_k(S)}]_k − med_k|.

Needs 2f < S (ByzFL's condition). The S − f values closest to the median are a window of
the sorted column (Bulyan's second step, :func:`~fedshield.aggregators._select.
window_mean`), averaged in float64; where several windows tie (duplicated values at equal
distance on both sides) the lowest is taken — ByzFL's ``argpartition`` picks any, and every
tied window is a valid answer. Weights play no part (an order statistic).
Rows holding NaN/Inf are dropped first (``agg/nonfinite``); S is then the number of finite
rows.
"""

from __future__ import annotations

from torch import Tensor

from fedshield.aggregators._majority import HonestMajorityRule
from fedshield.aggregators._ops import to_dtype
from fedshield.aggregators._select import window_mean
from fedshield.aggregators.base import AGGREGATORS, Diagnostics, f_params, normalised_weights
from fedshield.aggregators.median import finite_rows

MeaMedParams = f_params(
    "MeaMedParams",
    "number of Byzantine rows tolerated: each coordinate averages the S − f values "
    "closest to its median (needs 2f < S)",
    __name__,
)


@AGGREGATORS.register("meamed", tags=["robust", "reference_free", "min_clients"])
class MeaMed(HonestMajorityRule):
    """MeaMed (Xie 2018): per coordinate, the mean of the S − f values closest to the median."""

    params_schema = MeaMedParams

    def aggregate(
        self, updates: Tensor, weights: Tensor | None = None, *, reference: Tensor | None = None
    ) -> tuple[Tensor, Diagnostics]:
        normalised_weights(updates, weights)  # weights play no part
        x, dropped = finite_rows("meamed", updates)
        f = self.checked_f(x.shape[0], dropped)
        out = window_mean(x, x.shape[0] - f)
        return to_dtype(out, updates.dtype), {"agg/nonfinite": float(dropped)}
