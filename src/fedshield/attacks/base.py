"""The attack contracts (threat model: DRAG paper, Sec. II-B; docs/security.md §6).

* :class:`UpdateAttack` rewrites the rows of the cohort's ``[S, d]`` update matrix that
  belong to Byzantine workers. Omniscient attacks read the benign rows, as in the
  literature. The benign rows are never modified.
* :class:`DataAttack` poisons a Byzantine client's local dataset once, when it is built;
  the client then trains honestly on the poisoned data.

Every attack declares its parameters as a :class:`~fedshield.core.params.Params` schema
(``params_schema``) and its registry tags: ``kind=update`` or ``kind=data``, and
``omniscient`` when it reads the round's benign updates.

**Defense-aware attacks** (tag ``needs_rule``, class attribute ``needs_rule = True``) craft
their rows through the server's configured rule. The round loop then calls them with a
keyword ``context=`` :class:`AttackContext` holding that rule object (pre-aggregators
included, so a plugin rule is attacked like a built-in one) and the weights it will be
given, and what the server publishes about its defenses (docs/security.md §6b: its round defenses,
the step history a step bound keeps, η_g, the cohort size and the stated f). Only an attack
that also declares ``needs_reference = True`` (tag
``needs_reference``: the threat model "the attackers know the server's root update")
receives the server's reference r^t in the context; every other attack gets ``None`` there
and must estimate what it needs. Called without a context (a direct call, a test), a
defense-aware attack targets the plain mean (ByzFL's default ``agg=Average()``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

import torch
from torch import Tensor

from fedshield.aggregators.base import Aggregator
from fedshield.core.params import NoParams, Params, parse_params
from fedshield.registry import Registry, tags_of


@dataclass(frozen=True)
class AttackContext:
    """What the round loop tells a defense-aware attack about the server (see the module
    docstring). Everything here is the server's own object or value, never a copy to be
    trusted by the server afterwards."""

    #: The configured rule the server will run on the rows (a composed rule when
    #: ``server.pre_aggregators`` is set); None: the plain mean.
    rule: Aggregator | None = None
    #: ``[S]`` weights the server will give the rule (None: uniform).
    weights: Tensor | None = None
    #: The server's reference r^t (root-data update, momentum or Centered Clipping's
    #: centre) — only for attacks with ``needs_reference = True``; None otherwise.
    reference: Tensor | None = None
    #: The server's round defenses (``server.round_defenses``, :mod:`fedshield.crossround`)
    #: with their parameters as attributes: every defense parameter is published (docs/security.md
    #: §6b).
    defenses: tuple[Any, ...] = ()
    #: The server-state entries of the defenses that bound the applied step (tag
    #: ``bounds_step``: the step bound's last applied steps). The attackers receive θ^t every
    #: round, so they know every applied step; nothing else of the server state is here.
    published: Mapping[str, Tensor] = field(default_factory=dict)
    #: The server's step size η_g (θ^{t+1} = θ^t + η_g · aggregate).
    lr: float = 1.0
    #: The number of clients the server asked this round (None: the rows given).
    cohort: int | None = None
    #: The Byzantine count f the run states for a cohort (``server.byzantine_f``; None: the
    #: rule's own f, else its breakdown).
    byzantine_f: int | None = None


def published_state(defenses: Sequence[Any], state: Mapping[str, Tensor]) -> dict[str, Tensor]:
    """The entries of the server ``state`` that :attr:`AttackContext.published` holds: those
    of the round ``defenses`` tagged ``bounds_step`` (the applied steps, which θ^t reveals)."""
    owners = [d for d in defenses if "bounds_step" in tags_of(d)]
    return {k: v for k, v in state.items() if any(d.owns(k) for d in owners)}


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

    def state_dict(self) -> dict[str, Any]:
        """State carried from round to round (Mimic's warm-up), saved in the run's
        checkpoint so that a resumed run continues it; {} for the stateless attacks."""
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict` (called on resume; {} leaves the attack as built)."""


class UpdateAttack(_Attack):
    kind = "update"
    #: False when the attack ignores the attacker's own honest update (noise, min_max, ...),
    #: so the engine can skip training that worker.
    needs_own_update: bool = True
    #: True when the attack crafts its rows through the configured rule: the round loop
    #: then passes ``context=AttackContext(...)`` (tag ``needs_rule``).
    needs_rule: ClassVar[bool] = False
    #: True for the threat model "the attackers know the server's reference r^t": the
    #: round loop computes it and puts it in the context (tag ``needs_reference``).
    needs_reference: ClassVar[bool] = False

    def __call__(
        self, updates: Tensor, byzantine: Tensor, *, generator: torch.Generator | None = None
    ) -> Tensor:
        """Return a new ``[S, d]`` matrix; ``byzantine`` is a ``[S]`` bool mask. An attack
        with ``needs_rule`` also takes ``context: AttackContext | None = None``."""
        raise NotImplementedError


class DataAttack(_Attack):
    kind = "data"

    def poison(self, x: Tensor, y: Tensor, num_classes: int) -> tuple[Tensor, Tensor]:
        raise NotImplementedError


ATTACKS: Registry[type[UpdateAttack] | type[DataAttack]] = Registry("attack")
