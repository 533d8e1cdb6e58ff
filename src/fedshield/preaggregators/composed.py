"""A rule behind pre-aggregators, as one :class:`~fedshield.aggregators.base.Aggregator`.

``server.pre_aggregators = ["nnm", "bucketing"]`` (with ``server.pre_aggregator_args``)
makes the builder wrap the configured rule: the server, the upload checks, the coverage
groups (the rule runs per group: so do its pre-aggregators), the secondary fields and the
Flower strategies all see one rule object, exactly as without pre-aggregators.

On a call the composed rule drops the non-finite rows (counted in ``agg/nonfinite``, the
contract of every rule; the engine screens them out before), runs the pre-aggregators in
order on the rows and weights, then the rule. It carries the rule's registry tags
(``robust``, ``needs_reference``, ``min_clients``, ...), its ``needs_reference`` and its
hyper-parameters as attributes (``rule.f``), so tag checks and the attacks treat it as
the rule it wraps. Its minimum-row condition is the rule's on the rows that reach it
(Bucketing turns n rows into ⌈n/s⌉): :meth:`validate` and :meth:`adapted` check it.

Randomness (Bucketing's permutation) comes from a generator seeded by the run's seed and
the round only (:meth:`ComposedRule.for_round`, called by the round step), never from the
rows: a fingerprint of the rows let attackers pick the permutation with one-ulp nudges to
their own rows. A resumed run draws the same buckets.

f attackers spoil up to f buckets, so the rule behind gets the cohort's f, not f/s nor an
f derived from the bucket rows: its minimum-row condition for that f is checked on the
⌈n/s⌉ rows that reach it (:mod:`fedshield.algorithms.server.cohort`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor

from fedshield.aggregators._ops import row_sq_norms
from fedshield.aggregators.base import Aggregator, Diagnostics, normalised_weights
from fedshield.core.context import derive_seed
from fedshield.errors import ConfigError
from fedshield.preaggregators.base import PreAggregator
from fedshield.registry import tags_of

#: The seed purpose of Bucketing's draws (a value apart from :mod:`fedshield.core.seeds`'s).
BUCKETS = 0xB0C4E7


def round_generator(seed: int, rnd: int, num_rows: int) -> torch.Generator:
    """A CPU generator seeded by (``seed``, round ``rnd``, the row count) only."""
    return torch.Generator().manual_seed(derive_seed(seed, rnd, num_rows, BUCKETS))


class ComposedRule(Aggregator):
    """``pre[-1] ∘ … ∘ pre[0]`` then ``rule`` (see the module docstring)."""

    def __init__(
        self, pre: Sequence[PreAggregator], rule: Aggregator, seed: int = 0, rnd: int = 0
    ) -> None:
        if not pre:
            raise ValueError("ComposedRule needs at least one pre-aggregator")
        self.__dict__["rule"] = rule  # first: __getattr__ reads it
        self.pre = tuple(p.bind(rule) for p in pre)
        self.seed = seed
        self.round = rnd
        self.params = rule.params
        # The rule's facts, so that tag checks, fields and attacks see the rule it wraps.
        self.registry_tags = tags_of(rule)
        self.registry_name = "+".join([*(p.name for p in self.pre), rule._name])
        self.needs_reference = rule.needs_reference  # type: ignore[misc]

    def __getattr__(self, name: str) -> Any:
        # The wrapped rule's hyper-parameters (rule.f, rule.c, rule.tau) read through.
        if name.startswith("__"):
            raise AttributeError(name)
        rule = self.__dict__.get("rule")
        if rule is None:
            raise AttributeError(name)
        return getattr(rule, name)

    @property
    def _name(self) -> str:
        return self.registry_name

    def __repr__(self) -> str:
        return " → ".join([*(repr(p) for p in self.pre), repr(self.rule)])

    def replace(self, **changes: Any) -> Aggregator:
        return ComposedRule(self.pre, self.rule.replace(**changes), self.seed, self.round)

    def for_round(self, rnd: int) -> Aggregator:
        if not any(p.random for p in self.pre) or rnd == self.round:
            return self
        return ComposedRule(self.pre, self.rule, self.seed, rnd)

    def _chain(self, num_rows: int) -> list[int]:
        """Rows entering each pre-aggregator, then the rule."""
        sizes = [num_rows]
        for p in self.pre:
            sizes.append(p.rows_out(sizes[-1]))
        return sizes

    def validate(self, num_rows: int) -> None:
        sizes = self._chain(num_rows)
        for p, n in zip(self.pre, sizes, strict=False):
            p.validate(n)
        try:
            self.rule.validate(sizes[-1])
        except ConfigError as err:
            raise ConfigError(
                f"{err} (the {sizes[-1]} rows left by the pre-aggregators "
                f"{', '.join(p.name for p in self.pre)} from {num_rows})"
            ) from None

    def adapted(self, num_rows: int) -> Aggregator | None:
        pre: list[PreAggregator] = []
        n = num_rows
        for p in self.pre:
            run = p.adapted(n)
            if run is None:
                return None
            pre.append(run)
            n = run.rows_out(n)
        rule = self.rule.adapted(n)
        if rule is None:
            return None
        if rule is self.rule and all(a is b for a, b in zip(pre, self.pre, strict=True)):
            return self
        return ComposedRule(pre, rule, self.seed, self.round)

    def aggregate(
        self, updates: Tensor, weights: Tensor | None = None, *, reference: Tensor | None = None
    ) -> tuple[Tensor, Diagnostics]:
        normalised_weights(updates, weights)  # shape and value checks
        finite = torch.isfinite(row_sq_norms(updates))
        dropped = int((~finite).sum())
        x, w = updates, weights
        if dropped:
            if dropped == updates.shape[0]:
                raise ValueError(f"{self._name}: every row is non-finite; nothing to aggregate")
            keep = finite.nonzero().squeeze(1)
            x = updates.index_select(0, keep)
            w = None if weights is None else weights.index_select(0, keep.to(weights.device))
        gen = None
        if any(p.random for p in self.pre):
            gen = round_generator(self.seed, self.round, x.shape[0])
        for p in self.pre:
            x, w = p(x, w, generator=gen)
        out, diag = self.rule.aggregate(x, w, reference=reference)
        diag = dict(diag)
        diag["agg/nonfinite"] = float(dropped) + float(diag.get("agg/nonfinite", 0.0))
        diag["agg/pre_rows"] = float(x.shape[0])
        return out, diag


def compose(
    names: Sequence[str],
    args: dict[str, dict[str, Any]] | None,
    rule: Aggregator,
    seed: int = 0,
    where: str = "server.pre_aggregator_args",
) -> Aggregator:
    """``rule`` behind the registered pre-aggregators ``names`` (in order), their
    parameters from ``args[name]`` validated by each schema (errors name ``where.name.key``);
    ``rule`` itself when ``names`` is empty. An ``args`` entry for a name not in ``names``
    is a :class:`ConfigError`."""
    from fedshield.preaggregators.base import PRE_AGGREGATORS

    pre = PRE_AGGREGATORS.build_listed(names, args, "server.pre_aggregators", where)
    return ComposedRule(pre, rule, seed) if pre else rule


__all__ = ["ComposedRule", "compose", "round_generator"]
