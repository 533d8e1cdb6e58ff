"""What a quiet attacker reads from the server's published defense parameters (docs/security.md
§6b).

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

Two round defenses judge the rows by something other than a radius, and an attacker who
reads them places its f rows differently (:func:`evading_rows`):

* ``collusion`` (:mod:`fedshield.crossround.collusion`) leaves out a row whose nearest
  other row is closer than ρ × min(the lower median pairwise distance, its own norm): the
  copies are spread on a regular simplex just wider than that (:func:`copy_spacing`);
* ``consistency`` (:mod:`fedshield.crossround.consistency`) flags a row whose offset from
  the cohort's coordinate-wise median has cosine below −γ with the applied step: the
  offset is turned sideways (the simplex's spread) until its cosine is just above −γ.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from typing import Any

import torch
from torch import Tensor

from fedshield.aggregators._ops import W, pairwise_sq_dists, row_dists, row_norms
from fedshield.attacks.base import AttackContext
from fedshield.crossround.consistency import offset_cosines
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


#: The evading attacker's default margin: collusion's scale × (1 + margin) between copies,
#: and a cosine of at least −γ · (1 − margin) against consistency.
MARGIN = 0.1

#: Fixed-point iterations of :func:`copy_spacing` (a contraction by ρ ≤ 1/(1 + margin)
#: per step: 60 steps take the error below 10⁻¹⁵ of t for ρ ≤ 0.5).
_SPACING_STEPS = 200

#: Bisection steps of :func:`evading_rows` on the pull α ∈ [0, R] (to R · 2⁻³⁰).
_PLACEMENT_STEPS = 30


def collusion_rho(context: AttackContext | None) -> float | None:
    """ρ of the ``collusion`` defenses the context configures (the largest: it leaves out
    the most); None when none is configured."""
    rhos = [float(d.rho) for d in (context.defenses if context else ()) if d.name == "collusion"]
    return max(rhos) if rhos else None


def consistency_gamma(context: AttackContext | None) -> float | None:
    """γ of the ``consistency`` defenses the context configures (the smallest: it flags
    the most); None when none is configured."""
    gammas = [
        float(d.gamma) for d in (context.defenses if context else ()) if d.name == "consistency"
    ]
    return min(gammas) if gammas else None


def simplex(directions: Tensor) -> Tensor:
    """The f unit vertices v_i = (e_i − ē)/√((f − 1)/f) of a regular simplex centred on 0,
    from f orthonormal rows e_i (``[f, d]``; f = 1: e_1 itself). Any two are
    √(2f/(f − 1)) apart and they sum to 0, so copies x + q·v_i keep their mean at x."""
    e = directions.to(W)
    f = e.shape[0]
    if f < 2:
        return e.clone()
    return (e - e.mean(dim=0)) / math.sqrt((f - 1) / f)


def side_directions(span: Tensor, f: int, noise: Tensor) -> Tensor | None:
    """f orthonormal rows orthogonal to every row of ``span`` (``[k, d]``), from the seeded
    Gaussian ``noise`` (``[f, d]``) projected off span's row space (twice, for float64
    round-off) and orthonormalised; None when d < k + f (no room beside the span)."""
    k, d = span.shape
    if d < k + f:
        return None
    basis = torch.linalg.qr(span.to(W).T).Q  # [d, k], orthonormal
    g = noise.to(W)
    for _ in range(2):
        g = g - (g @ basis) @ basis.T
    q = torch.linalg.qr(g.T).Q.T  # [f, d]
    return q if bool(torch.isfinite(q).all()) else None


def copy_spacing(pool: Tensor, row: Tensor, f: int, rho: float, margin: float = MARGIN) -> float:
    """t: the pairwise distance of f copies of ``row`` that collusion's eq. (1),
    nn_i < ρ · min(spread, ‖g_i‖) (:func:`fedshield.crossround.collusion.near_duplicates`),
    does not flag, with margin: the copies x_i = row + q·v_i on the simplex of
    :func:`simplex` in directions orthogonal to ``row`` and to every honest row of ``pool``
    (:func:`side_directions`). Then, with a = √((f − 1)/(2f)) and q = a·t,

        ‖x_i − x_k‖ = t,   ‖x_i − h_j‖ = √(‖row − h_j‖² + a²t²),   ‖x_i‖ = √(‖row‖² + a²t²)

    and collusion's scale θ(t) = ρ · min(spread(t), √(‖row‖² + a²t²)), spread(t) the lower
    median of the (n + f)(n + f − 1)/2 distances: the honest pairs, f copies of each
    honest distance above, and f(f − 1)/2 pairs at t. The copies pass when t and every
    honest distance are ≥ (1 + margin)·θ(t); t is the fixed point of

        t ← max((1 + m)·θ(t), √(((1 + m)·θ(t))² − min_j ‖row − h_j‖²) / a)

    from 0, which increases to it (every distance has slope ≤ 1 in t, so θ's is ≤ ρ: a
    contraction while (1 + m)·ρ < 1, and the honest term binds only when a copy sits
    within θ of an honest row). 0 for f < 2 (no pair to separate) or no finite spread."""
    if f < 2:
        return 0.0
    x = row.to(W)
    honest = pool.to(W)
    d2, _ = pairwise_sq_dists(honest)
    n = d2.shape[0]
    pairs_h = d2.clamp_min(0.0).sqrt()[torch.triu_indices(n, n, 1).unbind(0)]
    to_h2 = row_dists(honest, x).to(W) ** 2
    norm2 = float(x @ x)
    a2 = (f - 1) / (2 * f)
    near2 = float(to_h2.min()) if to_h2.numel() else math.inf
    copies = f * (f - 1) // 2

    def scale(t: float) -> float:
        to_h = (to_h2 + a2 * t * t).sqrt().repeat(f)
        both = torch.cat([pairs_h, to_h, torch.full((copies,), t, dtype=W)])
        spread_t = float(both.sort().values[(both.numel() - 1) // 2])
        return (1.0 + margin) * rho * min(spread_t, math.sqrt(norm2 + a2 * t * t))

    t = 0.0
    for _ in range(_SPACING_STEPS):
        need = scale(t)
        if not math.isfinite(need):
            return 0.0
        honest_need = math.sqrt(max(need * need - near2, 0.0) / a2)
        nxt = max(need, honest_need)
        if nxt <= t * (1.0 + 1e-13):
            return max(t, nxt)
        t = nxt
    return t


def evading_rows(
    pool: Tensor,
    centre: Tensor,
    u: Tensor,
    radius: float,
    sides: Tensor,
    rho: float | None,
    gamma: float | None,
    margin: float = MARGIN,
) -> tuple[Tensor, float, float]:
    """(``[f, d]`` rows, α, q): the f rows x_i = c − α·u + q·v_i (v_i the unit simplex
    vertices of :func:`simplex` on the orthonormal ``sides``, orthogonal to c and to the
    honest rows), each at distance √(α² + q²) = R = ``radius`` from c — the placement's
    budget, as x = c − R·u of eq. (1) of :mod:`fedshield.attacks.stealth` — with the
    largest pull α ∈ [0, R] (bisection; q = √(R² − α²)) at which

    * collusion (ρ) flags no copy: q ≥ a · :func:`copy_spacing` at x = c − α·u;
    * consistency (γ) flags no copy: cos(x_i − med(cohort), s) ≥ −γ · (1 − margin)
      (:func:`fedshield.crossround.consistency.offset_cosines` on the cohort: the honest
      rows and the f rows) for the step directions s the attacker predicts: the honest
      mean u (where a step that holds goes) and med(cohort) itself (a median's step).

    Turning the offset sideways (q) lowers its cosine with a step along u by α/R while
    the simplex leaves the rows' mean at c − α·u. Neither configured: α = R, q = 0. No
    α fits (R too small for collusion's spacing): α = 0, q = max(R, the spacing)."""
    c = centre.to(W)
    uu = u.to(W)
    v = simplex(sides)
    f = v.shape[0]
    honest = pool.to(W)
    a = math.sqrt((f - 1) / (2 * f))

    def rows(alpha: float, q: float) -> Tensor:
        return (c - alpha * uu) + q * v

    def fits(alpha: float) -> bool:
        q = math.sqrt(max(radius * radius - alpha * alpha, 0.0))
        if rho is not None and q < a * copy_spacing(honest, c - alpha * uu, f, rho, margin):
            return False
        if gamma is not None:
            cohort = torch.cat([honest, rows(alpha, q)])
            for step in (uu, cohort.median(dim=0).values):
                cos = offset_cosines(cohort, step)[honest.shape[0] :]
                if float(cos.min()) < -gamma * (1.0 - margin):
                    return False
        return True

    if fits(radius):
        return rows(radius, 0.0), radius, 0.0
    if not fits(0.0):
        q = radius
        if rho is not None:
            q = max(q, a * copy_spacing(honest, c, f, rho, margin))
        return rows(0.0, q), 0.0, q
    lo, hi = 0.0, radius
    for _ in range(_PLACEMENT_STEPS):
        mid = 0.5 * (lo + hi)
        lo, hi = (mid, hi) if fits(mid) else (lo, mid)
    q = math.sqrt(max(radius * radius - lo * lo, 0.0))
    return rows(lo, q), lo, q


__all__ = [
    "MARGIN",
    "collusion_rho",
    "consistency_gamma",
    "copy_spacing",
    "evading_rows",
    "radii",
    "reach",
    "side_directions",
    "simplex",
    "spread",
    "step_bound",
    "unit",
]
