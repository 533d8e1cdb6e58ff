"""Robust learning rate, RLR (Ozdayi, Kantarcioglu & Gel, "Defending against Backdoors in
Federated Learning with Robust Learning Rate", AAAI 2021, eq. 3).

Per coordinate k, the server's learning rate keeps its sign when enough clients agree on
the update's sign and is flipped otherwise:

    η_k = +η if |Σ_i sign(x_ik)| ≥ θ, else −η;    Δ = η ∘ Σ_i w_i x_i / Σ_i w_i.

The server's η is the server learning rate (``server.lr``), so the rule returns the
(weighted) mean with the coordinates of low sign agreement negated. Default θ: unset,
⌈0.4·S⌉ — the paper's θ = 4 for its m = 10 agents per round; an integer fixes it.

A backdoor defense, not a Byzantine-robust rule (not tagged ``robust``): one huge row moves
the mean by its size / S. The mean is FedAvg's (:func:`~fedshield.aggregators.mean.
weighted_mean`: finite for finite rows of any size); rows holding NaN/Inf are dropped from
both the mean and the sign vote (``agg/nonfinite``).
"""

from __future__ import annotations

import math

import torch
from pydantic import Field
from torch import Tensor

from fedshield.aggregators._ops import row_sq_norms
from fedshield.aggregators.base import (
    AGGREGATORS,
    Aggregator,
    Diagnostics,
    kept_weights,
    normalised_weights,
)
from fedshield.aggregators.mean import weighted_mean
from fedshield.core.params import Params


class RLRParams(Params):
    theta: int | None = Field(
        None,
        ge=1,
        description="sign-agreement threshold θ (a count of clients); unset: ⌈0.4·S⌉, the "
        "paper's θ = 4 of m = 10",
    )


@AGGREGATORS.register("rlr", tags=["uses_weights", "reference_free"])
class RLR(Aggregator):
    """RLR (Ozdayi 2021): the mean, negated on coordinates whose sign agreement is below θ."""

    params_schema = RLRParams
    theta: int | None

    def __init__(self, theta: int | None = None) -> None:
        self._configure(theta=theta)

    def aggregate(
        self, updates: Tensor, weights: Tensor | None = None, *, reference: Tensor | None = None
    ) -> tuple[Tensor, Diagnostics]:
        w = normalised_weights(updates, weights)
        ok = torch.isfinite(row_sq_norms(updates))
        dropped = int((~ok).sum())
        x = updates if not dropped else updates[ok]
        if dropped:
            w = kept_weights("rlr", w, ok)[ok]
        s = x.shape[0]
        theta = self.theta if self.theta is not None else math.ceil(0.4 * s)
        mean, _ = weighted_mean(x, w, uniform=weights is None, owner="rlr")
        agree = torch.sign(x).sum(dim=0, dtype=torch.float64).abs()  # exact: integers ≤ S
        flip = agree < theta
        out = torch.where(flip, -mean, mean)
        return out, {
            "agg/flipped": float(flip.sum()) / max(x.shape[1], 1),
            "agg/theta": float(theta),
            "agg/nonfinite": float(dropped),
        }
