"""Resumed state is checked like an upload (SPEC §12: state loaded from disk is untrusted).

A checkpoint's θ, buffers, server state and client states must have the shapes and dtypes
the run itself starts with (a fresh build of the same config), finite values, buffers in
their ranges (BatchNorm variances ≥ 0) — and θ and the server state the scale the run
recorded for that round: every ``metrics.jsonl`` record holds ``sys/theta_norm`` and
``sys/state_norm``, and the checkpoint must match the record of its last round. Anything
else is one :class:`~fedshield.errors.DataError` naming the checkpoint and the field.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from fedshield.errors import DataError

#: Relative tolerance of the recorded norms: float64 norms of the same float32 values, the
#: record rounded to JSON's shortest repr; a tampered value is off by orders of magnitude.
_NORM_RTOL = 1e-9


def theta_norm(params: Tensor) -> float:
    """‖θ‖ in float64 (what ``sys/theta_norm`` records)."""
    return float(params.detach().double().norm())


def state_norm(state: Mapping[str, Tensor]) -> float:
    """√Σ‖s‖² over the floating server-state tensors (what ``sys/state_norm`` records)."""
    total = 0.0
    for value in state.values():
        if isinstance(value, Tensor) and value.is_floating_point():
            total += float(value.detach().double().pow(2).sum())
    return math.sqrt(total)


def _check_tensor(path: Path, field: str, got: Any, want: Tensor | None) -> None:
    if not isinstance(got, Tensor):
        raise DataError(f"{path}: {field} is not a tensor")
    if want is not None and (tuple(got.shape) != tuple(want.shape) or got.dtype != want.dtype):
        raise DataError(
            f"{path}: {field} has shape {tuple(got.shape)} and dtype {got.dtype}, this run's "
            f"is {tuple(want.shape)} {want.dtype}"
        )
    if got.is_floating_point() and not bool(torch.isfinite(got).all()):
        raise DataError(f"{path}: {field} holds NaN/Inf values")


def check_resumed(
    path: Path,
    saved: Any,
    fresh: Any,
    buffer_min: Tensor | None,
    client_init: Mapping[str, Tensor],
    record: Mapping[str, Any] | None,
) -> None:
    """Raise :class:`DataError` when the loaded :class:`RunState` ``saved`` is not a state
    this run could have reached (see the module docstring). ``fresh``: the run's initial
    state; ``client_init``: a client's initial state; ``record``: the metrics record of
    the checkpoint's last round (None before the first record)."""
    _check_tensor(path, "state.params", saved.params, fresh.params)
    _check_tensor(path, "state.buffers", saved.buffers, fresh.buffers)
    low = None if buffer_min is None else buffer_min.to(saved.buffers.dtype)
    if low is not None and saved.buffers.numel() and not bool((saved.buffers >= low).all()):
        raise DataError(f"{path}: state.buffers are out of range (negative variances)")
    for key, value in saved.server_state.items():
        want = fresh.server_state.get(key)
        if want is None and isinstance(value, Tensor) and value.numel() == fresh.params.numel():
            want = fresh.params  # state grown after round 1 (DRAG's r, FedACG's m): θ-shaped
        _check_tensor(path, f"state.server_state[{key!r}]", value, want)
    missing = sorted(set(fresh.server_state) - set(saved.server_state))
    if missing:
        raise DataError(f"{path}: state.server_state lacks {missing[0]!r}")
    for k, table in saved.client_states.items():
        for key, value in table.items():
            field = f"state.client_states[{k}][{key!r}]"
            _check_tensor(path, field, value, client_init.get(key))
    if record is None:
        return
    for key, got in (
        ("sys/theta_norm", theta_norm(saved.params)),
        ("sys/state_norm", state_norm(saved.server_state)),
    ):
        want = record.get(key)
        if isinstance(want, int | float) and not math.isclose(
            got, float(want), rel_tol=_NORM_RTOL, abs_tol=1e-300
        ):
            field = "state.params" if key == "sys/theta_norm" else "state.server_state"
            raise DataError(
                f"{path}: {field} has norm {got:.6g}, but metrics.jsonl recorded "
                f"{float(want):.6g} for round {record.get('round')}: the checkpoint is not "
                "this run's"
            )


__all__ = ["check_resumed", "state_norm", "theta_norm"]
