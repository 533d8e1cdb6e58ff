"""The aggregator contract (SPEC §1): a pure rule on a dense ``[S, d]`` matrix of updates.

``aggregate(updates, weights, reference=...) -> (update[d], diagnostics)``. Rules keep
the device and dtype they are given and never modify their inputs. ``__call__`` returns
only the tensor, so ``fedshield.aggregators.build("krum", f=2)(updates)`` reads naturally.
"""

from __future__ import annotations

from torch import Tensor

from fedshield.errors import ConfigError
from fedshield.registry import Registry

Diagnostics = dict[str, float]


class Aggregator:
    """Base class. Subclasses implement :meth:`aggregate`."""

    #: True when the rule needs a reference direction (DRAG, BR-DRAG, FLTrust).
    needs_reference: bool = False

    def aggregate(
        self, updates: Tensor, weights: Tensor | None = None, *, reference: Tensor | None = None
    ) -> tuple[Tensor, Diagnostics]:
        raise NotImplementedError

    def __call__(
        self, updates: Tensor, weights: Tensor | None = None, *, reference: Tensor | None = None
    ) -> Tensor:
        return self.aggregate(updates, weights, reference=reference)[0]

    def validate(self, num_clients: int) -> None:
        """Raise :class:`ConfigError` when the rule cannot work with ``num_clients`` rows."""

    def _require_reference(self, reference: Tensor | None) -> Tensor:
        if reference is None:
            raise ValueError(f"{type(self).__name__} needs a reference direction")
        return reference


AGGREGATORS: Registry[type[Aggregator]] = Registry("aggregator")


def check_updates(updates: Tensor, weights: Tensor | None) -> Tensor:
    """Validate shapes and return float weights on the updates' device/dtype (uniform if None)."""
    if updates.dim() != 2:
        raise ValueError(f"updates must be [S, d], got shape {tuple(updates.shape)}")
    s = updates.shape[0]
    if s == 0:
        raise ValueError("no updates to aggregate")
    if weights is None:
        return updates.new_full((s,), 1.0 / s)
    if weights.shape != (s,):
        raise ValueError(f"weights must be [{s}], got shape {tuple(weights.shape)}")
    w = weights.to(device=updates.device, dtype=updates.dtype)
    total = w.sum()
    if not total > 0:
        raise ValueError("weights must have a positive sum")
    return w / total


__all__ = ["AGGREGATORS", "Aggregator", "ConfigError", "Diagnostics", "check_updates"]
