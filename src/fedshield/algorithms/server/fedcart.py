"""FedCART's server (SPEC §7; seed 003 §3–4): aggregate, then the CART step.

``update``: the model through the configured aggregator (FedAvg or any Byzantine rule —
composition is a feature), and the clients' gradient prototypes by the count-weighted mean

    ḡ_c = Σ_k n_{k,c} g_{k,c} / Σ_k n_{k,c}     (clients holding class c).

``post_step`` (the CART step, on the aggregated flat vector):

1. virtual features Z_v (V per class, server state, warm-started across rounds, initialised
   N(0, 1)) follow T_V SGD steps of gradient matching (eq. 9):
   min Σ_c ‖∇_{h'} CE(h'(Z_{v,c}), c) − ḡ_c‖²  (MSE; ``distance = "cos"``: CReFF's cosine);
2. h' is re-trained on (Z_v, labels) for T_R SGD steps (eq. 10), warm start from h'.

Defaults (V = 100, T_V = 100 at lr 0.1, T_R = 300 at lr 0.01, batch 32) are CReFF's.
Ablations: ``cart = false`` (no CART step; h' := h every round, so inference uses r + h)
and ``aux_head = false`` (no h': the CART step re-trains h itself, then h' := h).

The heads are located in the flat vector by the dual-head layout (``models/dual_head.py``):
the last 2P entries are [h, h'], P = C·D + C, with (C, D) uploaded by the clients.
Our choices: a class absent from a round keeps its last prototype (only matters under
partial participation); classes never seen are left out of matching and re-training.
Prototypes bypass the Byzantine aggregator (it defends the model update only).
"""

from __future__ import annotations

import logging

import torch
import torch.nn.functional as F
from pydantic import Field
from torch import Tensor

from fedshield.algorithms.client.base import batch_indices
from fedshield.algorithms.client.fedcart import COUNTS, HEAD_SHAPE, PROTO_HEAD, PROTOTYPES
from fedshield.algorithms.server.base import (
    SERVER_ALGORITHMS,
    ServerServices,
    ServerStep,
    State,
)
from fedshield.algorithms.server.fedavg import FedAvg
from fedshield.core.context import ClientUpdate, Payload, RoundContext, make_generator
from fedshield.core.params import Params
from fedshield.errors import ConfigError
from fedshield.losses.gradient_matching import Distance, synthesize_features

log = logging.getLogger("fedshield")

_ZV_INIT, _RETRAIN = 0xCA57, 0xCA58  # purposes mixed into derived seeds


class FedCARTServerParams(Params):
    cart: bool = Field(True, description="CART step (false: ablation 'no CART')")
    aux_head: bool = Field(True, description="re-train h' (false: ablation 'no h'', re-train h)")
    num_virtual: int = Field(100, ge=1, description="V virtual features per class")
    match_iters: int = Field(100, ge=0, description="T_V gradient-matching steps")
    match_lr: float = Field(0.1, gt=0.0, description="SGD step on the virtual features")
    match_momentum: float = Field(0.0, ge=0.0, lt=1.0)
    distance: Distance = Field("mse", description="mse (SPEC) or cos (CReFF)")
    warm_start_features: bool = Field(True, description="keep Z_v across rounds")
    feature_init_std: float = Field(1.0, gt=0.0, description="Z_v ~ N(0, std²) at start")
    retrain_steps: int = Field(300, ge=0, description="T_R re-training steps")
    retrain_lr: float = Field(0.01, gt=0.0)
    retrain_batch: int = Field(32, ge=1)
    retrain_warm_start: bool = Field(True, description="start from the current head")


def aggregate_prototypes(updates: list[ClientUpdate]) -> tuple[Tensor, Tensor] | None:
    """(ḡ [C, P], Σ_k n_{k,c} [C]) over the updates that carry prototypes, or None."""
    rows = [u for u in updates if PROTOTYPES in u.extras]
    if not rows:
        return None
    counts = torch.stack([u.extras[COUNTS] for u in rows])  # [K, C]
    protos = torch.stack([u.extras[PROTOTYPES] for u in rows])  # [K, C, P]
    total = counts.sum(0)
    mean = (counts[:, :, None] * protos).sum(0) / total.clamp_min(1.0)[:, None]
    return mean, total


