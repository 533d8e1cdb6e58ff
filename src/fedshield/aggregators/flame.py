"""FLAME (Nguyen, Rieger, Chen, Yalame, Möllering, Fereidooni, Marchal, Miettinen,
Mirhoseini, Zeitouni, Koushanfar, Sadeghi & Schneider, USENIX Security 2022, Algorithm 1).

1. **Filter**: HDBSCAN on the pairwise cosine distances of the updates, with
   ``min_cluster_size = ⌊S/2⌋ + 1`` (and ``min_samples = 1``, single cluster allowed, as
   the authors' code): the rows of the cluster are admitted, the others are outliers. The
   paper clusters the local models θ_i; their cosine distances differ from the updates'
   only by the common θ^t, which would make every row look alike late in training, so the
   updates θ_i − θ^t are clustered (as Blades and most re-implementations do).
2. **Clip**: S_t = the median of every row's norm ‖θ_i − θ^t‖; admitted rows longer than
   S_t are scaled to it, then averaged.
3. **Noise**: Gaussian N(0, (λ·S_t)²) per coordinate added to the aggregate, λ =
   ``noise`` = 0.001 (the paper's value for image classification; 0 turns it off). The
   server adds η_g·Δ, so with η_g ≠ 1 the noise scales with η_g as the clipped mean does.
   The noise is drawn from a generator seeded by ``seed`` and the rows
   (:mod:`fedshield.aggregators._seeding`): fresh every round, a function of the input.

When HDBSCAN finds no cluster (every row noise) or S < 3, every row is admitted
(``agg/fallback``). Weights play no part; rows holding NaN/Inf are dropped first
(``agg/nonfinite``).
"""

from __future__ import annotations

import numpy as np
import torch
from pydantic import Field
from torch import Tensor

from fedshield.aggregators._cluster import FiniteRows
from fedshield.aggregators._ops import W, to_dtype
from fedshield.aggregators._seeding import input_generator
from fedshield.aggregators.base import AGGREGATORS, Aggregator, Diagnostics, normalised_weights
from fedshield.core.params import Params


class FLAMEParams(Params):
    noise: float = Field(
        0.001, ge=0.0, description="noise level λ: σ = λ · S_t, S_t the median norm (0: none)"
    )
    seed: int = Field(0, ge=0, description="seed of the noise")


def hdbscan_admitted(dist: Tensor) -> tuple[Tensor, bool]:
    """``(admitted indices, fell back)``: the largest HDBSCAN cluster of the rows."""
    from sklearn.cluster import HDBSCAN

    k = dist.shape[0]
    if k < 3:
        return torch.arange(k, device=dist.device), True
    labels = (
        HDBSCAN(
            min_cluster_size=k // 2 + 1,
            min_samples=1,
            metric="precomputed",
            allow_single_cluster=True,
            copy=False,  # our own fresh array
        )
        .fit(dist.cpu().numpy())
        .labels_
    )
    if not (labels >= 0).any():
        return torch.arange(k, device=dist.device), True
    counts = np.bincount(labels[labels >= 0])
    return torch.as_tensor(
        np.flatnonzero(labels == int(counts.argmax())), device=dist.device
    ), False


@AGGREGATORS.register("flame", tags=["robust", "reference_free"])
class FLAME(Aggregator):
    """FLAME (Nguyen 2022): HDBSCAN on cosine distances, clip to the median norm, add noise."""

    params_schema = FLAMEParams
    noise: float
    seed: int

    def __init__(self, noise: float = 0.001, seed: int = 0) -> None:
        self._configure(noise=noise, seed=seed)

    def aggregate(
        self, updates: Tensor, weights: Tensor | None = None, *, reference: Tensor | None = None
    ) -> tuple[Tensor, Diagnostics]:
        normalised_weights(updates, weights)  # weights play no part
        fr = FiniteRows("flame", updates)
        admitted, fallback = hdbscan_admitted(fr.cosine_distances())
        s_t = float(np.median(fr.norms.cpu().numpy()))
        out = fr.clipped_mean(admitted, s_t)
        sigma = self.noise * s_t
        if sigma > 0:
            gen = input_generator(self.seed, fr.sq, "flame")
            noise = torch.randn(updates.shape[1], generator=gen, dtype=W).mul_(sigma)
            out = to_dtype(out.to(W) + noise.to(out.device), updates.dtype)
        return out, {
            "agg/num_selected": float(admitted.numel()),
            "agg/fallback": float(fallback),
            "agg/tau": s_t,
            "agg/noise_std": sigma,
            "agg/nonfinite": float(fr.dropped),
        }
