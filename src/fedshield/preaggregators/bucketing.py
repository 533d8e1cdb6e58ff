"""Bucketing (Karimireddy, He & Jaggi, ICLR 2022, "Byzantine-robust learning on
heterogeneous datasets via bucketing").

The rows are randomly permuted and split into ⌈n/s⌉ buckets of s consecutive rows (the
last one may be smaller); each bucket is replaced by its mean, and the rule then sees the
bucket means. Mixing dilutes the heterogeneity the Mimic attack exploits. ByzFL's
``Bucketing(s)`` computes the same for the same permutation. With weights, a bucket's value
is its members' weighted mean and its weight their sum (our choice; uniform without).
"""

from __future__ import annotations

import math

import torch
from pydantic import Field
from torch import Tensor

from fedshield.aggregators._ops import W
from fedshield.core.params import Params
from fedshield.preaggregators.base import PRE_AGGREGATORS, PreAggregator, mix_rows


class BucketingParams(Params):
    s: int = Field(2, ge=1, description="bucket size s: ⌈n/s⌉ bucket means reach the rule")


def bucketing(
    updates: Tensor, s: int, perm: Tensor, weights: Tensor | None = None
) -> tuple[Tensor, Tensor | None]:
    """``([⌈n/s⌉, d] bucket means, their weights)``: bucket b holds the rows
    ``perm[b·s : (b+1)·s]``."""
    n = updates.shape[0]
    if s < 1:
        raise ValueError(f"bucketing: s must be >= 1, got {s}")
    k = math.ceil(n / s)
    perm = perm.to(updates.device)
    bucket = torch.empty(n, dtype=torch.long, device=updates.device)
    bucket[perm] = torch.arange(n, device=updates.device) // s
    member = torch.zeros(k, n, dtype=W, device=updates.device)
    member[bucket, torch.arange(n, device=updates.device)] = 1.0
    w = member if weights is None else member * weights.to(device=updates.device, dtype=W)
    total = w.sum(dim=1, keepdim=True)
    # A bucket whose members all weigh 0 takes their plain mean (its weight stays 0).
    coef = torch.where(
        total > 0, w / torch.where(total > 0, total, 1.0), member / member.sum(1, keepdim=True)
    )
    out_w = None if weights is None else total.squeeze(1).to(weights.dtype)
    return mix_rows(coef, updates), out_w


@PRE_AGGREGATORS.register("bucketing")
class Bucketing(PreAggregator):
    """Bucketing (Karimireddy et al. 2022): the means of ⌈n/s⌉ random buckets of s rows
    reach the rule.

    The permutation is drawn from the generator the composed rule passes (seeded by the
    run's seed and the round's rows, so a resumed run draws the same buckets); without
    one, from torch's global generator as ByzFL does."""

    params_schema = BucketingParams
    random = True
    s: int

    def transform(
        self, updates: Tensor, weights: Tensor | None, generator: torch.Generator | None
    ) -> tuple[Tensor, Tensor | None]:
        device = generator.device if generator is not None else torch.device("cpu")
        perm = torch.randperm(updates.shape[0], generator=generator, device=device)
        return bucketing(updates, self.s, perm, weights)

    def rows_out(self, num_rows: int) -> int:
        return math.ceil(num_rows / self.s)


__all__ = ["Bucketing", "bucketing"]
