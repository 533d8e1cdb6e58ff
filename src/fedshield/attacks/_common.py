"""Helpers shared by the update attacks: input checks and the benign-row statistics.

Parameters are validated by each attack's schema (:mod:`fedshield.attacks.base`).
"""

from __future__ import annotations

import torch
from torch import Tensor


def check_inputs(updates: Tensor, byzantine: Tensor) -> Tensor:
    """Validate the ``[S, d]`` matrix and ``[S]`` mask; return the mask as bool on ``updates``'
    device (the engine may build it on the CPU while the updates live on the GPU)."""
    if updates.dim() != 2 or not updates.is_floating_point():
        raise ValueError(
            f"updates must be a floating [S, d] tensor, got {updates.dtype} "
            f"of shape {tuple(updates.shape)}"
        )
    if byzantine.shape != (updates.shape[0],) or byzantine.dtype != torch.bool:
        raise ValueError(
            f"byzantine must be a bool tensor of shape [{updates.shape[0]}], got "
            f"{byzantine.dtype} of shape {tuple(byzantine.shape)}"
        )
    return byzantine.to(updates.device)


def honest_pool(updates: Tensor, mask: Tensor) -> Tensor:
    """The rows an omniscient attacker computes its statistics from: the benign ones.

    With no benign row in the cohort (every selected worker is Byzantine) there is nothing
    to imitate, so we fall back to all rows, i.e. the attackers' own honest updates. That
    is our choice (the papers assume a benign majority); it keeps the round well defined.
    """
    benign = updates[~mask]
    return benign if benign.shape[0] > 0 else updates


def coord_std(rows: Tensor) -> Tensor:
    """Coordinate-wise *unbiased* std (``torch.std``'s default, as in the ALIE and NDSS'21
    reference code and in ByzFL). A single row has no spread: we return zeros rather than
    the NaN that ``correction=1`` would give, so one benign worker cannot poison θ with NaN."""
    if rows.shape[0] < 2:
        return torch.zeros_like(rows[0])
    return rows.std(dim=0)


def with_rows(updates: Tensor, mask: Tensor, rows: Tensor) -> Tensor:
    """A copy of ``updates`` whose Byzantine rows are ``rows`` (``[f, d]`` or one ``[d]``
    vector broadcast to every attacker); benign rows are copied unchanged."""
    out = updates.clone()
    out[mask] = rows.to(dtype=updates.dtype, device=updates.device)
    return out
