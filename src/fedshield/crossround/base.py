"""The round-defense contract: state carried from round to round, in the server state.

A per-round defense (the rule, the per-block bound, the upload checks) bounds one step on
the rows of one cohort. Two things escape it: a cohort that holds more
attackers than the rule can outvote (fixed attackers, sampled cohorts: at M = 50, S = 10,
30 %, one cohort in eight holds ≥ 5), and attackers that are the majority of a depth tier,
who choose that block's direction every round. A **round defense** remembers what earlier
rounds saw and acts on the round step of :func:`fedshield.algorithms.server.step.server_round_step`
at two points:

* :meth:`RoundDefense.complete`: before the round step decides whether the rule has
  enough rows for the cohort's f — rows for invited clients that sent nothing (``fill``);
* :meth:`RoundDefense.rows` (and :meth:`RoundDefense.rule`): before the server's update —
  which rows the rule sees (cached aggregation: every client's latest screened upload, not
  only this cohort's) and with which f;
* :meth:`RoundDefense.bound`: after ``update`` and ``post_step``, before the non-finite
  guard — what step is applied (the step bound: a trust region from recent applied steps).

A defense owns no mutable attributes: its memory is tensors in the server state under
its own prefix (``"<name>/..."``), so the engine's checkpoint, a resumed run and a Flower
strategy's ``state`` carry it like any server state (checked finite on resume). State
loaded from disk is untrusted: a defense that finds its tensors malformed (shape, dtype)
starts its memory over and says so (``defense/<name>/reset``), never raises.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar

from torch import Tensor

from fedshield.algorithms.server.base import ServerRound
from fedshield.core.context import ClientUpdate, RoundContext
from fedshield.core.params import Configured
from fedshield.registry import Registry

State = dict[str, Tensor]


@dataclass
class BoundInput:
    """What :meth:`RoundDefense.bound` sees: θ before and after the server's step, the rows
    the rule saw (their masks give the coverage blocks), the server's step size η_g and
    this round's own screened uploads (``judged``: before any defense changed the rows)."""

    before: Tensor
    after: Tensor
    rows: list[ClientUpdate]
    lr: float
    judged: list[ClientUpdate] = field(default_factory=list)


@dataclass
class Acted:
    """A defense's answer: its new state entries and its metrics for the round; from
    :meth:`RoundDefense.rows`, ``identified``: rows it left out as Byzantine on evidence
    (not on suspicion alone), which lower the rule's f by as many."""

    state: State = field(default_factory=dict)
    metrics: dict[str, float] = field(default_factory=dict)
    identified: int = 0


class RoundDefense(Configured):
    """Base class: set ``params_schema``; override :meth:`rows` and/or :meth:`bound`."""

    #: The parts of its server-state keys (``"<name>/<part>"``): declared so state read
    #: back (checkpoints, Flower ``strategy.state``) admits them; the defense checks their
    #: values itself and starts over on malformed ones (``defense/<name>/reset``).
    state_parts: ClassVar[tuple[str, ...]] = ()

    def _where(self) -> str:
        return f"round defense {self.name!r}"

    def key(self, part: str) -> str:
        """This defense's server-state key ``"<name>/<part>"``."""
        return f"{self.name}/{part}"

    def owns(self, key: str) -> bool:
        return key.startswith(f"{self.name}/")

    def state_keys(self) -> tuple[str, ...]:
        """Every server-state key this defense may write (:attr:`state_parts`)."""
        return tuple(self.key(p) for p in self.state_parts)

    def complete(
        self, rnd: ServerRound, needed: int | None, sent: set[int]
    ) -> tuple[list[ClientUpdate], Acted]:
        """Rows for a round that kept fewer than ``needed`` (the rows the rule needs for the
        cohort's f; None: no number suffices); ``rnd.updates``: the rows kept so far;
        ``sent``: the clients whose uploads were admitted this round, kept or rejected.
        Default: the kept rows. Its state entries are kept even when the round is then
        skipped."""
        return rnd.updates, Acted()

    def rows(
        self, kept: list[ClientUpdate], state: State, ctx: RoundContext
    ) -> tuple[list[ClientUpdate], Acted]:
        """The rows the rule sees this round (default: the cohort's screened uploads)."""
        return kept, Acted()

    def rule(self, rule: Any, num_rows: int, ctx: RoundContext) -> Any:
        """The rule to run on ``num_rows`` rows (default: the configured one)."""
        return rule

    def bound(self, step: BoundInput, state: State, ctx: RoundContext) -> tuple[Tensor, Acted]:
        """θ^{t+1} to apply (default: the server's own)."""
        return step.after, Acted()


ROUND_DEFENSES: Registry[type[RoundDefense]] = Registry("round defense")


def reset_note(name: str, what: str) -> Acted:
    """The answer of a defense whose stored memory was malformed: start over, say so."""
    import logging

    logging.getLogger("fedshield").warning(
        "round defense %s: stored state %s is malformed; its memory starts over", name, what
    )
    return Acted(metrics={f"defense/{name}/reset": 1.0})


__all__ = ["ROUND_DEFENSES", "Acted", "BoundInput", "RoundDefense", "State", "reset_note"]
