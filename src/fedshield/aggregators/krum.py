"""Krum and Multi-Krum (Blanchard et al., NeurIPS 2017), SPEC §5.

score(i) = Σ of the squared distances from g_i to its S − f − 2 nearest other updates;
Krum returns the update with the lowest score, Multi-Krum the (weighted) average of the m
lowest-scoring ones (m = S − f by default). Both need S > 2f + 2.

All S² distances come from the Gram matrix of the mean-centred rows, one pass of matmuls
(see ``_ops.centered_gram``).
"""

from __future__ import annotations

import torch
from torch import Tensor

from fedshield.aggregators._ops import centered_gram, check_int, sq_dists_from_gram
from fedshield.aggregators.base import (
    AGGREGATORS,
    Aggregator,
    ConfigError,
    Diagnostics,
    check_updates,
)


def krum_scores(updates: Tensor, f: int) -> Tensor:
    """``[S]`` Krum scores: sum of squared distances to the S − f − 2 nearest neighbours."""
    s = updates.shape[0]
    d2 = sq_dists_from_gram(centered_gram(updates)).fill_diagonal_(torch.inf)  # not self
    return d2.topk(s - f - 2, dim=1, largest=False).values.sum(dim=1)


def _validate_f(owner: str, f: int, num_clients: int) -> None:
    if 2 * f + 2 >= num_clients:
        raise ConfigError(
            f"{owner}: f={f} needs more than 2f + 2 = {2 * f + 2} clients per round, "
            f"got S={num_clients}"
        )


@AGGREGATORS.register("krum")
class Krum(Aggregator):
    """Krum (Blanchard 2017): the update closest to its S − f − 2 nearest neighbours."""

    def __init__(self, f: int = 0) -> None:
        self.f = check_int("krum", "f", f)

    def validate(self, num_clients: int) -> None:
        _validate_f("krum", self.f, num_clients)

    def aggregate(
        self, updates: Tensor, weights: Tensor | None = None, *, reference: Tensor | None = None
    ) -> tuple[Tensor, Diagnostics]:
        check_updates(updates, weights)  # a selection rule: weights play no part
        self.validate(updates.shape[0])
        scores = krum_scores(updates, self.f)
        best = int(scores.argmin())
        # clone: returning a view would let a caller write into its own input matrix
        return updates[best].clone(), {"agg/selected": float(best)}


@AGGREGATORS.register("multikrum")
class MultiKrum(Aggregator):
    """Multi-Krum (Blanchard 2017): weighted mean of the m best Krum scores (m = S − f)."""

    def __init__(self, f: int = 0, m: int | None = None) -> None:
        self.f = check_int("multikrum", "f", f)
        self.m = None if m is None else check_int("multikrum", "m", m, minimum=1)

    def _m(self, num_clients: int) -> int:
        return num_clients - self.f if self.m is None else self.m

    def validate(self, num_clients: int) -> None:
        _validate_f("multikrum", self.f, num_clients)
        if self._m(num_clients) > num_clients:
            raise ConfigError(
                f"multikrum: m={self.m} cannot exceed the S={num_clients} clients per round"
            )

    def aggregate(
        self, updates: Tensor, weights: Tensor | None = None, *, reference: Tensor | None = None
    ) -> tuple[Tensor, Diagnostics]:
        w = check_updates(updates, weights)
        s = updates.shape[0]
        self.validate(s)
        m = self._m(s)
        chosen = krum_scores(updates, self.f).topk(m, largest=False).indices
        # The selected rows keep their relative weights (uniform when weights is None, the
        # paper's form; sample counts give Flower's Multi-Krum). One GEMV, no row copies.
        coef = torch.zeros_like(w).index_copy_(0, chosen, w[chosen])
        total = coef.sum()
        if not total > 0:  # every chosen row had weight 0: fall back to their plain mean
            coef = torch.zeros_like(w).index_fill_(0, chosen, 1.0)
            total = coef.sum()
        out = (coef / total) @ updates
        return out, {"agg/num_selected": float(m)}
