"""Krum and Multi-Krum (Blanchard et al., NeurIPS 2017).

score(i) = Σ of the squared distances from g_i to its S − f − 2 nearest other updates;
Krum returns the update with the lowest score (the first one on ties), Multi-Krum the
(weighted) average of the m lowest-scoring ones (m = S − f by default). Both need
S > 2f + 2.

The S² distances come from one blocked float64 Gram pass over the mean-centred rows, with
the pairs that cancellation could spoil recomputed (``_ops.pairwise_sq_dists``): in float32
with 12 of 28 rows 10^6 σ away, the Gram trick picked another honest row than exact Krum in
27 of 30 trials; now the choice is the exact one. Rows holding NaN/Inf are dropped before
scoring (``agg/nonfinite``); S is then the number of finite rows.
"""

from __future__ import annotations

import torch
from pydantic import Field
from torch import Tensor

from fedshield.aggregators._ops import combine_rows, pairwise_sq_dists, snap_ties
from fedshield.aggregators.base import (
    AGGREGATORS,
    Aggregator,
    ByzantineCountRule,
    ConfigError,
    Diagnostics,
    dropped_note,
    f_field,
    kept_weights,
    normalised_weights,
    require_finite_rows,
)
from fedshield.core.params import Params

_F_HELP = "number of Byzantine rows tolerated: scores sum the S − f − 2 nearest (S > 2f + 2)"


class KrumParams(Params):
    f: int | None = f_field(_F_HELP)


class MultiKrumParams(Params):
    f: int | None = f_field(_F_HELP)
    m: int | None = Field(
        None, ge=1, description="rows averaged (the m best scores); None means S − f"
    )


def krum_scores(d2: Tensor, f: int) -> Tensor:
    """``[S]`` Krum scores from ``[S, S]`` squared distances: the sum over the S − f − 2
    nearest other rows."""
    s = d2.shape[0]
    others = d2.clone().fill_diagonal_(torch.inf)  # not self
    return others.topk(s - f - 2, dim=1, largest=False).values.sum(dim=1)


def _check_f(owner: str, f: int, num_rows: int, dropped: int = 0) -> None:
    if 2 * f + 2 >= num_rows:
        after = dropped_note(dropped)
        raise ConfigError(
            f"{owner}: f={f} needs more than 2f + 2 = {2 * f + 2} rows per round, "
            f"got S={num_rows}{after}"
        )


def _krum_f(num_rows: int) -> int | None:
    """The largest f with 2f + 2 < S (None when S < 3)."""
    return (num_rows - 3) // 2 if num_rows >= 3 else None


@AGGREGATORS.register("krum", tags=["robust", "reference_free", "min_clients", "selects=one"])
class Krum(ByzantineCountRule):
    """Krum (Blanchard 2017): the update closest to its S − f − 2 nearest neighbours."""

    params_schema = KrumParams
    largest_f = staticmethod(_krum_f)

    def check_f(self, f: int, num_rows: int, dropped: int = 0) -> None:
        _check_f("krum", f, num_rows, dropped)

    def aggregate(
        self, updates: Tensor, weights: Tensor | None = None, *, reference: Tensor | None = None
    ) -> tuple[Tensor, Diagnostics]:
        normalised_weights(updates, weights)  # a selection rule: weights play no part
        d2, keep = pairwise_sq_dists(updates)
        d2 = snap_ties(d2)  # equal distances compare equal: ties go to the first row
        dropped = updates.shape[0] - keep.numel()
        f = self.checked_f(keep.numel(), dropped)
        best = int(keep[krum_scores(d2, f).argmin()])
        # clone: returning a view would let a caller write into its own input matrix
        return updates[best].clone(), {"agg/selected": float(best), "agg/nonfinite": float(dropped)}


@AGGREGATORS.register(
    "multikrum", tags=["robust", "reference_free", "uses_weights", "min_clients", "selects=subset"]
)
class MultiKrum(ByzantineCountRule):
    """Multi-Krum (Blanchard 2017): weighted mean of the m best Krum scores (m = S − f)."""

    params_schema = MultiKrumParams
    largest_f = staticmethod(_krum_f)
    m: int | None

    def __init__(self, f: int | None = None, m: int | None = None) -> None:
        self._configure(f=f, m=m)

    def _m(self, num_rows: int) -> int:
        return num_rows - self.f_for(num_rows) if self.m is None else self.m

    def _check(self, num_rows: int, dropped: int = 0) -> None:
        _check_f("multikrum", self.f_for(num_rows), num_rows, dropped)
        if self._m(num_rows) > num_rows:
            after = dropped_note(dropped)
            raise ConfigError(
                f"multikrum: m={self.m} cannot exceed the S={num_rows} rows per round{after}"
            )

    def validate(self, num_rows: int) -> None:
        self._check(num_rows)

    def _reduced(self, num_rows: int) -> Aggregator | None:
        f = _krum_f(num_rows)
        if f is None:
            return None
        m = None if self.m is None else min(self.m, num_rows)
        return self.replace(f=min(f, self.f_for(num_rows)), m=m)

    def aggregate(
        self, updates: Tensor, weights: Tensor | None = None, *, reference: Tensor | None = None
    ) -> tuple[Tensor, Diagnostics]:
        w = normalised_weights(updates, weights)
        # Not snapped to ties as Krum is: which of m tied rows a subset keeps does not change
        # a valid answer (tests accept any), and snapping would hide the 1e-9 nudges by which
        # an attack probes whether its every copy is kept (attacks/_oracle.selects).
        d2, keep = pairwise_sq_dists(updates)
        s = keep.numel()
        dropped = updates.shape[0] - s
        require_finite_rows("multikrum", s, dropped)
        self._check(s, dropped)
        m = self._m(s)
        chosen = keep[krum_scores(d2, self.f_for(s)).topk(m, largest=False).indices]
        # The selected rows keep their relative weights (uniform when weights is None, the
        # paper's form; sample counts give Flower's Multi-Krum). One GEMV, no row copies.
        mask = torch.zeros_like(w, dtype=torch.bool).index_fill_(0, chosen, True)
        if bool(w[chosen].sum() > 0):
            coef = kept_weights("multikrum", w, mask)
        else:  # every chosen row had weight 0: fall back to their plain mean
            coef = mask.to(w.dtype) / m
        out = combine_rows(coef, updates, skip=~mask if dropped else None)
        return out, {"agg/num_selected": float(m), "agg/nonfinite": float(dropped)}
