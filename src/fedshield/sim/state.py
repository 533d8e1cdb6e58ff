"""The values of a run: what a checkpoint holds (:class:`RunState`) and a round's decisions
before any client trains (:class:`RoundPlan`). Value types only, below the engine, so the
batched trainer, the Flower strategy and the callbacks can name them without the engine."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor

from fedshield.core.context import RoundContext


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

    def trains(self, k: int) -> bool:
        return not (self.skip_training and k in self.ctx.byzantine)


__all__ = ["RoundPlan", "RunState"]
