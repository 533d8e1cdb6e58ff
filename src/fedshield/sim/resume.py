"""Resumed state is checked like an upload (docs/security.md: state loaded from disk is untrusted).

A checkpoint's θ, buffers, server state and client states must have the shapes and dtypes
the run itself starts with (a fresh build of the same config), finite values, buffers in
their ranges (BatchNorm variances ≥ 0) — and θ and the server state the scale the run
recorded for that round: the checkpoint records them of itself (``norms``), every
``metrics.jsonl`` record holds ``sys/theta_norm`` and ``sys/state_norm``, and the
checkpoint must match both; with neither (an older file whose metrics.jsonl is gone) θ
and the θ-shaped server state must be within :data:`~fedshield.core.state_check.MAX_SCALE`
× the fresh θ's norm. Server-state keys are checked against what the server algorithm
declares (:meth:`ServerAlgorithm.state_spec`), keys created after round 1 included.
Anything else is one :class:`~fedshield.errors.DataError` naming the checkpoint and the
field (:mod:`fedshield.core.state_check`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from torch import Tensor

from fedshield.core import state_check as sc
from fedshield.errors import DataError


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


def checkpoint_norms(state: Any) -> dict[str, float]:
    """The norms a checkpoint records of its own state (``norms`` in ``checkpoint.pt``), so
    the resume check bounds θ even when ``metrics.jsonl`` is missing or edited."""
    return {
        "round": state.round,
        "sys/theta_norm": theta_norm(state.params),
        "sys/state_norm": state_norm(state.server_state),
    }


def check_resumed(
    path: Path,
    saved: Any,
    fresh: Any,
    buffer_min: Tensor | None,
    client_init: Mapping[str, Tensor | None],
    record: Mapping[str, Any] | None,
    server_spec: Mapping[str, Tensor | None] | None = None,
    norms: Mapping[str, Any] | None = None,
) -> None:
    """Raise :class:`DataError` when the loaded :class:`RunState` ``saved`` is not a state
    this run could have reached (see the module docstring), through the one checker
    :mod:`fedshield.core.state_check`. ``fresh``: the run's initial state;
    ``client_init``: every key a client's state may hold
    (:meth:`ClientAlgorithm.state_spec`); ``record``: the metrics record of the
    checkpoint's last round (None before the first record); ``server_spec``: every key the
    server state may hold (:meth:`ServerAlgorithm.state_spec`; default: the fresh state's
    keys); ``norms``: the norms the checkpoint recorded of itself (None: an older file)."""
    where = f"{path}: state"
    sc.check_tensor(f"{where}.params", saved.params, fresh.params)
    sc.check_tensor(f"{where}.buffers", saved.buffers, fresh.buffers, low=buffer_min)
    spec = dict(server_spec) if server_spec is not None else dict(fresh.server_state)
    sc.check_table(f"{where}.server_state", saved.server_state, spec, required=fresh.server_state)
    for k, table in saved.client_states.items():
        sc.check_table(f"{where}.client_states[{k}]", table, dict(client_init))
    recorded = False
    for source, rec in (("checkpoint.pt", norms), ("metrics.jsonl", record)):
        if rec is None:
            continue
        if source == "checkpoint.pt" and rec.get("round") != saved.round:
            raise DataError(
                f"{path}: records the norms of round {rec.get('round')!r}, but its state is "
                f"round {saved.round}: the checkpoint is not the one written"
            )
        for key, field, got in (
            ("sys/theta_norm", "params", theta_norm(saved.params)),
            ("sys/state_norm", "server_state", state_norm(saved.server_state)),
        ):
            if key in rec:
                recorded = True
                sc.check_norm(f"{where}.{field}", got, rec[key], source)
    if recorded:
        return
    # Nothing recorded a norm (an older checkpoint, metrics.jsonl gone): a sanity bound.
    sc.check_scale(f"{where}.params", saved.params, fresh.params)
    for key, value in saved.server_state.items():
        if tuple(value.shape) == tuple(saved.params.shape):
            sc.check_scale(f"{where}.server_state[{key!r}]", value, saved.params)


__all__ = ["check_resumed", "checkpoint_norms", "state_norm", "theta_norm"]
