"""The configured rule on every path: coverage groups and safe degradation (docs/security.md
§2, §4).

Depth- and width-limited clients upload a coverage mask. The configured rule then runs per
**coverage group** — the parameters held by the same set of clients — on those clients'
rows restricted to the group's columns, with the rule's own minimum-row condition checked
per group. With a plain mean this is exactly the early-exit ViT paper's eq. 15 (a
per-parameter mean over the clients that cover it); with any other rule it is that rule,
never a substitute.

When a group (or the whole cohort) has fewer rows than the rule needs — e.g. screening left
fewer than Krum's 2f + 3 (rows the upload checks rejected lower the cohort's f; missing
rows never do, and the round step keeps θ when the kept rows cannot outvote the sampled
cohort's f: :mod:`fedshield.algorithms.server.cohort`) — :func:`apply_rule` runs the rule
with the largest feasible f (``Aggregator.adapted``), or, when nothing can run, leaves
those parameters unchanged for the round. Both are counted in the round's metrics
(``sys/degraded``; ``sys/skipped`` when θ is kept, ``sys/skipped_groups`` for the coverage
groups left unchanged).

A degraded rule is weaker than the configured one (at f = 0 Multi-Krum and Trimmed Mean
are the mean), and so is an honest-majority rule (tagged ``robust`` and
``reference_free``: Median, GeoMed, Krum, ...) on fewer than 3 rows, where it cannot
outvote a single bad row. Such a group's rows are first clipped to the median norm of all
of the round's rows (:func:`clip_rows`): the round step ran only with an honest majority
of the kept rows under the cohort's f, so that radius is an honest row's scale, and one
client of a two-client depth tier moves its parameters no further than an honest client
could (``sys/degraded`` counts these groups too).
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
from torch import Tensor

from fedshield.aggregators._ops import row_norms
from fedshield.aggregators.base import Aggregator
from fedshield.aggregators.fields import to_finite
from fedshield.errors import ConfigError
from fedshield.registry import tags_of

log = logging.getLogger("fedshield")


def adapted_rule(rule: Aggregator, num_rows: int) -> Aggregator | None:
    """The rule itself when it can run on ``num_rows`` rows, a reduced form of it when one
    exists (largest feasible f), else None."""
    adapted = getattr(rule, "adapted", None)
    if adapted is not None:
        return adapted(num_rows)
    try:
        rule.validate(num_rows)
    except ConfigError:
        return None
    return rule


@dataclass
class RuleOutcome:
    """The aggregate and how the rule ran on this round's rows."""

    delta: Tensor
    metrics: dict[str, float] = field(default_factory=dict)
    degraded: int = 0  #: groups aggregated with a reduced rule (e.g. smaller f)
    skipped: int = 0  #: groups left unchanged because the rule could not run
    covered: Tensor | None = None  #: [d] bool: coordinates that received an aggregate


#: Rows below which an honest-majority rule cannot outvote one bad row (median of 2 = mean).
MAJORITY_ROWS = 3


def needs_majority(rule: Aggregator) -> bool:
    """An honest-majority rule: robust without a trusted reference (Median, GeoMed, RFA,
    RAGA, Krum, Multi-Krum, Trimmed Mean, Bulyan). FLTrust/BR-DRAG are bounded by their
    root reference and the clipping rules by their radius, whatever the row count."""
    tags = tags_of(rule)
    return "robust" in tags and "reference_free" in tags


def clip_rows(x: Tensor, radius: float) -> Tensor:
    """Rows of ``x`` scaled down to norm ≤ ``radius`` (float64 norms: no overflow)."""
    norms = row_norms(x)
    scale = torch.where(norms > radius, radius / norms.clamp_min(1e-300), 1.0)
    return (x.double() * scale.unsqueeze(1)).to(x.dtype)


def apply_rule(
    rule: Aggregator,
    x: Tensor,
    weights: Tensor | None,
    reference: Tensor | None,
    radius: Callable[[], float | None] | None = None,
) -> tuple[Tensor | None, dict[str, float], bool]:
    """``(aggregate or None, diagnostics, degraded)`` of ``rule`` on the rows ``x``.
    ``radius``: gives the clip radius of a degraded run (module docstring), asked only when
    the run is degraded; None or a None radius: no clip."""
    run = adapted_rule(rule, x.shape[0])
    if run is None:
        return None, {}, False
    weak = run is not rule or (needs_majority(rule) and x.shape[0] < MAJORITY_ROWS)
    r = radius() if weak and radius is not None else None
    if r is not None:
        x = clip_rows(x, r)
    agg, diag = run.aggregate(x, weights, reference=reference)
    return to_finite(agg, x.dtype), diag, weak


def safe_radius(rule: Aggregator, deltas: Tensor) -> Callable[[], float | None]:
    """The clip radius of degraded groups, computed on first use (most rounds degrade
    nothing) and once per round: the lower median of the round's row norms for a robust
    rule; None for the mean and non-robust rules (nothing is configured to defend)."""

    @functools.cache
    def radius() -> float | None:
        if "robust" not in tags_of(rule) or deltas.shape[0] == 0:
            return None
        return _lower_median(row_norms(deltas))

    return radius


