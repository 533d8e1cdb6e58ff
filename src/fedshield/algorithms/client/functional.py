"""Functional per-step math of the vectorisable client algorithms (``run.vectorize``).

A client algorithm whose local update can run batched over a cohort carries the registry
tag ``vectorizable`` and returns a :class:`VectorForm` from ``vector_form()``. The engine's
batched trainer (:mod:`fedshield.sim.vectorized`) owns the loop of SPEC §1 — mini-batches
from each client's own (seed, round, client) generator, ``torch.func.grad`` of the loss
vmapped over the clients' stacked parameters, the SGD step with momentum and weight decay —
and asks the form for what differs between algorithms:

* :meth:`VectorForm.examples` / :meth:`VectorForm.loss` — one client's view, run inside
  ``vmap`` and ``functional_call`` (so ``model(x)`` uses that client's parameters);
  random numbers come from ``draws``, the replay of that client's global-RNG stream;
* :meth:`VectorForm.adjust` — the gradient change before the step (FedProx, SCAFFOLD) on
  gradients stacked over the clients of a group, outside ``vmap``;
* :meth:`VectorForm.finish` — what is uploaded besides Δθ, and client-state updates.

The sequential hooks of :class:`~fedshield.algorithms.client.base.ClientAlgorithm` stay the
reference: every form must give its algorithm's result to float tolerance (tests check it).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

import torch
from torch import Tensor, nn

from fedshield.core.context import ClientUpdate, Payload
from fedshield.data.bundle import TensorData

if TYPE_CHECKING:
    from fedshield.algorithms.client.base import ClientAlgorithm, LocalSpec


class Draws(Protocol):
    """One client's random numbers inside a batched call: the same values, in the same
    order, that the sequential path draws from the global RNG seeded per (seed, round,
    client). Shapes are one client's."""

    def uniform(self, shape: Sequence[int], dtype: torch.dtype, low: float, high: float) -> Tensor:
        """``torch.empty(shape).uniform_(low, high)``."""
        ...

    def normal(self, shape: Sequence[int], dtype: torch.dtype) -> Tensor:
        """``torch.randn(shape)``."""
        ...


class ClientStreams(Protocol):
    """The per-client random streams of a chunk, for draws made outside ``vmap``."""

    def uniform_for(
        self, row: int, shape: Sequence[int], dtype: torch.dtype, low: float, high: float
    ) -> Tensor: ...


@dataclass
class StepGrads:
    """One batched step of a group of clients, for :meth:`VectorForm.adjust`.

    ``grads`` are per-parameter tensors stacked over the group ([G, ...]); ``params`` the
    group's current values, stacked too except at step 0, where they are the shared start
    (unstacked: write the math so it broadcasts); ``start`` the broadcast start point per
    parameter (unstacked); ``consts`` the group's
    rows of :meth:`VectorForm.constants`; ``rows`` the group's positions in the chunk;
    ``store`` a per-chunk scratch dict (e.g. SCAFFOLD's first gradient, [C, d])."""

    grads: list[Tensor]
    params: list[Tensor]
    start: list[Tensor]
    payload: Payload
    consts: dict[str, Tensor]
    rows: Tensor
    step: int
    chunk_size: int
    store: dict[str, Tensor] = field(default_factory=dict)


@dataclass
class ChunkResult:
    """A trained chunk of clients, for :meth:`VectorForm.finish` (rows in chunk order)."""

    model: nn.Module
    payload: Payload
    data: Sequence[TensorData]
    states: Sequence[dict[str, Tensor]]
    steps: Sequence[int]
    spec: LocalSpec
    device: torch.device
    streams: ClientStreams
    store: dict[str, Tensor]


