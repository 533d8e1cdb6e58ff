"""What a quiet attacker reads from the server's published defense parameters (SPEC §16).

The threat model: colluding fixed attackers who know the honest rows of the cohort, which
of their own clients are in it, θ^t and every defense parameter the server publishes
(:class:`~fedshield.attacks.base.AttackContext`). From those they compute the radii the
defenses enforce, each as a distance r along −ū from a centre c (ū the unit honest mean), so
that a row x = c − h·r·ū with h ∈ (0, 1] stays inside:

* ``reputation`` (:mod:`fedshield.crossround.reputation`) flags a row farther than τ × the
  median distance from the aggregate: r = τ · D, D = the lower median honest distance from c;
* ``step_bound`` (:mod:`fedshield.crossround.step_bound`) clips an applied step beyond
  B = κ × the lower median norm of the last k applied steps (κ · η_g · the lower median row
  norm before any): the rows' aggregate a, at worst x itself, keeps ‖η_g · a‖ ≤ B when
  r ≤ :func:`reach` (c, ū, B/|η_g|);
* a clipping rule or pre-aggregator: Centered Clipping's τ about its centre (r = τ, or D
  for the relative τ), ``norm_clip``'s τ and the ``clip`` pre-aggregator's c as a norm bound
  (r = :func:`reach`).

Everything is computed in float64; the whole vector is one block (coverage masks are not
read: a partial row's step is bounded per block by the server, at most as tightly).
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from typing import Any

import torch
from torch import Tensor

from fedshield.aggregators._ops import W, row_dists, row_norms
from fedshield.attacks.base import AttackContext
from fedshield.crossround.step_bound import history_scale, lower_median
from fedshield.registry import tags_of


def unit(v: Tensor) -> Tensor:
    """``v / ‖v‖`` in float64; zeros when ‖v‖ is 0 or not finite (no direction to follow)."""
    v64 = v.to(W)
    n = float(torch.linalg.vector_norm(v64))
    if not (n > 0.0 and math.isfinite(n)):
        return torch.zeros_like(v64)
    return v64 / n


def spread(pool: Tensor, centre: Tensor) -> float:
    """D = the lower median distance ‖h_j − c‖ of the honest rows from the centre c."""
    med = lower_median(row_dists(pool, centre.to(pool.dtype)))
    return 0.0 if med is None or not math.isfinite(med) else med


def reach(centre: Tensor, u: Tensor, bound: float) -> float:
    """The largest r ≥ 0 with ‖c − r·u‖ ≤ ``bound`` (u a unit vector): the root of
    r² − 2r⟨c, u⟩ + ‖c‖² − bound² = 0, i.e. r = ⟨c, u⟩ + √(⟨c, u⟩² − ‖c‖² + bound²);
    0 when c itself is outside the ball (nowhere along −u is inside)."""
    c = centre.to(W)
    cu = float(c @ u.to(W))
    disc = cu * cu - float(c @ c) + bound * bound
    if not math.isfinite(disc) or disc < 0.0:
        return 0.0
    return max(0.0, cu + math.sqrt(disc))


def _rule_parts(rule: Any) -> Iterator[tuple[str, Any]]:
    """(registry name, object) of the rule behind its pre-aggregators, then of each
    pre-aggregator (:class:`~fedshield.preaggregators.composed.ComposedRule`)."""
    if rule is None:
        return
    inner = rule.__dict__.get("rule", rule)
    yield getattr(inner, "registry_name", type(inner).__name__), inner
    for pre in getattr(rule, "pre", ()):
        yield getattr(pre, "name", type(pre).__name__), pre


def step_bound(context: AttackContext | None, pool: Tensor) -> float | None:
    """B, the smallest radius on the applied step's norm that a ``step_bound`` defense of
    the context enforces this round (eq. (1) of :mod:`fedshield.crossround.step_bound`, read
    from its published history; before any, κ · |η_g| · the lower median honest row norm);
    None when no step bound is configured or it knows no scale yet."""
    if context is None:
        return None
    out: float | None = None
    for d in context.defenses:
        if "bounds_step" not in tags_of(d) or not hasattr(d, "kappa"):
            continue
        steps = context.published.get(d.key("steps"))
        count = context.published.get(d.key("count"))
        scale = None
        if steps is not None and count is not None and steps.dim() == 2:
            recorded = steps[: min(int(count), steps.shape[0])].to(pool.device)
            if recorded.shape[1] == pool.shape[1]:
                scale = history_scale(recorded, torch.arange(pool.shape[1], device=pool.device))
        if scale is None:
            rows = lower_median(row_norms(pool))
            scale = None if rows is None else rows * abs(context.lr)
        if scale is None or not (scale > 0.0 and math.isfinite(scale)):
            continue
        bound = float(d.kappa) * scale
        out = bound if out is None else min(out, bound)
    return out


def radii(
    context: AttackContext | None, pool: Tensor, centre: Tensor, u: Tensor
) -> dict[str, float]:
    """The published radii along −u from ``centre`` (module docstring), by the defense
    that sets each; {} when the server publishes none."""
    out: dict[str, float] = {}
    if context is None:
        return out
    d_spread = spread(pool, centre)
    for d in context.defenses:
        if d.name == "reputation":
            out[d.name] = float(d.tau) * d_spread
    bound = step_bound(context, pool)
    if bound is not None and context.lr != 0.0:
        out["step_bound"] = reach(centre, u, bound / abs(context.lr))
    for name, part in _rule_parts(context.rule):
        if name == "centered_clipping":
            tau = getattr(part, "tau", None)
            out[name] = d_spread if tau is None else float(tau)
        elif name == "norm_clip":
            tau = getattr(part, "tau", None)
            norm = lower_median(row_norms(pool)) if tau is None else float(tau)
            if norm is not None:
                out[name] = reach(centre, u, norm)
        elif name == "clip":
            out[name] = reach(centre, u, float(part.c))
    return {k: v for k, v in out.items() if math.isfinite(v)}


__all__ = ["radii", "reach", "spread", "step_bound", "unit"]
