"""Per-client L2 clipping of the update matrix (DP-FedAvg, McMahan et al. 2018, docs/privacy.md).

    clip(g_m, C) = g_m · min(1, C / ‖g_m‖₂)

so every row of the result has norm at most C (up to one float rounding). Norms are taken in
float64 one row at a time: a finite float32 row whose norm overflows float32 is still scaled
correctly, and no ``[S, d]`` float64 copy is made. A row that is not finite (only a rule
that accepts such rows, BR-DRAG or FLTrust, is ever handed one) becomes zero, which is
inside the ball too.
"""

from __future__ import annotations

import torch
from torch import Tensor


def row_norms64(x: Tensor) -> Tensor:
    """``[S]`` float64 L2 norms of the rows of ``x`` (``inf``/``nan`` for non-finite rows)."""
    if x.shape[0] == 0:
        return torch.zeros(0, dtype=torch.float64, device=x.device)
    return torch.stack([torch.linalg.vector_norm(row, dtype=torch.float64) for row in x])


def clip_scale(norms: Tensor, clip: float) -> Tensor:
    """``min(1, C/‖g‖)`` per row (float64); 0 for a row whose norm is not finite."""
    scale = (clip / norms).clamp_max(1.0)  # ‖g‖ = 0 → C/0 = inf → 1: a zero row stays zero
    return torch.where(torch.isfinite(norms), scale, torch.zeros_like(scale))


def clip_rows(x: Tensor, clip: float) -> tuple[Tensor, Tensor]:
    """``(clipped rows, original float64 norms)``; ``x`` is not modified."""
    norms = row_norms64(x)
    scale = clip_scale(norms, clip)
    out = x * scale.to(x.dtype)[:, None]
    bad = ~torch.isfinite(norms)
    if bool(bad.any()):  # inf · 0 = nan: put exact zeros in the non-finite rows
        out[bad] = 0.0
    return out, norms


def clip_vector(v: Tensor, clip: float) -> Tensor:
    """One vector clipped to norm ``clip`` (the server's reference direction r)."""
    return clip_rows(v[None], clip)[0][0]


__all__ = ["clip_rows", "clip_scale", "clip_vector", "row_norms64"]
