"""The attack contracts (SPEC §6).

* :class:`UpdateAttack` rewrites the rows of the cohort's ``[S, d]`` update matrix that
  belong to Byzantine workers. Omniscient attacks read the benign rows, as in the
  literature. The benign rows are never modified.
* :class:`DataAttack` poisons a Byzantine client's local dataset once, when it is built;
  the client then trains honestly on the poisoned data.
"""

from __future__ import annotations

import torch
from torch import Tensor

from fedshield.registry import Registry


class UpdateAttack:
    kind = "update"
    #: False when the attack ignores the attacker's own honest update (noise, min_max, ...),
    #: so the engine can skip training that worker.
    needs_own_update: bool = True

    def __call__(
        self, updates: Tensor, byzantine: Tensor, *, generator: torch.Generator | None = None
    ) -> Tensor:
        """Return a new ``[S, d]`` matrix; ``byzantine`` is a ``[S]`` bool mask."""
        raise NotImplementedError


class DataAttack:
    kind = "data"

    def poison(self, x: Tensor, y: Tensor, num_classes: int) -> tuple[Tensor, Tensor]:
        raise NotImplementedError


ATTACKS: Registry[type[UpdateAttack] | type[DataAttack]] = Registry("attack")
