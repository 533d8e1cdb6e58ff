"""The values of a run: its built parts (:class:`Components`, :class:`Experiment`), what a
checkpoint holds (:class:`RunState`), a round's decisions before any client trains
(:class:`RoundPlan`), and what the batched trainer needs of the run (:class:`CohortHost`).
Value types only, below the builder and the engine, so the batched trainer, the privacy
set-up, the Flower strategy and the callbacks name them without importing either."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

import torch
from torch import Tensor, nn

from fedshield.core.context import ClientUpdate, RoundContext
from fedshield.data.bundle import DataBundle, TensorData

if TYPE_CHECKING:
    from fedshield.aggregators.base import Aggregator
    from fedshield.algorithms.client import ClientAlgorithm
    from fedshield.algorithms.server import ServerAlgorithm
    from fedshield.attacks.base import DataAttack, UpdateAttack
    from fedshield.config import ExperimentConfig
    from fedshield.core.params import Params
    from fedshield.faults.base import RoundFaults
    from fedshield.sim.byzantine_budget import ByzantineBudget


@dataclass
class Components:
    """The data-independent parts of an experiment."""

    client: ClientAlgorithm
    server: ServerAlgorithm
    aggregator: Aggregator
    attack: UpdateAttack | DataAttack | None
    #: the run's Byzantine statement (:mod:`fedshield.sim.byzantine_budget`), in summary.json
    budget: ByzantineBudget | None = None
    #: the dataset's, partitioner's and model's parameters as validated once
    #: (:func:`fedshield.sim.builder.read_sections`)
    parsed: dict[str, Params] = field(default_factory=dict)


@dataclass
class Experiment:
    cfg: ExperimentConfig
    components: Components
    bundle: DataBundle
    clients: list[TensorData]
    train: TensorData
    root: TensorData | None
    val: TensorData | None
    model: nn.Module
    byzantine: tuple[int, ...]
    device: torch.device


@dataclass
class RunState:
    """Everything a checkpoint holds: the next round to run and the values of the run."""

    round: int
    params: Tensor
    buffers: Tensor
    server_state: dict[str, Tensor]
    client_states: dict[int, dict[str, Tensor]] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {
            "round": self.round,
            "params": self.params.cpu(),
            "buffers": self.buffers.cpu(),
            "server_state": {k: v.cpu() for k, v in self.server_state.items()},
            "client_states": {
                k: {n: v.cpu() for n, v in s.items()} for k, s in self.client_states.items()
            },
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any], device: torch.device) -> RunState:
        return cls(
            round=d["round"],
            params=d["params"].to(device),
            buffers=d["buffers"].to(device),
            server_state={k: v.to(device) for k, v in d["server_state"].items()},
            client_states={
                int(k): {n: v.to(device) for n, v in s.items()}
                for k, s in d["client_states"].items()
            },
        )


@dataclass(frozen=True)
class RoundPlan:
    """A round's decisions before any client trains: context (cohort, attackers) and the
    broadcast payload. ``skip_training``: selected attackers whose rows the update attack
    overwrites upload zeros instead of training."""

    ctx: RoundContext
    payload: Any
    skip_training: bool
    #: ``[faults]``: who was online, who drops, who is late (None: no faults configured).
    faults: RoundFaults | None = None

    def trains(self, k: int) -> bool:
        return not (self.skip_training and k in self.ctx.byzantine)

    def local_steps(self, k: int, full: int) -> int:
        """Client ``k``'s local steps: ``full``, or the steps a late client finished."""
        return full if self.faults is None else self.faults.local_steps(k, full)


class CohortHost(Protocol):
    """What the batched trainer reads of the run (the :class:`Simulator`)."""

    exp: Experiment
    cfg: ExperimentConfig
    comp: Components
    model: nn.Module
    device: torch.device
    state: RunState

    def client_data(self, k: int, byzantine: bool) -> TensorData: ...

    def untrained_upload(self, k: int, delta: Tensor) -> ClientUpdate: ...


__all__ = ["CohortHost", "Components", "Experiment", "RoundPlan", "RunState"]
