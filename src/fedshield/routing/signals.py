"""Per-sample uncertainty signals at one exit (early-exit ViT paper, Sec. III-D).

All functions take softmax probabilities ``p`` of shape ``[..., C]`` and reduce the last
dimension, so the same code serves one exit ``[N, C]`` or all exits ``[L, N, C]``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor

from fedshield.errors import ConfigError


@dataclass(frozen=True)
class RiskWeights:
    """Weights of R_e = w_h Ĥ + w_c (1 − C) + w_m (1 − M).

    0.4/0.4/0.2 is the early-exit ViT paper's choice ("equal primary weight, complementary margin").
    """

    entropy: float = 0.4
    confidence: float = 0.4
    margin: float = 0.2

    def __post_init__(self) -> None:
        for name in ("entropy", "confidence", "margin"):
            if not getattr(self, name) >= 0:
                raise ConfigError(f"routing risk weight {name!r} must be >= 0")


def normalized_entropy(p: Tensor) -> Tensor:
    """Ĥ_e = −Σ_c p_c log p_c / log C ∈ [0, 1]; 0·log 0 = 0, and Ĥ = 0 when C = 1."""
    num_classes = p.shape[-1]
    ent = -torch.special.xlogy(p, p).sum(dim=-1)
    # One class carries no uncertainty; avoid 0/0.
    return ent / math.log(num_classes) if num_classes > 1 else torch.zeros_like(ent)


def confidence(p: Tensor) -> Tensor:
    """C_e = max_c p_c."""
    return p.amax(dim=-1)


def margin(p: Tensor) -> Tensor:
    """M_e = p_(1) − p_(2), the gap between the two largest probabilities (p_(1) when C = 1)."""
    if p.shape[-1] == 1:
        return p[..., 0]
    top2 = p.topk(2, dim=-1).values
    return top2[..., 0] - top2[..., 1]


@dataclass(frozen=True)
class ExitSignals:
    """Ĥ_e, C_e and M_e of a batch, computed once; Q_e and R_e are derived from them."""

    entropy: Tensor
    confidence: Tensor
    margin: Tensor

    @classmethod
    def of(cls, p: Tensor) -> ExitSignals:
        return cls(normalized_entropy(p), confidence(p), margin(p))

    @property
    def difficulty(self) -> Tensor:
        """Q_e = Ĥ_e · (1 − C_e): large only when entropy *and* confidence deficit are high."""
        return self.entropy * (1 - self.confidence)

    def risk(self, weights: RiskWeights = RiskWeights()) -> Tensor:
        """R_e = w_h Ĥ_e + w_c (1 − C_e) + w_m (1 − M_e)."""
        return (
            weights.entropy * self.entropy
            + weights.confidence * (1 - self.confidence)
            + weights.margin * (1 - self.margin)
        )


def multiplicative_difficulty(p: Tensor) -> Tensor:
    """Q_e = Ĥ_e · (1 − C_e)."""
    return ExitSignals.of(p).difficulty


def risk(p: Tensor, weights: RiskWeights = RiskWeights()) -> Tensor:
    """R_e = w_h Ĥ_e + w_c (1 − C_e) + w_m (1 − M_e)."""
    return ExitSignals.of(p).risk(weights)


__all__ = [
    "ExitSignals",
    "RiskWeights",
    "confidence",
    "margin",
    "multiplicative_difficulty",
    "normalized_entropy",
    "risk",
]
