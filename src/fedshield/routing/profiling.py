"""Client difficulty score S_k, computed once before round 1 (early-exit ViT paper, eqs. 4–7).

S_k = w_H H̃_k + w_U Ũ_k, with H_k the normalised label entropy of the client's class counts,
U_k = 1 − C̄_k its shallow-exit confidence deficit, and ~ a min–max normalisation over the
profiled clients (all equal → 0).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from fedshield.errors import ConfigError
from fedshield.routing.signals import confidence


def label_entropy(counts: Tensor, eps: float = 1e-12) -> Tensor:
    """H_k = −Σ_c q_{k,c} log(q_{k,c} + ε) / log C for counts ``[C]`` or ``[K, C]``.

    C is the length of the last axis (the number of classes of the task, absent classes
    included), so a client holding one class has H = 0 and a balanced one H ≈ 1.
    """
    counts = torch.as_tensor(counts, dtype=torch.float64)
    num_classes = counts.shape[-1]
    total = counts.sum(dim=-1, keepdim=True)
    if (total <= 0).any():
        raise ValueError("every client needs at least one sample to compute its label entropy")
    q = counts / total
    ent = -(q * torch.log(q + eps)).sum(dim=-1)
    return ent / math.log(num_classes) if num_classes > 1 else torch.zeros_like(ent)


def shallow_confidence_deficit(
    exit_probs: Tensor | Sequence[Tensor], num_shallow: int = 2
) -> Tensor:
    """U_k = 1 − C̄_k, C̄_k = mean max-softmax over the client's samples and first P exits.

    ``exit_probs`` is ``[L, N, C]`` (or a list of L ``[N, C]``) for one client, computed by
    the global model. P = 2 in the paper; a model with fewer exits uses all of them.
    """
    if num_shallow < 1:
        raise ConfigError(f"routing profile num_shallow (P) must be >= 1, got {num_shallow!r}")
    probs = torch.stack(list(exit_probs)) if not isinstance(exit_probs, Tensor) else exit_probs
    return 1 - confidence(probs[:num_shallow].double()).mean()


def minmax_normalize(values: Tensor) -> Tensor:
    """(v − min) / (max − min) over clients, all-equal values map to 0 (early-exit ViT paper,
    eq. 6)."""
    values = torch.as_tensor(values, dtype=torch.float64)
    lo, hi = values.min(), values.max()
    if hi == lo:  # no spread: no client is harder than another
        return torch.zeros_like(values)
    return (values - lo) / (hi - lo)


@dataclass(frozen=True)
class ClientProfile:
    """Per-client profiling results ``[K]`` (raw and normalised terms kept for logging)."""

    label_entropy: Tensor
    confidence_deficit: Tensor
    score: Tensor


def client_scores(
    label_entropies: Tensor,
    confidence_deficits: Tensor,
    *,
    entropy_weight: float = 0.6,
    confidence_weight: float = 0.4,
) -> Tensor:
    """S_k = 0.6 H̃_k + 0.4 Ũ_k (the early-exit ViT paper's weights: label heterogeneity weighs
    more)."""
    if not (entropy_weight >= 0 and confidence_weight >= 0):
        raise ConfigError("routing profile weights must be >= 0")
    return entropy_weight * minmax_normalize(label_entropies) + (
        confidence_weight * minmax_normalize(confidence_deficits)
    )


def profile_clients(
    class_counts: Tensor | Sequence[Sequence[int]],
    exit_probs: Sequence[Tensor | Sequence[Tensor]],
    *,
    num_shallow: int = 2,
    entropy_weight: float = 0.6,
    confidence_weight: float = 0.4,
    eps: float = 1e-12,
) -> ClientProfile:
    """Profile K clients from their class counts ``[K, C]`` and, per client, the global
    model's exit probabilities on their data (``[L, N_k, C]`` each)."""
    counts = torch.as_tensor(class_counts)
    if counts.dim() != 2 or counts.shape[0] != len(exit_probs):
        raise ValueError(
            f"class_counts must be [K, C] with K = {len(exit_probs)} clients, "
            f"got shape {tuple(counts.shape)}"
        )
    h = label_entropy(counts, eps)
    u = torch.stack([shallow_confidence_deficit(p, num_shallow) for p in exit_probs])
    s = client_scores(h, u, entropy_weight=entropy_weight, confidence_weight=confidence_weight)
    return ClientProfile(label_entropy=h, confidence_deficit=u, score=s)


__all__ = [
    "ClientProfile",
    "client_scores",
    "label_entropy",
    "minmax_normalize",
    "profile_clients",
    "shallow_confidence_deficit",
]