def _lower_median(values: Tensor) -> float:
    return float(values.sort().values[(values.numel() - 1) // 2])


#: κ of the per-block bound: a coverage group's rows are clipped to κ × ρ* × √|G| (see
#: :func:`block_scale`). Honest rows of the deeper blocks measured at 0.2–1.6 × ρ* √|G| on
#: the early-exit presets (docs/security.md), so κ = 3 leaves honest rows untouched.
BLOCK_CLIP = 3.0


def bounded_by_rows(rule: Aggregator) -> bool:
    """A robust rule whose output is bounded by the rows it is given (Median, GeoMed, Krum,
    Trimmed Mean, Bulyan, Centered Clipping with a relative τ, norm clipping): with masks, a
    coverage group where attackers may be the majority needs its rows bounded. Rules with
    a root-data reference that rescale every row to ‖r‖ (BR-DRAG, FLTrust: the attribute
    ``rescales_to_reference``) are bounded already; MoNNA, which only selects rows near r,
    is not."""
    tags = tags_of(rule)
    return "robust" in tags and not getattr(rule, "rescales_to_reference", False)


def shared_group(groups: list[tuple[Tensor, Tensor]]) -> int:
    """The index of the *shared* block: the columns every row covers (else the group held
    by the most rows, then the widest)."""
    return max(range(len(groups)), key=lambda i: (groups[i][0].numel(), groups[i][1].numel()))


def block_scale(deltas: Tensor, rows: Tensor, cols: Tensor) -> float:
    """ρ*: the lower median over the rows of their RMS per coordinate on the block
    ``(rows, cols)``. On the shared block, with an honest majority of the cohort, it is an
    honest client's scale, whatever the composition of the deeper tiers."""
    x = deltas.index_select(0, rows).index_select(1, cols)
    return _lower_median(row_norms(x) / float(cols.numel()) ** 0.5)


def coverage_groups(masks: Tensor) -> list[tuple[Tensor, Tensor]]:
    """``[(rows, cols)]``: every set of columns of ``masks`` ([S, d] bool) held by exactly
    the same rows. Columns nobody holds are left out. Cost O(S·d) plus one sort of d codes."""
    s, d = masks.shape
    words = []
    for start in range(0, s, 62):  # 62 rows per int64 code word, no sign-bit trouble
        code = torch.zeros(d, dtype=torch.int64, device=masks.device)
        for i, row in enumerate(masks[start : start + 62]):
            code |= row.to(torch.int64) << i
        words.append(code)
    key = words[0] if len(words) == 1 else torch.stack(words, dim=1)
    uniq, inverse = torch.unique(key, dim=0, return_inverse=True)
    order = torch.argsort(inverse, stable=True)
    counts = torch.bincount(inverse, minlength=uniq.shape[0]).tolist()
    groups = []
    for cols in torch.split(order, counts):
        rows = torch.nonzero(masks[:, cols[0]]).flatten()
        if rows.numel():
            groups.append((rows, cols))
    return groups


def aggregate_covered(
    rule: Aggregator,
    deltas: Tensor,
    weights: Tensor | None,
    masks: Tensor | None,
    reference: Tensor | None,
) -> RuleOutcome:
    """The configured rule on the whole cohort (``masks`` None) or per coverage group.
    Coordinates that no group could aggregate keep a zero update (θ unchanged there)."""
    radius = safe_radius(rule, deltas)
    if masks is None:
        agg, diag, red = apply_rule(rule, deltas, weights, reference, radius)
        if agg is None:
            return RuleOutcome(deltas.new_zeros(deltas.shape[1]), {}, 0, 1)
        return RuleOutcome(agg, diag, int(red), 0)
    out = deltas.new_zeros(deltas.shape[1])
    covered = torch.zeros(deltas.shape[1], dtype=torch.bool, device=deltas.device)
    sums: dict[str, float] = {}
    width = 0
    degraded = skipped = clipped_groups = 0
    groups = coverage_groups(masks)
    # The per-block bound (docs/security.md §2): a Byzantine minority of the cohort may be
    # the majority of a deeper tier, where the rule alone no longer bounds the aggregate.
    # Every group but the shared one has its rows clipped to κ·ρ*·√|G| first, ρ* the
    # cohort's honest per-coordinate scale on the shared block.
    per_block = bounded_by_rows(rule) and len(groups) > 1
    shared = shared_group(groups) if per_block else -1
    rho = block_scale(deltas, *groups[shared]) if per_block else 0.0
    for i, (rows, cols) in enumerate(groups):
        x = deltas.index_select(0, rows).index_select(1, cols)
        w = None if weights is None else weights.index_select(0, rows)
        ref = None if reference is None else reference.index_select(0, cols)
        if per_block and i != shared:
            bound = BLOCK_CLIP * rho * float(cols.numel()) ** 0.5
            x = clip_rows(x, bound)
            clipped_groups += 1
            agg, diag, red = apply_rule(rule, x, w, ref, None)
        else:
            agg, diag, red = apply_rule(rule, x, w, ref, radius)
        if agg is None:
            skipped += 1
            continue
        degraded += int(red)
        out.index_copy_(0, cols, agg)
        covered.index_fill_(0, cols, True)
        # Diagnostics of the groups, weighted by how many coordinates each one holds.
        n = cols.numel()
        width += n
        for k, v in diag.items():
            sums[k] = sums.get(k, 0.0) + float(v) * n
    metrics = {k: v / width for k, v in sums.items()} if width else {}
    metrics["agg/coverage_groups"] = float(len(groups))
    if per_block:
        metrics["agg/block_scale"] = rho
        metrics["agg/block_clipped_groups"] = float(clipped_groups)
    return RuleOutcome(out, metrics, degraded, skipped, covered)


def coverage_groups_count(masks: Tensor) -> list[int]:
    """Row counts of the coverage groups (for diagnostics and build-time checks)."""
    return [int(rows.numel()) for rows, _ in coverage_groups(masks)]


__all__ = [
    "RuleOutcome",
    "adapted_rule",
    "aggregate_covered",
    "apply_rule",
    "coverage_groups",
    "coverage_groups_count",
]
