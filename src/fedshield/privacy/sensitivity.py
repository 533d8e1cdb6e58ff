"""L2 sensitivity of every aggregation rule on clipped updates (docs/privacy.md).

The server adds N(0, σ²I) to the rule's output with σ = z · Δ₂, where Δ₂ bounds how far the
output can move between two neighbouring cohorts — one client's update added or removed,
the relation of the RDP accountant — when every row has norm ≤ C (rows clipped first, and
BR-DRAG's/FLTrust's reference r clipped to C too: they rescale rows to ‖r‖). Two kinds of
bound, each proved in one line:

* **fixed denominator** (row-separable means): Δ = Σ_m φ(g_m) / S with S the configured
  cohort size (``server.clients_per_round``) and ‖φ(g)‖ ≤ ρC for every g in the C-ball, φ
  depending on nothing else of the cohort. Adding or removing one client changes the sum
  by one term: **Δ₂ = ρC/S**. The rule's output (a mean over the k rows it received) is
  rescaled by k/S, which changes nothing when no upload was rejected. This is DP-FedAvg's
  estimator (McMahan et al. 2018: noise on the sum, then divide by a fixed S).
* **bounded output** (every other rule): if every output of the rule on rows in the C-ball,
  for any number of rows, lies in a ball of radius ρC, two outputs are at most the
  diameter apart: **Δ₂ = 2ρC** — under any neighbouring relation, whatever the rule does
  with the count of rows (Krum's f, trimming, the median's middle).

Per rule (ρ, and why):

========================  ================  ================================================
rule                      Δ₂                reason
========================  ================  ================================================
mean (uniform)            C/S               fixed denominator, φ(g) = g, ρ = 1
drag (c), uniform         ρC/S, ρ=max(1,4c−1)  v = (1−λ)g + λ‖g‖ r/‖r‖, λ ∈ [0, 2c]:
                                            ‖v‖ ≤ (|1−λ| + λ)‖g‖; r is the server's own
brdrag (c)                ρC/S, ρ=max(1,4c−1)  v = (1−λ)(‖r‖/‖g‖)g + λr with ‖r‖ ≤ C
                                            (r clipped): ‖v‖ ≤ (|1−λ| + λ)‖r‖; uniform 1/S
fltrust                   2C                ΣTSĝ/ΣTS: a convex combination of rows of norm
                                            ‖r‖ ≤ C (or 0); the trust normaliser couples
                                            the rows, so no fixed-denominator form
krum, multikrum           2C                one row / a weighted mean of selected rows
geomed, rfa, raga         2C                every Weiszfeld iterate is a convex combination
                                            of the rows (or 0 for ``init="zeros"``)
median                    2√2·C             see below: ‖median‖ ≤ √2·C, not C
trimmed_mean (f)          2C·√((3f+1)/(f+1))  see below (f = 0: the mean, 2C)
centered_clipping (τ, L)  min(2Lτ, max(2C, ‖v₀‖+C))  below; v₀ the (public, noised)
                                            previous aggregate
========================  ================  ================================================

Coordinate-wise rules do **not** stay in the C-ball: the median of (a,a,0), (a,0,a),
(0,a,a) with a = C/√2 is (a,a,a), of norm 1.22·C. The bound used: if the median m_j of
coordinate j is ≥ 0, at least ⌈k/2⌉ of the k rows have x_ij ≥ m_j ≥ 0 (for even k the mean of
the two middle values is at most the upper one, and k/2 rows reach it), so
⌈k/2⌉ m_j² ≤ Σ_i x_ij², and summing over j: ‖m‖² ≤ Σ_i‖x_i‖²/⌈k/2⌉ ≤ kC²/⌈k/2⌉ ≤ 2C².
For the trimmed mean t (f values cut per side, k > 2f rows): at least f + 1 rows are ≥ t_j
(the f cut ones and the largest kept one), giving ‖t‖² ≤ kC²/(f+1); and by Jensen on the
k − 2f kept values ‖t‖² ≤ kC²/(k−2f). The smaller of the two is largest at k = 3f + 1:
‖t‖² ≤ (3f+1)/(f+1) · C² < 3C², for every k — so a reduced f (``adapted``) is covered too.

Centered Clipping: v_{l+1} = (1 − Σc_i) v_l + Σ c_i g_i with c_i = w_i min(1, τ/‖g_i − v_l‖),
Σ c_i ≤ 1, so every iterate lies in conv({v₀} ∪ rows) (diameter ≤ max(2C, ‖v₀‖ + C)), and
‖v_{l+1} − v_l‖ ≤ Σ w_i min(‖g_i − v_l‖, τ) ≤ τ, so v_L ∈ B(v₀, Lτ). Under DP the centre v₀
is the previous round's *noised* aggregate, hence public and usable in the bound.

A rule not listed here has no known bound and is refused at build time; a plugin rule can
declare one with :func:`register_bound`.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import cast

from torch import Tensor

from fedshield.aggregators.base import Aggregator
from fedshield.errors import ConfigError


@dataclass(frozen=True)
class Sensitivity:
    """Δ₂ of one round's aggregate and whether it is a fixed-denominator sum (Σφ/S)."""

    value: float
    fixed_denominator: bool = False


#: (rule, C, S, centre or None) -> Sensitivity
BoundFn = Callable[[Aggregator, float, int, "Tensor | None"], Sensitivity]
_BOUNDS: dict[type, BoundFn] = {}


