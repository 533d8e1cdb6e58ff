"""The server's rule as a defense-aware attack sees it
(:class:`~fedshield.attacks.base.AttackContext`).

:class:`RuleOracle` returns the aggregate the configured rule would compute on a candidate
``[S, d]`` matrix: the rule object itself (a plugin rule or a composed rule with
pre-aggregators is called exactly like a built-in one), run on as many rows as it can
(``Aggregator.adapted``, what the server does after screening) with the server's weights
and, for rules that need a reference or a centre, the reference the attacker has: the
server's r^t for attacks that know it, else a stand-in the attack chooses (an estimate).
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from fedshield.aggregators._ops import W
from fedshield.aggregators.base import Aggregator
from fedshield.attacks._common import honest_pool, with_rows
from fedshield.attacks.base import AttackContext
from fedshield.errors import ConfigError
from fedshield.registry import tags_of


def needs_reference(rule: Aggregator | None) -> bool:
    """True when ``rule`` is run with a reference (r^t) or a centre (Centered Clipping)."""
    if rule is None:
        return False
    return bool(getattr(rule, "needs_reference", False)) or "needs_center" in tags_of(rule)


class RuleOracle:
    """``oracle(x) -> [d] aggregate or None`` (None: the rule cannot run on these rows).

    ``stand_in``: the reference to use when the context carries none and the rule needs
    one (an attack that does not know r^t estimates it, e.g. by the mean benign update).
    """

    def __init__(self, context: AttackContext | None, stand_in: Tensor | None = None) -> None:
        ctx = context or AttackContext()
        self.rule = ctx.rule
        self.weights = ctx.weights
        ref = ctx.reference
        if ref is None and needs_reference(self.rule):
            ref = stand_in
        self.reference = ref
        self._runs: dict[int, Aggregator | None] = {}
        self.calls = 0

    def _run(self, n: int) -> Aggregator | None:
        if n not in self._runs:
            assert self.rule is not None
            adapted = getattr(self.rule, "adapted", None)
            self._runs[n] = adapted(n) if adapted is not None else self.rule
        return self._runs[n]

    def __call__(self, x: Tensor) -> Tensor | None:
        self.calls += 1
        n = x.shape[0]
        w = self.weights
        if w is not None and w.shape != (n,):
            w = None
        if self.rule is None:
            if w is None:
                return x.mean(dim=0)
            w = w.to(device=x.device, dtype=x.dtype)
            return (w / w.sum()) @ x
        run = self._run(n)
        if run is None:
            return None
        ref = self.reference
        if ref is not None:
            ref = ref.to(device=x.device, dtype=x.dtype)
        try:
            return run(x, w, reference=ref)
        except (ValueError, ConfigError):  # e.g. a reference rule given no stand-in
            return None


def benign_oracle(
    updates: Tensor, mask: Tensor, context: AttackContext | None
) -> tuple[Tensor, Tensor, RuleOracle]:
    """(benign rows, their mean μ, the rule's oracle) of an omniscient defense-aware attack.
    A rule that needs r^t, run by an attacker who does not know it, gets μ as the stand-in
    (the attacker's best guess of the server's r)."""
    pool = honest_pool(updates, mask)
    mean = pool.mean(dim=0)
    return pool, mean, RuleOracle(context, stand_in=mean)


def selects(
    oracle: RuleOracle,
    updates: Tensor,
    mask: Tensor,
    rows: Tensor,
    nudge: Tensor,
    *,
    every: bool = False,
) -> bool:
    """True when the rule selects the crafted ``rows`` (one ``[d]`` vector copied to every
    attacker), read from the output of the rule called as a black box (Krum, Multi-Krum,
    a plugin) on the rows in float64: a row is selected when moving it by
    ``nudge`` (callers take 1e-9 of the crafted step) moves the aggregate.

    ``every=False`` (Krum, which keeps one row): some copy is selected, i.e. the aggregate
    moves when all copies move by ``nudge``. ``every=True`` (Multi-Krum: the
    NDSS'21 authors' "all attackers selected"): identical copies share one score, so a
    subset rule can cut among them; we move the last copy alone by ±``nudge``, which makes
    it the worst-scored copy for one of the two signs, and ask that the aggregate follow it
    for both: the worst copy, hence every copy, is selected. "Follow" is a share
    ⟨Δaggregate, ±nudge⟩/‖nudge‖² above 1 % of 1/S (a selected row weighs 1/m ≥ 1/S in an
    unweighted mean): which of two equal copies a rule keeps changes its summation order,
    so the aggregate's bits move by rounding even when the nudged copy is cut."""
    # Probed in float64: a nudge far below the rows' scale (so that it moves no cut but the
    # one asked about) stays representable and rounding stays far below it. It must be
    # small: near the boundary a copy's score moves slowly with γ, so a nudge of 1e-7 of
    # the step shifted the γ found by ~1e-5 (the authors' τ) on one seeded input in 36.
    updates, rows, nudge = updates.to(W), rows.to(W), nudge.to(W)
    base = with_rows(updates, mask, rows)
    out = oracle(base)
    if out is None:
        return False
    if not every:
        moved = oracle(with_rows(updates, mask, rows + nudge))
        return moved is not None and not torch.equal(out, moved)
    last = int(mask.nonzero()[-1])
    step = nudge.to(device=out.device)
    floor = 1e-2 / updates.shape[0] * float(step @ step)
    for sign in (1.0, -1.0):
        probe = base.clone()
        probe[last] = (rows + sign * nudge).to(dtype=probe.dtype, device=probe.device)
        moved = oracle(probe)
        if moved is None or not sign * float((moved.to(W) - out.to(W)) @ step) > floor:
            return False
    return True


def distance(out: Tensor | None, target: Tensor) -> float:
    """‖out − target‖ in float64; −inf when the rule gave nothing or a non-finite result
    (never a better candidate than one that works)."""
    if out is None:
        return -math.inf
    value = float(torch.linalg.vector_norm(out.double() - target.double()))
    return value if math.isfinite(value) else -math.inf


def directed(out: Tensor | None, before: Tensor, s: Tensor) -> float:
    """Fang et al.'s directed deviation sᵀ(g − g′) of the aggregate ``out`` from the
    before-attack aggregate g (−inf when the rule gave nothing)."""
    if out is None:
        return -math.inf
    value = float(s.double() @ (before.double() - out.double()))
    return value if math.isfinite(value) else -math.inf


__all__ = [
    "RuleOracle",
    "benign_oracle",
    "directed",
    "distance",
    "needs_reference",
    "selects",
]