def retrain_linear(
    weight: Tensor,
    bias: Tensor,
    z: Tensor,
    y: Tensor,
    *,
    steps: int,
    lr: float,
    batch_size: int,
    generator: torch.Generator,
) -> tuple[Tensor, Tensor, float]:
    """T_R mini-batch SGD steps of CE on (z, y) from (weight, bias); returns the new head
    and the mean loss of the last pass over the data (eq. 10)."""
    w = weight.detach().clone().requires_grad_(True)
    b = bias.detach().clone().requires_grad_(True)
    opt = torch.optim.SGD([w, b], lr=lr)
    window = max(1, -(-len(y) // batch_size))  # batches in one pass over Z_v
    losses: list[float] = []
    for idx in batch_indices(len(y), batch_size, steps, generator):
        idx = idx.to(z.device)
        loss = F.cross_entropy(z[idx] @ w.T + b, y[idx])
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        losses = (losses + [loss.item()])[-window:]
    mean = sum(losses) / len(losses) if losses else float("nan")
    return w.detach(), b.detach(), mean


@SERVER_ALGORITHMS.register("fedcart", tags=["needs_client=fedcart"])
class FedCARTServer(FedAvg):
    """Aggregate with the configured rule, then synthesize Z_v and re-train h' (SPEC §7)."""

    params_schema = FedCARTServerParams

    @property
    def p(self) -> FedCARTServerParams:
        return self.params  # type: ignore[return-value]

    def broadcast(
        self, params: Tensor, buffers: Tensor, state: State, ctx: RoundContext
    ) -> Payload:
        extras: dict[str, Tensor] = {}
        if self.p.cart:  # ask for prototypes of the head the CART step re-trains
            extras[PROTO_HEAD] = params.new_tensor(0.0 if self.p.aux_head else 1.0)
        return Payload(params, buffers, extras)

    def update(
        self,
        params: Tensor,
        buffers: Tensor,
        state: State,
        updates: list[ClientUpdate],
        ctx: RoundContext,
        services: ServerServices,
    ) -> ServerStep:
        step = super().update(params, buffers, state, updates, ctx, services)
        new = dict(state)
        shapes = [u.extras[HEAD_SHAPE] for u in updates if HEAD_SHAPE in u.extras]
        if shapes:
            new["head_shape"] = shapes[0]
        elif "head_shape" not in new:
            raise ConfigError(
                "server.algorithm='fedcart' needs client.algorithm='fedcart' and "
                "model.name='dual_head' (no update carried the FedCART extras)"
            )
        agg = aggregate_prototypes(updates) if self.p.cart else None
        if agg is not None:
            mean, total = agg
            seen = total > 0
            proto = new.get("proto", torch.zeros_like(mean))
            # Absent classes keep their last prototype (our choice, see module docstring).
            new["proto"] = torch.where(seen[:, None], mean, proto)
            new["proto_seen"] = new.get("proto_seen", torch.zeros_like(total)) + seen.to(total)
            step.metrics["cart/classes_this_round"] = float(seen.sum())
        elif self.p.cart and "proto" not in new:
            raise ConfigError(
                "server.algorithm='fedcart': no client uploaded gradient prototypes "
                "(client.algorithm must be 'fedcart')"
            )
        return ServerStep(step.params, step.buffers, new, step.metrics)

    def post_step(
        self, step: ServerStep, ctx: RoundContext, services: ServerServices
    ) -> ServerStep:
        c, d = (int(v) for v in step.state["head_shape"].tolist())
        p_len = c * d + c
        n = step.params.numel()
        if n < 2 * p_len:
            raise ConfigError("server.algorithm='fedcart': parameter vector smaller than 2 heads")
        main, aux = slice(n - 2 * p_len, n - p_len), slice(n - p_len, n)
        params = step.params.clone()
        metrics = dict(step.metrics)
        if not self.p.cart:  # ablation "no CART": inference r + h' = r + h
            params[aux] = params[main]
            return ServerStep(params, step.buffers, step.state, metrics)

        target = aux if self.p.aux_head else main
        head = params[target]
        weight, bias = head[: c * d].view(c, d), head[c * d :]
        state = dict(step.state)
        zv = self._virtual_features(state, c, d, params, ctx)
        classes = torch.nonzero(state["proto_seen"] > 0).flatten()
        zs, start, end = synthesize_features(
            zv[classes], weight, bias, classes, state["proto"][classes],
            iters=self.p.match_iters, lr=self.p.match_lr,
            momentum=self.p.match_momentum, distance=self.p.distance,
        )  # fmt: skip
        zv = zv.clone()
        zv[classes] = zs
        state["zv"] = zv

        v = zv.shape[1]
        labels = classes.repeat_interleave(v)
        gen = make_generator(ctx.seed, ctx.round, _RETRAIN)
        if not self.p.retrain_warm_start:  # CReFF: a fresh linear layer every round
            # nn.Linear's default init, U(±1/√D), drawn from the seeded generator.
            bound = d**-0.5
            fresh = torch.empty(c * d + c).uniform_(-bound, bound, generator=gen)
            fresh = fresh.to(params)
            weight, bias = fresh[: c * d].view(c, d), fresh[c * d :]
        w, b, loss = retrain_linear(
            weight, bias, zs.reshape(-1, d), labels,
            steps=self.p.retrain_steps, lr=self.p.retrain_lr,
            batch_size=self.p.retrain_batch, generator=gen,
        )  # fmt: skip
        params[target] = torch.cat([w.flatten(), b])
        if not self.p.aux_head:  # ablation "no h'": the inference head follows h
            params[aux] = params[main]
        metrics.update(
            {
                "cart/match_start": start,
                "cart/match_end": end,
                "cart/retrain_loss": loss,
                "cart/classes": float(len(classes)),
            }
        )
        return ServerStep(params, step.buffers, state, metrics)

    def _virtual_features(
        self, state: State, c: int, d: int, like: Tensor, ctx: RoundContext
    ) -> Tensor:
        """Z_v [C, V, D]: kept from the last round (warm start) or drawn N(0, std²)."""
        shape = (c, self.p.num_virtual, d)
        zv = state.get("zv")
        if zv is not None and self.p.warm_start_features and tuple(zv.shape) == shape:
            return zv
        # Seeded by (seed, round) when re-drawn every round, by the seed alone otherwise.
        warm = self.p.warm_start_features
        gen = (
            make_generator(ctx.seed, _ZV_INIT)
            if warm
            else make_generator(ctx.seed, ctx.round, _ZV_INIT)
        )
        z = torch.randn(shape, generator=gen) * self.p.feature_init_std
        return z.to(device=like.device, dtype=like.dtype)


__all__ = ["FedCARTServer", "FedCARTServerParams", "aggregate_prototypes", "retrain_linear"]
