"""The server-algorithm contract (DESIGN: init / broadcast / update, state as a value).

A server algorithm owns no mutable state of its own: the engine passes the global
parameters and the algorithm's state dict in, and stores what comes back, so a checkpoint
is just those values. Aggregation math lives in :mod:`fedshield.aggregators`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

import torch
from torch import Tensor

from fedshield.aggregators.base import Aggregator
from fedshield.core.context import ClientUpdate, Payload, RoundContext
from fedshield.core.params import NoParams, Params
from fedshield.registry import Registry

State = dict[str, Tensor]


class ServerServices(Protocol):
    """What the round loop offers a server algorithm beyond the updates."""

    def root_update(self, params: Tensor, buffers: Tensor, ctx: RoundContext) -> ClientUpdate:
        """Train a copy of θ on the server's root dataset with the client rule (SPEC §3)."""
        ...


@dataclass
class ServerStep:
    params: Tensor
    buffers: Tensor
    state: State
    metrics: dict[str, float] = field(default_factory=dict)


def stack_deltas(updates: list[ClientUpdate]) -> Tensor:
    return torch.stack([u.delta for u in updates])


def client_weights(updates: list[ClientUpdate], weighting: str, like: Tensor) -> Tensor | None:
    """Sample-count weights (``samples``) or ``None`` for the uniform 1/S form."""
    if weighting == "uniform":
        return None
    return torch.tensor(
        [float(u.num_examples) for u in updates], device=like.device, dtype=like.dtype
    )


def mean_buffers(updates: list[ClientUpdate], weights: Tensor | None) -> Tensor:
    """Buffers (BatchNorm statistics) by the plain weighted mean (SPEC §1)."""
    b = torch.stack([u.buffers for u in updates])
    if weights is None:
        return b.mean(0)
    w = weights.to(b.dtype)
    return (w[:, None] * b).sum(0) / w.sum()


class ServerAlgorithm:
    """Base: broadcast θ, aggregate pseudo-gradients with the configured rule, step η_g."""

    params_schema: type[Params] = NoParams
    #: The aggregator used when the config leaves ``server.aggregator`` unset.
    default_aggregator: str = "mean"

    def __init__(
        self,
        aggregator: Aggregator,
        *,
        lr: float = 1.0,
        weighting: str = "samples",
        params: Params | None = None,
    ) -> None:
        self.aggregator = aggregator
        self.lr = lr
        self.weighting = weighting
        self.params = params if params is not None else self.params_schema()

    @property
    def needs_root(self) -> bool:
        """True when the server trains on a root dataset (BR-DRAG, FLTrust)."""
        return self.aggregator.needs_reference

    def init_state(self, params: Tensor) -> State:
        return {}

    def broadcast(
        self, params: Tensor, buffers: Tensor, state: State, ctx: RoundContext
    ) -> Payload:
        return Payload(params=params, buffers=buffers)

    def update(
        self,
        params: Tensor,
        buffers: Tensor,
        state: State,
        updates: list[ClientUpdate],
        ctx: RoundContext,
        services: ServerServices,
    ) -> ServerStep:
        raise NotImplementedError

    def post_step(
        self, step: ServerStep, ctx: RoundContext, services: ServerServices
    ) -> ServerStep:
        """A server step after aggregation (FedCART's classifier re-training); default none."""
        return step


SERVER_ALGORITHMS: Registry[type[ServerAlgorithm]] = Registry("server algorithm")
