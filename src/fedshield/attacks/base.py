"""The attack contracts (SPEC §6).

* :class:`UpdateAttack` rewrites the rows of the cohort's ``[S, d]`` update matrix that
  belong to Byzantine workers. Omniscient attacks read the benign rows, as in the
  literature. The benign rows are never modified.
* :class:`DataAttack` poisons a Byzantine client's local dataset once, when it is built;
  the client then trains honestly on the poisoned data.

Every attack declares its parameters as a :class:`~fedshield.core.params.Params` schema
(``params_schema``) and its registry tags: ``kind=update`` or ``kind=data``, and
``omniscient`` when it reads the round's benign updates.
"""

from __future__ import annotations

from typing import Any, ClassVar

import torch
from torch import Tensor

from fedshield.core.params import NoParams, Params, parse_params
from fedshield.registry import Registry

#: Tag words the attacks use (to be merged into :data:`fedshield.registry.TAGS`).


class _Attack:
    """Parameters validated by the class's schema, also when constructed directly, so
    ``MinMax(tau=20)`` is refused exactly as ``attack.params.tau = 20`` is. Each field also
    becomes an attribute of the same name (``attack.sigma``)."""

    kind: ClassVar[str]
    params_schema: ClassVar[type[Params]] = NoParams

    def __init__(self, **params: Any) -> None:
        #: The validated parameters (a frozen :class:`Params`).
        self.params = parse_params(self.params_schema, params, "attack.params")
        for key, value in self.params.kwargs().items():
            setattr(self, key, value)


class UpdateAttack(_Attack):
    kind = "update"
    #: False when the attack ignores the attacker's own honest update (noise, min_max, ...),
    #: so the engine can skip training that worker.
    needs_own_update: bool = True

    def __call__(
        self, updates: Tensor, byzantine: Tensor, *, generator: torch.Generator | None = None
    ) -> Tensor:
        """Return a new ``[S, d]`` matrix; ``byzantine`` is a ``[S]`` bool mask."""
        raise NotImplementedError


class DataAttack(_Attack):
    kind = "data"

    def poison(self, x: Tensor, y: Tensor, num_classes: int) -> tuple[Tensor, Tensor]:
        raise NotImplementedError


ATTACKS: Registry[type[UpdateAttack] | type[DataAttack]] = Registry("attack")
