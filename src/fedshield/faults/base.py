"""The fault-model contract: who is online, who answers, how much work arrives (DRAG paper, Sec.
II-A).

System heterogeneity as the field's simulators model it (FLGo's client state machine,
Wang et al. 2023; FedScale's device traces, Lai et al. ICML 2022): **availability** (which
clients can be sampled this round), **responsiveness** and **completeness** (a sampled
client drops out, or misses the round deadline and is dropped or returns partial work),
**connectivity** (a missing reply). A model is one registry entry with a
:class:`~fedshield.core.params.Params` schema and a ``stage`` tag:

* ``stage=availability``: :meth:`FaultModel.available` marks the clients online in a round;
  several availability models combine by AND;
* ``stage=response``: :meth:`FaultModel.respond` decides, for the sampled clients still
  answering, who drops, who is late and how many local steps a late client completed.

Every draw comes from ``(seed, round, FAULTS, model)`` streams indexed by client id
(:func:`stream`), so a client's fate does not depend on who else was sampled, the run needs
no fault state in its checkpoint, and a resumed run replays the same faults.
"""

from __future__ import annotations

import zlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np

from fedshield.core.params import Configured
from fedshield.core.seeds import FAULTS
from fedshield.registry import Registry, tags_of

#: The two stages a fault model can act in (its ``stage=`` tag).
STAGES = ("availability", "response")


@dataclass(frozen=True)
class FaultEnv:
    """What the fault models read of the run: the seed, M, and per client its full local
    steps and its compute per step relative to the full model (its depth/width tier)."""

    seed: int
    num_clients: int
    full_steps: Callable[[int], int] = field(default=lambda k: 1)
    cost: Callable[[int], float] = field(default=lambda k: 1.0)


@dataclass
class RoundFaults:
    """One round's faults (a value of the round plan): ``available`` clients of M, the
    ``sampled`` cohort, the ``exempt`` clients that always answer (attackers, by default),
    the sampled clients ``dropped`` after selection, those ``late`` at the deadline, and
    ``steps``: the local steps each late client that returns partial work completed."""

    available: int
    sampled: tuple[int, ...]
    exempt: frozenset[int] = frozenset()
    dropped: set[int] = field(default_factory=set)
    late: set[int] = field(default_factory=set)
    #: invited while offline (``faults.invite = "population"``): a missing row
    offline: set[int] = field(default_factory=set)
    steps: dict[int, int] = field(default_factory=dict)

    def answers(self, k: int) -> bool:
        """Whether client ``k``'s upload reaches the server this round."""
        if k in self.offline or k in self.dropped:
            return False
        return k not in self.late or k in self.steps

    def answering(self) -> tuple[int, ...]:
        return tuple(k for k in self.sampled if self.answers(k))

    def pending(self) -> list[int]:
        """Sampled clients a response model may still fault: not exempt, not yet faulted."""
        gone = self.dropped | self.late | self.offline
        return [k for k in self.sampled if k not in self.exempt and k not in gone]

    def local_steps(self, k: int, full: int) -> int:
        """Client ``k``'s local steps this round: ``full``, or what it completed in time."""
        return min(full, self.steps.get(k, full))

    def metrics(self) -> dict[str, float]:
        return {
            "faults/available": float(self.available),
            "faults/sampled": float(len(self.sampled)),
            "faults/dropped": float(len(self.dropped)),
            "faults/late": float(len(self.late)),
            "faults/partial": float(len(self.steps)),
        } | ({"faults/offline": float(len(self.offline))} if self.offline else {})


class FaultModel(Configured):
    """Base class: set ``params_schema``, register with a ``stage=`` tag and implement
    :meth:`available` (availability) or :meth:`respond` (response)."""

    def _where(self) -> str:
        return f"faults.params.{self.name}"

    @property
    def stage(self) -> str:
        (stage,) = tags_of(self)["stage"]
        return stage

    def prepare(self, env: FaultEnv) -> None:
        """Check the model against the run (a trace file against M) before any round;
        raise :class:`~fedshield.errors.ConfigError` naming the key. Default: nothing."""

    def available(self, rnd: int, env: FaultEnv) -> np.ndarray:
        """A boolean [M] array: client k can be sampled in round ``rnd``."""
        raise NotImplementedError

    def respond(self, rnd: int, env: FaultEnv, out: RoundFaults) -> None:
        """Fault some of ``out.pending()`` in place (add to ``dropped``, ``late``, ``steps``)."""
        raise NotImplementedError

    def rate(self, env: FaultEnv) -> float | None:
        """The long-run probability that a client passes this model in a round: online
        (availability) or answering once sampled (response), for the build-time statement
        (:mod:`fedshield.sim.arrivals`); None when the model cannot say (the statement then
        assumes 1 and says so). Called after :meth:`prepare`."""
        return None


FAULT_MODELS: Registry[type[FaultModel]] = Registry("fault model")


def stream(env: FaultEnv, rnd: int, name: str) -> np.random.Generator:
    """The (seed, round, FAULTS, model) stream; draw [M] values and index them by client id,
    so a client's draw does not depend on the cohort. ``rnd = 0``: the run's own draws
    (per-client speeds, phases)."""
    return np.random.default_rng([env.seed, rnd, FAULTS, zlib.crc32(name.encode())])


def uniforms(env: FaultEnv, rnd: int, name: str) -> np.ndarray:
    """[M] uniforms in [0, 1) of :func:`stream`."""
    return stream(env, rnd, name).random(env.num_clients)


def ids(clients: Sequence[int]) -> np.ndarray:
    return np.asarray(list(clients), dtype=np.int64)


__all__ = [
    "FAULT_MODELS",
    "STAGES",
    "FaultEnv",
    "FaultModel",
    "RoundFaults",
    "ids",
    "stream",
    "uniforms",
]
