"""What a client algorithm's per-step pieces receive (:class:`~fedshield.algorithms.client.
base.ClientAlgorithm`): one client's values in the sequential loop, or a group of clients'
stacked on a leading axis in the batched trainer (:mod:`fedshield.sim.vectorized`). The
pieces are written once, so that the same arithmetic broadcasts over both.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import torch
from torch import Tensor, nn

from fedshield.adversarial.linf import Draws
from fedshield.core.context import Payload
from fedshield.data.bundle import TensorData


@dataclass(frozen=True)
class LocalSpec:
    """Local-training hyper-parameters shared by every client algorithm."""

    lr: float
    batch_size: int
    steps: int | None = 10
    epochs: int | None = None
    momentum: float = 0.0
    weight_decay: float = 0.0

    def num_steps(self, n: int) -> int:
        if self.epochs is not None:
            return self.epochs * math.ceil(n / self.batch_size)
        assert self.steps is not None
        return self.steps


@dataclass(frozen=True)
class Batch:
    """One client's mini-batch as :meth:`ClientAlgorithm.examples` and
    :meth:`ClientAlgorithm.objective` see it (inside ``vmap`` when batched: that client's
    rows): inputs, labels, the round's payload and the client's constants."""

    x: Tensor
    y: Tensor
    payload: Payload
    consts: dict[str, Tensor] = field(default_factory=dict)


@dataclass(frozen=True)
class ClientContext:
    """Who trains, in which round, with which random numbers, on which device."""

    client_id: int
    round: int
    generator: torch.Generator
    device: torch.device
    amp: bool = False


@dataclass(frozen=True)
class ClientRound:
    """One client's round as its algorithm reads it (:meth:`ClientAlgorithm.local_update`,
    :meth:`ClientAlgorithm.constants`, :meth:`ClientAlgorithm.finish`): the broadcast
    payload, the client's data, its state kept across rounds (updated in place by the
    algorithm) and its context. One value, so a new input reaches every algorithm without
    a signature change."""

    payload: Payload
    data: TensorData
    state: dict[str, Tensor]
    ctx: ClientContext

    @property
    def device(self) -> torch.device:
        return self.ctx.device

    def replace(self, **changes: Any) -> ClientRound:
        """This round with some inputs changed (the payload as the pieces see it)."""
        return replace(self, **changes)


def split_like(flat: Tensor, like: Sequence[Tensor]) -> list[Tensor]:
    """Views of ``flat`` ([*lead, d], the flat-vector order of :mod:`fedshield.core.flat`)
    shaped like the tensors ``like`` ([*lead, *shape] each)."""
    lead = flat.shape[:-1]
    out, offset = [], 0
    for t in like:
        shape = t.shape[len(lead) :]
        n = shape.numel()
        out.append(flat[..., offset : offset + n].view(*lead, *shape))
        offset += n
    return out


@dataclass
class GradStep:
    """One local step's gradients for :meth:`ClientAlgorithm.adjust`, to change in place.

    ``grads`` are per parameter, [*lead, *shape]: ``lead`` is () for one client (the
    sequential loop) and (G,) for a group of G clients (the batched trainer). ``params`` are
    the current values, shaped like ``grads`` except at the batched step 0, where they are
    the shared start (unstacked); ``start`` the round's start point (unstacked); ``consts``
    the clients' rows of :meth:`ClientAlgorithm.constants` ([*lead, ...]). Written with
    broadcasting, ``g.add_(p - p0, alpha=mu)`` is right in both cases."""

    grads: list[Tensor]
    params: list[Tensor]
    start: list[Tensor]
    payload: Payload
    consts: dict[str, Tensor]
    step: int
    lead: tuple[int, ...] = ()
    #: the group's rows in the batched chunk (None: one client, sequentially)
    rows: Tensor | None = None
    #: the number of clients :meth:`keep` stores rows for
    size: int = 1
    kept: dict[str, Tensor] = field(default_factory=dict)

    def flat(self, tensors: Sequence[Tensor]) -> Tensor:
        """Per-parameter tensors → one [*lead, d] tensor in the flat-vector order."""
        return torch.cat([t.reshape(*self.lead, -1) for t in tensors], dim=-1)

    def split(self, flat: Tensor) -> list[Tensor]:
        """A [*lead, d] tensor → per-parameter views shaped like :attr:`grads`."""
        return split_like(flat, self.grads)

    def keep(self, name: str, value: Tensor) -> None:
        """Record ``value`` ([*lead, ...]) for :meth:`ClientAlgorithm.finish_clients`,
        which reads client ``i``'s as ``trained.kept[name][i]``."""
        if self.rows is None:
            self.kept[name] = value.unsqueeze(0)
            return
        whole = self.kept.get(name)
        if whole is None:
            whole = self.kept[name] = value.new_zeros(self.size, *value.shape[1:])
        whole[self.rows] = value


@dataclass
class Trained:
    """Clients just trained, in row order, for :meth:`ClientAlgorithm.finish_clients`: one
    client in the sequential loop, a chunk in the batched trainer. ``model`` is the shared
    module (its parameters are not the clients' trained ones); ``draws(i)`` are client
    ``i``'s random numbers (the global RNG sequentially, its replayed stream batched)."""

    model: nn.Module
    payload: Payload
    data: Sequence[TensorData]
    states: Sequence[dict[str, Tensor]]
    steps: Sequence[int]
    spec: LocalSpec
    device: torch.device
    draws: Callable[[int], Draws]
    kept: dict[str, Tensor] = field(default_factory=dict)


__all__ = ["Batch", "ClientContext", "ClientRound", "GradStep", "Trained", "split_like"]