class VectorForm:
    """Plain local SGD: the algorithm's own :meth:`loss`, no gradient change, no extras."""

    #: The sequential hooks give parameters the loss never reaches a zero gradient (so the
    #: optimizer steps them: weight decay, SCAFFOLD's correction); otherwise
    #: ``torch.optim.SGD`` skips them (``grad is None``) and so does the batched step.
    fills_missing_grads: bool = False

    def __init__(self, algo: ClientAlgorithm) -> None:
        self.algo = algo

    def constants(
        self,
        model: nn.Module,
        payload: Payload,
        data: Sequence[TensorData],
        states: Sequence[dict[str, Tensor]],
        device: torch.device,
    ) -> dict[str, Tensor]:
        """Per-client constants of the round, stacked on a leading client axis ([C, ...]);
        inside ``vmap`` the forms see one client's row."""
        return {}

    def examples(
        self, model: nn.Module, x: Tensor, y: Tensor, consts: dict[str, Tensor], draws: Draws
    ) -> Tensor | None:
        """Inputs computed before the gradient (adversarial examples x'); None for none."""
        return None

    def loss(
        self,
        model: nn.Module,
        x: Tensor,
        y: Tensor,
        x_adv: Tensor | None,
        payload: Payload,
        consts: dict[str, Tensor],
    ) -> Tensor:
        """One client's mini-batch loss (the sequential :meth:`ClientAlgorithm.loss`)."""
        return self.algo.loss(model, x, y, payload)

    def adjust(self, step: StepGrads) -> None:
        """Change ``step.grads`` in place before the optimizer step (default: nothing)."""

    def finish(self, chunk: ChunkResult, updates: list[ClientUpdate]) -> None:
        """Add extras to the uploads and update client states (default: nothing)."""


class ProxForm(VectorForm):
    """FedProx / FedACG's client: ∇ += μ(θ − θ_start) per step (SPEC §4)."""

    def __init__(self, algo: ClientAlgorithm, mu: float) -> None:
        super().__init__(algo)
        self.mu = mu

    def adjust(self, step: StepGrads) -> None:
        for g, p, p0 in zip(step.grads, step.params, step.start):
            g.add_(p - p0, alpha=self.mu)


FIRST_GRAD = "scaffold/first_grad"
CORRECTION = "scaffold/correction"


def _flat_rows(tensors: list[Tensor]) -> Tensor:
    """Per-parameter [G, ...] tensors → one [G, d] matrix in the flat-vector order."""
    return torch.cat([t.reshape(t.shape[0], -1) for t in tensors], dim=1)


class ScaffoldForm(VectorForm):
    """SCAFFOLD's client: ∇ += h − h_m per step; h_m⁺ from the first gradient ("seed") or
    option II; uploads Δh_m (:mod:`fedshield.algorithms.client.scaffold`)."""

    fills_missing_grads = True  # the correction applies to unreached parameters too

    def __init__(self, algo: ClientAlgorithm, variant: str) -> None:
        super().__init__(algo)
        self.variant = variant

    def constants(
        self,
        model: nn.Module,
        payload: Payload,
        data: Sequence[TensorData],
        states: Sequence[dict[str, Tensor]],
        device: torch.device,
    ) -> dict[str, Tensor]:
        h = payload.extras["h"]
        zero = torch.zeros_like(h)
        return {CORRECTION: torch.stack([h - s.get("h", zero) for s in states])}

    def adjust(self, step: StepGrads) -> None:
        if step.step == 0 and self.variant == "seed":  # ∇F_m(θ^t; z^{t,0}): the seed's h_m⁺
            first = step.store.get(FIRST_GRAD)
            flat = _flat_rows(step.grads)
            if first is None:
                first = step.store[FIRST_GRAD] = flat.new_zeros(step.chunk_size, flat.shape[1])
            first[step.rows] = flat
        correction = step.consts[CORRECTION]
        offset = 0
        for g in step.grads:
            n = g[0].numel()
            g.add_(correction[:, offset : offset + n].view_as(g))
            offset += n

    def finish(self, chunk: ChunkResult, updates: list[ClientUpdate]) -> None:
        first = chunk.store.get(FIRST_GRAD)
        h = chunk.payload.extras["h"]
        lr = chunk.spec.lr
        for i, (u, state) in enumerate(zip(updates, chunk.states)):
            old = state.get("h", torch.zeros_like(u.delta))
            if first is not None:  # variant "seed"
                new = first[i].clone()
            else:
                new = old - h - u.delta / (chunk.steps[i] * lr)
            state["h"] = new
            u.extras["dh"] = new - old


__all__ = [
    "ChunkResult",
    "ClientStreams",
    "Draws",
    "ProxForm",
    "ScaffoldForm",
    "StepGrads",
    "VectorForm",
]
