"""The client-algorithm contract and the shared local-SGD loop (SPEC §1).

``local_update(model, payload, data, ctx, state) -> ClientUpdate``. Subclasses change the
loss (:meth:`loss`), the gradient before each step (:meth:`adjust_grads`: FedProx,
SCAFFOLD, FedACG) or what is uploaded (:meth:`finish`: prototypes, control variates).
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from fedshield.core.context import ClientUpdate, Payload
from fedshield.core.flat import get_buffers, get_params, set_buffers, set_params
from fedshield.core.integrity import FieldSpec
from fedshield.core.params import NoParams, Params
from fedshield.data.bundle import TensorData
from fedshield.errors import ConfigError
from fedshield.registry import Registry

if TYPE_CHECKING:
    from fedshield.algorithms.client.functional import VectorForm


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
class ClientContext:
    client_id: int
    round: int
    generator: torch.Generator
    device: torch.device
    amp: bool = False


def batch_indices(
    n: int, batch_size: int, steps: int, generator: torch.Generator
) -> Iterator[Tensor]:
    """``steps`` mini-batches drawn epoch by epoch from fresh permutations (last one partial).
    A client without samples is refused (its epochs are empty: the loop never ended)."""
    if n <= 0:
        raise ConfigError(f"a client with {n} samples cannot train: local training needs data")
    done = 0
    while done < steps:
        perm = torch.randperm(n, generator=generator)
        for start in range(0, n, batch_size):
            yield perm[start : start + batch_size]
            done += 1
            if done == steps:
                return


def autocast(ctx: ClientContext) -> contextlib.AbstractContextManager:
    if ctx.amp and ctx.device.type == "cuda":
        return torch.autocast("cuda", dtype=torch.bfloat16)
    return contextlib.nullcontext()


class ClientAlgorithm:
    """Plain local SGD; the base of every client algorithm."""

    params_schema: type[Params] = NoParams
    #: True when :meth:`adjust_grads` needs the start point as per-tensor copies.
    uses_start: bool = False
    #: Sample-level DP-SGD (:class:`fedshield.privacy.local.LocalDPSGD`), set from
    #: ``[privacy.local]`` by :func:`fedshield.privacy.attach_privacy`; None: plain SGD.
    dp_sgd: Any = None

    def __init__(self, spec: LocalSpec, params: Params | None = None) -> None:
        self.spec = spec
        self.params = params if params is not None else self.params_schema()

    # -- what this algorithm uploads (the server checks it: core.integrity) -----------
    def upload_spec(self, model: nn.Module) -> dict[str, FieldSpec]:
        """The extras this algorithm may upload, with their exact shapes (SPEC §12); an
        upload carrying any other extra is rejected."""
        return {}

    def check_model(self, model: nn.Module) -> None:
        """Raise :class:`ConfigError` when this algorithm cannot train ``model`` (its
        family, tiers, exit layout). Called before any data is loaded, on the model built on
        PyTorch's meta device (``build_components``), so the check reads structure only."""

    def known_extras(self, class_counts: Tensor) -> dict[str, Tensor]:
        """Extras whose true value the server knows from the partition (e.g. per-class
        sample counts, from the client's label counts ``class_counts``): where self-reported
        counts are not trusted they replace what the client uploads (SPEC §12)."""
        return {}

    def expected_mask(
        self, client_id: int, model: nn.Module, class_counts: Tensor | None = None
    ) -> Tensor | None:
        """The coverage mask client ``client_id`` must upload (None: full coverage), as the
        server predicts it from the client's tier and, where a method needs it, its label
        counts ``class_counts`` (known to the server, like the partition)."""
        return None

    # -- hooks ---------------------------------------------------------------------
    def init_state(self, num_params: int) -> dict[str, Tensor]:
        """Per-client state kept by the engine across rounds (checkpointed)."""
        return {}

    def loss(self, model: nn.Module, x: Tensor, y: Tensor, payload: Payload) -> Tensor:
        return F.cross_entropy(model(x), y)

    def adjust_grads(
        self,
        model: nn.Module,
        payload: Payload,
        state: dict[str, Tensor],
        start: list[Tensor],
        step: int,
    ) -> None:
        """Modify ``p.grad`` in place before the optimizer step (default: nothing)."""

    def vector_form(self) -> VectorForm | None:
        """Functional per-step math for vectorised cohorts (``run.vectorize``), used when the
        registry entry is tagged ``vectorizable``; None: train client by client."""
        return None

    def finish(
        self,
        model: nn.Module,
        update: ClientUpdate,
        payload: Payload,
        data: TensorData,
        ctx: ClientContext,
        state: dict[str, Tensor],
    ) -> ClientUpdate:
        """Post-training hook: add extras to the upload, update client state."""
        return update

    # -- the loop ------------------------------------------------------------------
    def local_update(
        self,
        model: nn.Module,
        payload: Payload,
        data: TensorData,
        ctx: ClientContext,
        state: dict[str, Tensor],
    ) -> ClientUpdate:
        set_params(model, payload.params)
        set_buffers(model, payload.buffers)
        model.train()
        spec = self.spec
        opt = torch.optim.SGD(
            model.parameters(), lr=spec.lr, momentum=spec.momentum, weight_decay=spec.weight_decay
        )
        start = [p.detach().clone() for p in model.parameters()] if self.uses_start else []
        total = torch.zeros((), device=ctx.device)
        steps = spec.num_steps(len(data))
        batches = batch_indices(len(data), spec.batch_size, steps, ctx.generator)
        # DP-SGD: the loss sees Opacus' per-sample-gradient wrapper of the same model.
        dp = None
        if self.dp_sgd is not None:
            dp = self.dp_sgd.session(
                model, opt, len(data), spec.batch_size, ctx.generator, ctx.device
            )
        net = model if dp is None else dp.model
        try:
            for step, idx in enumerate(batches):
                x, y = data.batch(idx, ctx.device)
                if dp is None:
                    opt.zero_grad(set_to_none=True)
                else:
                    dp.zero_grad()
                with autocast(ctx):
                    loss = self.loss(net, x, y, payload)
                loss.backward()
                if dp is not None:  # per-sample clip + noise → p.grad, before the terms
                    dp.privatize()  # that do not read the data (FedProx's μ(θ − θ_start))
                self.adjust_grads(model, payload, state, start, step)
                opt.step()
                total += loss.detach().float()
        finally:
            if dp is not None:
                dp.close()
        update = ClientUpdate(
            client_id=ctx.client_id,
            delta=get_params(model) - payload.params,
            num_examples=len(data),
            buffers=get_buffers(model),
            metrics={"train/loss": float(total) / max(steps, 1)},
        )
        return self.finish(model, update, payload, data, ctx, state)


CLIENT_ALGORITHMS: Registry[type[ClientAlgorithm]] = Registry("client algorithm")