def register_bound(cls: type) -> Callable[[BoundFn], BoundFn]:
    """Declare the L2 sensitivity of aggregator class ``cls`` (and its subclasses)."""

    def deco(fn: BoundFn) -> BoundFn:
        _BOUNDS[cls] = fn
        return fn

    return deco


def bound_fn(rule: Aggregator) -> BoundFn | None:
    """The most specific registered bound for ``rule``'s class, or None."""
    _register_builtin()
    for cls in type(rule).__mro__:
        if cls in _BOUNDS:
            return _BOUNDS[cls]
    return None


def sensitivity(
    rule: Aggregator, clip: float, cohort_size: int, center: Tensor | None = None
) -> Sensitivity:
    """Δ₂ of ``rule`` on rows clipped to ``clip`` with S = ``cohort_size``."""
    fn = bound_fn(rule)
    if fn is None:
        raise ConfigError(
            f"privacy.central: no L2 sensitivity bound is known for the aggregator "
            f"{type(rule).__name__}; declare one with fedshield.privacy.register_bound"
        )
    return fn(rule, clip, cohort_size, center)


def drag_radius(c: float) -> float:
    """ρ = max(1, 4c − 1): ‖(1−λ)a + λb‖ ≤ (|1−λ| + λ)·max(‖a‖, ‖b‖) for λ ∈ [0, 2c]."""
    return max(1.0, 4.0 * c - 1.0)


def trimmed_mean_radius(f: int) -> float:
    """ρ = √((3f+1)/(f+1)): ‖trimmed mean‖ ≤ ρC on rows in the C-ball, for any row count."""
    return math.sqrt((3 * f + 1) / (f + 1))


MEDIAN_RADIUS = math.sqrt(2.0)

_registered = False


def _register_builtin() -> None:
    """Bounds of the built-in rules (imported late: the aggregators import nothing of ours)."""
    global _registered
    if _registered:
        return
    _registered = True
    from fedshield.aggregators.brdrag import BrDrag
    from fedshield.aggregators.clipping import CenteredClipping
    from fedshield.aggregators.drag import Drag
    from fedshield.aggregators.fltrust import FLTrust
    from fedshield.aggregators.geomed import GeoMed
    from fedshield.aggregators.krum import Krum, MultiKrum
    from fedshield.aggregators.mean import Mean
    from fedshield.aggregators.median import Median
    from fedshield.aggregators.trimmed_mean import TrimmedMean

    def fixed(radius: Callable[[Aggregator], float]) -> BoundFn:
        return lambda rule, c, s, _center: Sensitivity(radius(rule) * c / s, True)

    def ball(radius: Callable[[Aggregator], float]) -> BoundFn:
        return lambda rule, c, _s, _center: Sensitivity(2.0 * radius(rule) * c)

    def trimmed(rule: Aggregator, c: float, s: int, _center: Tensor | None) -> Sensitivity:
        f = rule.f_for(s)  # type: ignore[attr-defined]
        return Sensitivity(2.0 * trimmed_mean_radius(f) * c)

    _BOUNDS.setdefault(Mean, fixed(lambda r: 1.0))
    _BOUNDS.setdefault(Drag, fixed(lambda r: drag_radius(r.c)))  # type: ignore[attr-defined]
    _BOUNDS.setdefault(BrDrag, fixed(lambda r: drag_radius(r.c)))  # type: ignore[attr-defined]
    for cls in (FLTrust, Krum, MultiKrum, GeoMed):
        _BOUNDS.setdefault(cls, ball(lambda r: 1.0))
    _BOUNDS.setdefault(Median, ball(lambda r: MEDIAN_RADIUS))
    _BOUNDS.setdefault(TrimmedMean, trimmed)

    def centered(rule: Aggregator, c: float, _s: int, center: Tensor | None) -> Sensitivity:
        cc = cast(CenteredClipping, rule)  # the bound registered for CenteredClipping below
        v0 = 0.0 if center is None else float(center.double().norm())
        tau = cc.tau
        reach = math.inf if tau is None else 2.0 * cc.iters * tau  # None: relative radius
        return Sensitivity(min(reach, max(2.0 * c, v0 + c)))

    _BOUNDS.setdefault(CenteredClipping, centered)

    # Rules whose aggregate is a convex combination of (possibly further clipped) rows, or
    # the mean with some coordinates negated (RLR): on rows clipped to C it lies in the
    # ball of radius C, so two neighbouring cohorts' aggregates are at most 2C apart.
    from fedshield.aggregators.caf import CAF
    from fedshield.aggregators.clippedclustering import ClippedClustering
    from fedshield.aggregators.dnc import DnC
    from fedshield.aggregators.flame import FLAME
    from fedshield.aggregators.foolsgold import FoolsGold
    from fedshield.aggregators.mda import MDA
    from fedshield.aggregators.monna import MoNNA
    from fedshield.aggregators.rlr import RLR
    from fedshield.aggregators.signguard import SignGuard
    from fedshield.aggregators.smea import SMEA

    convex: tuple[type, ...] = (CAF, ClippedClustering, DnC, FLAME, FoolsGold, MDA, MoNNA)
    for rule_cls in (*convex, RLR, SignGuard, SMEA):
        _BOUNDS.setdefault(rule_cls, ball(lambda r: 1.0))


__all__ = [
    "MEDIAN_RADIUS",
    "Sensitivity",
    "bound_fn",
    "drag_radius",
    "register_bound",
    "sensitivity",
    "trimmed_mean_radius",
]
