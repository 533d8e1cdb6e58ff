"""Aggregation of an upload's secondary fields: buffers, control-variate deltas, prototypes.

docs/security.md §2: everything the server computes from uploads goes through the configured rule
or a robust counterpart for that field. The parameter update has the configured rule; every other
field (BatchNorm statistics, SCAFFOLD's Δh, FedCART's class prototypes, FedExP's squared
norms) is a ``[K, p]`` matrix of rows from the same screened clients, aggregated here:

* the configured rule is not Byzantine-robust → the (weighted) mean, FedAvg's rule;
* it is robust, needs neither a reference nor server state (tag ``reference_free``) and can
  run on K rows → the configured rule itself (with the largest feasible f when its own is
  too large for K rows, ``Aggregator.adapted``), on this field;
* otherwise (BR-DRAG, FLTrust, Centered Clipping, or too few rows for Krum's 2f + 2 < K)
  → the coordinate-wise median: robust to any minority of arbitrary rows, stateless, and
  defined for every K ≥ 1.

The work is done in float64 (a field of finite float32 rows never overflows there) and the
result is cast back to the rows' dtype, clamped to its finite range.
"""

from __future__ import annotations

import torch
from torch import Tensor

from fedshield.aggregators.base import Aggregator
from fedshield.aggregators.median import coordinate_median
from fedshield.errors import ConfigError
from fedshield.registry import tags_of


def is_robust(rule: Aggregator) -> bool:
    return "robust" in tags_of(rule)


def field_rule(rule: Aggregator, num_rows: int) -> Aggregator | str:
    """What :func:`aggregate_field` applies to ``num_rows`` rows: "mean", "median" or the
    (possibly reduced) configured rule."""
    tags = tags_of(rule)
    if "robust" not in tags:
        return "mean"
    if "reference_free" in tags and "needs_center" not in tags:
        adapted = getattr(rule, "adapted", None)
        if adapted is not None:
            run = adapted(num_rows)
            return "median" if run is None else run
        try:
            rule.validate(num_rows)
        except ConfigError:
            return "median"
        return rule
    return "median"


def field_rule_name(rule: Aggregator, num_rows: int) -> str:
    """The name of :func:`field_rule`: "mean", "median" or the rule's registry name."""
    run = field_rule(rule, num_rows)
    return run if isinstance(run, str) else getattr(run, "registry_name", type(run).__name__)


def to_finite(x: Tensor, dtype: torch.dtype) -> Tensor:
    """``x`` cast to ``dtype`` with its values clamped to the finite range of ``dtype``."""
    if dtype.is_floating_point:
        info = torch.finfo(dtype)
        x = x.clamp(info.min, info.max)
    return x.to(dtype)


def aggregate_field(rows: Tensor, weights: Tensor | None, rule: Aggregator) -> tuple[Tensor, str]:
    """``(aggregate [p], rule applied)`` of a ``[K, p]`` field (see the module docstring).
    ``weights`` (e.g. sample or class counts) are used by the mean and by rules that honour
    weights; ``None`` is uniform."""
    if rows.dim() != 2 or rows.shape[0] == 0:
        raise ValueError(f"a field must be a non-empty [K, p] matrix, got {tuple(rows.shape)}")
    run = field_rule(rule, rows.shape[0])
    how = run if isinstance(run, str) else getattr(run, "registry_name", type(run).__name__)
    x = rows.to(torch.float64)
    w = None if weights is None else weights.to(device=x.device, dtype=torch.float64)
    if how == "mean":
        if w is None or not bool(w.sum() > 0):
            out = x.mean(0)
        else:
            out = (w / w.sum()) @ x
    elif how == "median":
        out = coordinate_median(x)
    else:
        assert not isinstance(run, str)
        out = run(x, w if "uses_weights" in tags_of(rule) else None)
    return to_finite(out, rows.dtype), how


__all__ = ["aggregate_field", "field_rule", "field_rule_name", "is_robust", "to_finite"]
