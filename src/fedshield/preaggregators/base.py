"""The pre-aggregator contract: ``[n, d]`` rows (and weights) in, ``[k, d]`` rows out.

A pre-aggregator transforms the screened updates before the configured rule sees them
(Allouah et al., AISTATS 2023: NNM; Karimireddy et al., ICLR 2022: Bucketing; Allouah et
al. 2024: ARC; static clipping), so it composes with any rule
(:class:`~fedshield.preaggregators.composed.ComposedRule`). Each is a pure tensor function
(``nnm``, ``bucketing``, ``arc``, ``clip``) wrapped in a registered class that declares its
parameters as a :class:`~fedshield.core.params.Params` schema, like the aggregators.

Every pre-aggregator

* keeps the dtype and device it is given and never modifies its inputs; rows are finite
  (the composed rule drops non-finite rows first);
* maps the weights along: a row built from one input row keeps its weight, a bucket gets
  the sum of its members' weights (None stays None);
* says how many rows it returns for n inputs (:meth:`PreAggregator.rows_out`) and
  whether it can run on n rows (:meth:`PreAggregator.validate`, :meth:`adapted`), so the
  composed rule can check the rule behind it at build time and per coverage group.
"""

from __future__ import annotations

from typing import Any, ClassVar

import torch
from torch import Tensor

from fedshield.aggregators._ops import W, column_blocks, to_dtype
from fedshield.core.params import Configured
from fedshield.errors import ConfigError
from fedshield.registry import Registry


class PreAggregator(Configured):
    """Base class: set ``params_schema`` and implement :meth:`transform`."""

    #: True when the output depends on a random draw (Bucketing's permutation): the
    #: composed rule then passes a generator seeded from the run's seed and the rows.
    random: ClassVar[bool] = False

    def _where(self) -> str:
        return f"pre-aggregator {self.name!r}"

    def replace(self, **changes: Any) -> PreAggregator:
        return type(self)(**{**self.params.kwargs(), **changes})

    def __call__(
        self, updates: Tensor, weights: Tensor | None, *, generator: torch.Generator | None = None
    ) -> tuple[Tensor, Tensor | None]:
        """The rows (and weights) the rule sees: :meth:`transform` of checked inputs."""
        check_rows(self.name, updates, weights)
        return self.transform(updates, weights, generator)

    def transform(
        self, updates: Tensor, weights: Tensor | None, generator: torch.Generator | None
    ) -> tuple[Tensor, Tensor | None]:
        """The pre-aggregator itself, on a non-empty floating ``[n, d]`` (and ``[n]``)."""
        raise NotImplementedError

    def rows_out(self, num_rows: int) -> int:
        """Rows returned for ``num_rows`` inputs (default: as many)."""
        return num_rows

    def validate(self, num_rows: int) -> None:
        """Raise :class:`ConfigError` when it cannot run on ``num_rows`` rows."""
        if num_rows < 1:
            raise ConfigError(f"{self.name}: needs at least one row, got {num_rows}")

    def adapted(self, num_rows: int) -> PreAggregator | None:
        """The pre-aggregator to run on ``num_rows`` rows (self, a smaller f, or None)."""
        try:
            self.validate(num_rows)
        except ConfigError:
            return None
        return self

    def bind(self, rule: Any) -> PreAggregator:
        """Resolve defaults that depend on the rule behind it (e.g. NNM's f); default self."""
        return self


PRE_AGGREGATORS: Registry[type[PreAggregator]] = Registry("pre-aggregator")


def mix_rows(coef: Tensor, x: Tensor) -> Tensor:
    """``coef @ x`` for a ``[k, n]`` float64 mixing matrix of convex combinations, in
    float64 column blocks (no overflow for finite rows of any size), cast back finite."""
    out = torch.empty(coef.shape[0], x.shape[1], dtype=W, device=x.device)
    c = coef.to(device=x.device, dtype=W)
    for blk in column_blocks(x):
        out[:, blk] = c @ x[:, blk].to(W)
    return to_dtype(out, x.dtype)


def check_rows(owner: str, updates: Tensor, weights: Tensor | None) -> None:
    if updates.dim() != 2 or not updates.is_floating_point() or updates.shape[0] == 0:
        raise ValueError(
            f"{owner}: updates must be a non-empty floating [n, d] tensor, got "
            f"{updates.dtype} of shape {tuple(updates.shape)}"
        )
    if weights is not None and weights.shape != (updates.shape[0],):
        raise ValueError(
            f"{owner}: weights must be [{updates.shape[0]}], got {tuple(weights.shape)}"
        )


__all__ = ["PRE_AGGREGATORS", "PreAggregator", "check_rows", "mix_rows"]
