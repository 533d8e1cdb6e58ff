"""The configured round defenses around one server step (``server.round_defenses``).

``server.round_defenses = ["cache", "step_bound"]`` with
``server.round_defense_args = {step_bound = {kappa = 3.0}}`` makes the builder attach a
:class:`RoundDefenses` to the server algorithm; the round step
(:func:`fedshield.algorithms.server.step.server_round_step`) then runs

    kept = d_n.complete ∘ … ∘ d_1.complete (kept)   short rounds filled (before the f check)
    rows = d_n.rows ∘ … ∘ d_1.rows (kept)      the rows the rule sees
    θ'   = server.update, server.post_step     on those rows (f scaled by each d.rule,
                                               lowered by the rows left out as Byzantine)
    θ''  = d_1.bound ∘ … ∘ d_n.bound (θ')      the step applied

in place of ``update`` / ``post_step`` alone, before the non-finite guard. The server
sees its own state without the defenses' entries (so it cannot drop or rewrite them) and
the defenses' new entries are merged back into the state the step returns.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from typing import Any

from fedshield.algorithms.server.base import ServerAlgorithm, ServerRound, ServerStep
from fedshield.algorithms.server.cohort import rows_needed
from fedshield.algorithms.server.padding import padded
from fedshield.core.context import ClientUpdate
from fedshield.crossround.base import ROUND_DEFENSES, BoundInput, RoundDefense, State
from fedshield.errors import ConfigError


class RoundDefenses:
    """The configured defenses, in order (see the module docstring)."""

    def __init__(self, defenses: Sequence[RoundDefense]) -> None:
        self.defenses = tuple(defenses)

    def __repr__(self) -> str:
        return f"RoundDefenses({', '.join(repr(d) for d in self.defenses)})"

    def owns(self, key: str) -> bool:
        return any(d.owns(key) for d in self.defenses)

    def tagged(self, tag: str) -> bool:
        """True when a configured defense carries the registry tag ``tag``."""
        from fedshield.registry import tags_of

        return any(tag in tags_of(d) for d in self.defenses)

    def state_keys(self) -> tuple[str, ...]:
        return tuple(k for d in self.defenses for k in d.state_keys())

    def complete(
        self, rnd: ServerRound, needed: int | None, sent: set[int]
    ) -> tuple[list[ClientUpdate], State, dict[str, float]]:
        """Each defense's :meth:`~fedshield.crossround.base.RoundDefense.complete` in order
        (``rnd.updates``: the kept rows): the rows, the state entries they wrote and their
        metrics."""
        new: State = {}
        metrics: dict[str, float] = {}
        kept = rnd.updates
        for d in self.defenses:
            kept, acted = d.complete(rnd.replace(updates=kept), needed, sent)
            new |= acted.state
            metrics |= acted.metrics
        return kept, new, metrics

    def step(
        self,
        server: ServerAlgorithm,
        rnd: ServerRound,
        judged: list[ClientUpdate] | None = None,
        written: State | None = None,
        pad_f: int | None = None,
    ) -> ServerStep:
        """``server.update`` then ``server.post_step`` behind the defenses, on the round
        ``rnd`` (its updates: the kept rows). ``judged``: this round's own screened uploads
        (default the kept rows; rows :meth:`complete` added are not this round's);
        ``written``: state entries :meth:`complete` already wrote. ``pad_f``: the round's f
        when it kept too few rows for it: the rows the defenses leave are completed with
        zero rows (carrying θ's buffers) up to what the rule needs for f less the rows
        they identified (:mod:`fedshield.algorithms.server.padding`); the zero rows reach
        the rule only, never a defense's judgement, cache or bound."""
        state, ctx, kept = rnd.state, rnd.ctx, rnd.updates
        judged = kept if judged is None else judged
        own = {k: v for k, v in state.items() if not self.owns(k)}
        new: State = dict(written or {})
        metrics: dict[str, float] = {}
        rows = kept
        identified = 0
        for d in self.defenses:
            rows, acted = d.rows(rows, state, ctx)
            new |= acted.state
            metrics |= acted.metrics
            identified += acted.identified
        run = server
        rule = server.aggregator
        for d in self.defenses:
            rule = d.rule(rule, len(rows), ctx)
        rule = lowered_f(rule, identified)
        if rule is not server.aggregator:  # servers own no mutable state: a copy is enough
            run = copy.copy(server)
            run.aggregator = rule
        voted = rows
        if pad_f is not None:
            f = max(0, pad_f - identified)
            voted, added = padded(rows, rows_needed(rule, f), rnd.buffers, f)
            metrics["sys/padded"] = float(added)
        seen_by_server = rnd.replace(state=own, updates=voted)
        step = run.post_step(run.update(seen_by_server), seen_by_server)
        after = step.params
        for d in self.defenses:
            seen = BoundInput(rnd.params, after, rows, server.lr, judged)
            after, acted = d.bound(seen, state, ctx)
            new |= acted.state
            metrics |= acted.metrics
        step_state = {k: v for k, v in step.state.items() if not self.owns(k)}
        return ServerStep(after, step.buffers, step_state | new, step.metrics | metrics)


def lowered_f(rule: Any, identified: int) -> Any:
    """The rule with its f lowered by the ``identified`` Byzantine rows the defenses left
    out (never below 0); itself when it has no f or none was identified."""
    f = getattr(rule, "f", None)
    if identified <= 0 or not isinstance(f, int) or isinstance(f, bool) or f == 0:
        return rule
    return rule.replace(f=max(0, f - identified))


def build_round_defenses(
    names: Sequence[str],
    args: dict[str, dict[str, Any]] | None,
    where: str = "server.round_defense_args",
) -> RoundDefenses | None:
    """The registered defenses ``names`` (in order), parameters from ``args[name]``
    validated by each schema (errors name ``where.name.key``); None when ``names`` is
    empty. A name given twice, or an ``args`` entry for a name not in ``names``, is a
    :class:`ConfigError`."""
    twice = sorted({n for n in names if list(names).count(n) > 1})
    if twice:
        raise ConfigError(f"server.round_defenses: {twice[0]!r} is listed twice")
    out = ROUND_DEFENSES.build_listed(names, args, "server.round_defenses", where)
    return RoundDefenses(out) if out else None


def check_compatible(
    defenses: RoundDefenses, client_uploads: frozenset[str], central_dp: bool
) -> None:
    """Refuse what a defense cannot keep: a defense that hands the rule cached rows (tag
    ``caches_uploads``) keeps the delta, the count, the buffers and the mask of an upload, not
    method extras (SCAFFOLD's Δh, FedCART's prototypes); and under ``[privacy.central]``
    no round defense runs — a cached row reused in later rounds, or a radius taken from the
    raw rows, is not covered by the per-round noise accounting."""
    from fedshield.registry import tags_of

    extras = sorted(client_uploads - {"mask"})
    names = [d.name for d in defenses.defenses]
    if "fill" in names and "cache" in names:
        raise ConfigError(
            "server.round_defenses: 'fill' and 'cache' together: cache already hands the "
            "rule every client's latest row; keep one of them"
        )
    for d in defenses.defenses:
        if central_dp:
            raise ConfigError(
                f"server.round_defenses: {d.name!r} is not covered by [privacy.central]'s "
                "accounting (it reuses rows or row norms across rounds); remove one of them"
            )
        if "caches_uploads" in tags_of(d) and extras:
            raise ConfigError(
                f"server.round_defenses: {d.name!r} caches the delta, count, buffers and "
                f"mask of each upload, not the extras {extras} this client algorithm uploads"
            )


__all__ = ["RoundDefenses", "build_round_defenses", "check_compatible", "lowered_f"]
