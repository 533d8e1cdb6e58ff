"""Helpers shared by the attacks: parameter validation and the benign-row statistics.

Validation raises :class:`fedshield.errors.ConfigError` naming the attack, the parameter,
the allowed range and the value given, so a bad config line is fixed from one message.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

import torch
from torch import Tensor

from fedshield.errors import ConfigError


def _is_number(value: object) -> bool:
    # bool is an int subclass; ``sigma = true`` in a config is a mistake, not 1.0.
    return isinstance(value, int | float) and not isinstance(value, bool)


def finite(attack: str, name: str, value: object) -> float:
    """Return ``value`` as a float, or raise if it is not a finite real number."""
    if not _is_number(value) or not math.isfinite(value):  # type: ignore[arg-type]
        raise ConfigError(f"attack {attack!r}: {name} must be a finite number, got {value!r}")
    return float(value)  # type: ignore[arg-type]


def positive(attack: str, name: str, value: object) -> float:
    """Return ``value`` as a float, or raise if it is not a finite number > 0."""
    if not _is_number(value) or not math.isfinite(value) or value <= 0:  # type: ignore[operator,arg-type]
        raise ConfigError(f"attack {attack!r}: {name} must be a finite number > 0, got {value!r}")
    return float(value)  # type: ignore[arg-type]


def choice(attack: str, name: str, value: object, allowed: Iterable[str]) -> str:
    """Return ``value`` if it is one of ``allowed``, else raise listing the options."""
    options = tuple(allowed)
    if not isinstance(value, str) or value not in options:
        raise ConfigError(
            f"attack {attack!r}: {name} must be one of {', '.join(map(repr, options))}, "
            f"got {value!r}"
        )
    return value


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
