"""Numbers a client reports are untrusted like its upload (docs/security.md).

A client's ``metrics`` (its training loss, bytes sent, ...) come from the same party as its
delta: a Byzantine client (or a bug) can send ``train/loss = 1.7e308``, and two such values
overflow a float mean to ``inf``, which would stop a run as "diverged" with the default
``on_nonfinite = "stop"``. So a round's value of a reported metric is the **median** across
the reporting clients, computed in float64 (Rousseeuw & Leroy 1987: breakdown point 1/2, so
fewer than half of the reporters cannot move it outside the honest values' range):

* a value that is not a real number (a string, a list, a bool) is ignored;
* a non-finite value (NaN, ±inf) counts as ``+inf`` — "this client's training diverged" —
  so the median is non-finite only when at least half of the reporters say so (then
  :func:`robust_metric` returns NaN and the run may stop as diverged, decided by a robust
  majority, never by a minority of reports);
* the median of finite reports is finite, and bounded by them.

:func:`robust_metrics` applies this key by key to a list of reports (the Flower-native
strategies' ``train_metrics_aggr_fn``); :func:`robust_metric` to one key (the simulator's
``train/loss``).
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np
from torch import Tensor


def reported_value(value: Any) -> float | None:
    """A reported value as a float64 (``inf`` for NaN/±inf: a diverged report), or None when
    it is no real number at all (ignored)."""
    if isinstance(value, bool) or not isinstance(value, (numbers.Real, Tensor)):
        return None
    if isinstance(value, Tensor):
        if value.numel() != 1 or value.is_complex():
            return None
        value = value.item()
    value = float(value)
    return value if math.isfinite(value) else math.inf


def robust_metric(values: Iterable[Any]) -> float | None:
    """The median of the reported ``values`` in float64 (module docstring): None when none
    is a real number, NaN when at least half are non-finite, else a finite float."""
    got = [v for v in map(reported_value, values) if v is not None]
    if not got:
        return None
    med = float(np.median(np.asarray(got, dtype=np.float64)))
    return med if math.isfinite(med) else math.nan


def robust_metrics(
    reports: Sequence[Mapping[str, Any]], skip: Iterable[str] = ()
) -> dict[str, float]:
    """Every key some report holds, through :func:`robust_metric` over the reports that
    hold it; keys in ``skip`` (the sample-count key) and keys with no real value are left
    out, and a key whose median is non-finite is left out too (the caller decides what a
    diverged majority means; a strategy's metrics are only logged)."""
    skipped = set(skip)
    keys = sorted({k for r in reports for k in r if isinstance(k, str) and k not in skipped})
    out: dict[str, float] = {}
    for key in keys:
        value = robust_metric(r[key] for r in reports if key in r)
        if value is not None and math.isfinite(value):
            out[key] = value
    return out


__all__ = ["reported_value", "robust_metric", "robust_metrics"]
