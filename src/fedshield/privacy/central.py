"""Client-level central DP: DP-FedAvg (McMahan et al., ICLR 2018), composed with any rule.

One round, inside :meth:`FedAvg.aggregate` (docs/privacy.md):

1. every screened update is clipped, g_m ← g_m · min(1, C/‖g_m‖) (and the server's
   reference r too, for the rules that rescale rows to ‖r‖: BR-DRAG, FLTrust, DRAG);
2. the configured rule runs on the clipped rows — a mean, or any Byzantine defense;
3. a row-separable mean is put on DP-FedAvg's fixed denominator, Δ = Σ_m φ(g_m)/S;
4. Δ ← Δ + N(0, σ²I) with σ = z · Δ₂, Δ₂ the rule's L2 sensitivity
   (:mod:`fedshield.privacy.sensitivity`; for the mean Δ₂ = C/S, i.e. N(0, (zC)²I) on the
   sum before dividing by S).

The noise is drawn on the CPU from a generator seeded by (seed, round, a purpose constant
of its own), then moved to the aggregate's device, so a run is reproducible and the same on
every device and backend. With z = 0 only the clipping applies (ε = ∞).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from fedshield.aggregators.base import Aggregator
from fedshield.core.context import RoundContext, make_generator
from fedshield.privacy.clipping import clip_rows, clip_vector
from fedshield.privacy.sensitivity import Sensitivity, sensitivity

#: Purpose mixed into the noise seed, distinct from every stream of the round loop.
NOISE_PURPOSE = 0xD9F1


def gaussian_noise(shape: int, std: float, ctx: RoundContext, like: Tensor) -> Tensor:
    """N(0, std²I) of length ``shape``, seeded by (seed, round, NOISE_PURPOSE)."""
    gen = make_generator(ctx.seed, ctx.round, NOISE_PURPOSE)
    noise = torch.randn(shape, generator=gen, dtype=like.dtype)
    return (noise * std).to(like.device)


@dataclass(frozen=True)
class CentralDP:
    """DP-FedAvg's clip → rule → noise for one configured rule (see the module doc)."""

    rule: Aggregator
    clip: float
    noise_multiplier: float
    delta: float
    #: q = S/M, the accountant's sampling rate.
    sample_rate: float

    def clip_updates(self, deltas: Tensor) -> tuple[Tensor, dict[str, float]]:
        """``[S, d]`` rows clipped to norm C, and the share of rows that were clipped."""
        clipped, norms = clip_rows(deltas, self.clip)
        frac = float((norms > self.clip).double().mean()) if norms.numel() else 0.0
        return clipped, {"privacy/clipped_frac": frac}

    def clip_reference(self, ref: Tensor) -> Tensor:
        """The server's reference direction clipped to C (rules that rescale rows to ‖r‖)."""
        return clip_vector(ref, self.clip)

    def bound(self, cohort_size: int, center: Tensor | None = None) -> Sensitivity:
        """Δ₂ of this round's aggregate (``center``: Centered Clipping's public centre)."""
        return sensitivity(self.rule, self.clip, cohort_size, center)

    def privatize(
        self, aggregate: Tensor, num_rows: int, ctx: RoundContext, center: Tensor | None = None
    ) -> tuple[Tensor, dict[str, float]]:
        """The noised aggregate of the rule's output on ``num_rows`` clipped rows."""
        s = len(ctx.cohort)
        sens = self.bound(s, center)
        out = aggregate
        if sens.fixed_denominator and num_rows != s:
            out = aggregate * (num_rows / s)  # Σ φ(g_m) / S: DP-FedAvg's fixed denominator
        std = self.noise_multiplier * sens.value
        if std > 0:
            out = out + gaussian_noise(out.numel(), std, ctx, out)
        return out, {"privacy/sensitivity": sens.value, "privacy/noise_std": std}


__all__ = ["NOISE_PURPOSE", "CentralDP", "gaussian_noise"]
