"""Depth-limited multi-exit local training (SPEC §8 "Local loss"; seed 002 §III-B).

Client k trains the prefix of depth m_k (stem + blocks 1..m_k + exits 1..m_k) with

    L_sup = Σ_{e≤m} (r_e / Σ_j r_j) ℓ_e,  r_e = e (e < m),  r_m = 2m
    L_KD  = (1/(m−1)) Σ_{e<m} T² KL(p_m^{(T)} ‖ p_e^{(T)})     (teacher p_m detached)
    L_k   = L_sup + γ L_KD,                                     γ = 0.1, T = 3

with AdamW + a cosine schedule, timm MixUp/CutMix (ℓ_e becomes soft-label CE) and
RandAugment, and uploads the pseudo-gradient with a coverage mask over the flat
parameters, so the server averages each parameter over the clients that trained it
(eq. 15, ``server.fedavg.coverage_mean``). The client reports the bytes of its active
prefix (``comm/bytes``, one direction), which the engine counts both ways (eq. 16).

The same loop serves the baselines through :meth:`MultiExit.make_subnet` (which network
is trained, and how its update maps back onto the global vector) and the loss options
(``exit_weights``, ``kd``): DepthFL, ReeFL here; HeteroFL and ScaleFL in ``width.py``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal, TypeVar

import torch
import torch.nn.functional as F
from pydantic import Field, model_validator
from torch import Tensor, nn

from fedshield.algorithms.client._augment import (
    make_mixup,
    make_randaugment,
    seeded_global_rng,
)
from fedshield.algorithms.client.base import (
    CLIENT_ALGORITHMS,
    ClientAlgorithm,
    ClientContext,
    autocast,
    batch_indices,
)
from fedshield.core.context import ClientUpdate, Payload
from fedshield.core.flat import get_buffers, get_params, set_buffers, set_params
from fedshield.core.params import Params
from fedshield.data.bundle import TensorData
from fedshield.errors import ConfigError
from fedshield.models.eevit import EarlyExitViT, prefix_bytes

ExitWeights = Literal["linear", "uniform", "last"]
KDMode = Literal["deepest", "mutual", "none"]


class MultiExitParams(Params):
    depths: list[int] = Field(
        [], description="m_k tiers cycled over client ids (m_k = depths[k % len]); [] = all L"
    )
    exit_weights: ExitWeights = Field(
        "linear", description="linear: r_e = e, r_m = 2m (paper); uniform: 1/m; last: exit m only"
    )
    kd: KDMode = Field("deepest", description="deepest-exit teacher (paper), mutual, none")
    kd_weight: float = Field(0.1, ge=0.0, description="gamma")
    kd_temperature: float = Field(3.0, gt=0.0, description="T_KD")
    optimizer: Literal["adamw", "sgd"] = "adamw"
    schedule: Literal["local_cosine", "round_cosine", "constant"] = Field(
        "local_cosine",
        description="local_cosine: lr → lr_min over each local run; round_cosine: the "
        "round's lr follows a cosine over schedule_rounds rounds",
    )
    schedule_rounds: int | None = Field(None, ge=1, description="T_FL for round_cosine")
    lr_min: float = Field(0.0, ge=0.0)
    mixup: float = Field(0.0, ge=0.0, description="MixUp alpha (0 = off)")
    cutmix: float = Field(0.0, ge=0.0, description="CutMix alpha (0 = off)")
    mix_prob: float = Field(1.0, ge=0.0, le=1.0)
    mix_switch_prob: float = Field(0.5, ge=0.0, le=1.0)
    label_smoothing: float = Field(0.0, ge=0.0, lt=1.0)
    randaugment: str | None = Field(None, description="timm config, e.g. 'rand-m9-mstd0.5'")

    @model_validator(mode="after")
    def _round_budget(self) -> MultiExitParams:
        if self.schedule == "round_cosine" and self.schedule_rounds is None:
            raise ValueError("schedule = 'round_cosine' needs schedule_rounds (the round budget)")
        return self


# -- the loss (pure functions, tested on worked examples) ------------------------------


def exit_weights(m: int, scheme: ExitWeights = "linear") -> Tensor:
    """Normalised exit weights r_e / Σ_j r_j for e = 1..m (SPEC §8 L_sup)."""
    if m < 1:
        raise ValueError(f"depth m must be >= 1, got {m}")
    if scheme == "linear":
        r = torch.arange(1, m + 1, dtype=torch.float64)
        r[-1] = 2 * m  # the deepest active exit counts double
    elif scheme == "uniform":
        r = torch.ones(m, dtype=torch.float64)
    elif scheme == "last":
        r = torch.zeros(m, dtype=torch.float64)
        r[-1] = 1
    else:
        raise ValueError(f"unknown exit weighting {scheme!r}")
    return r / r.sum()


def soft_cross_entropy(logits: Tensor, target: Tensor) -> Tensor:
    """ℓ_e: CE for class indices, soft-label CE (MixUp/CutMix targets) for [N, C]."""
    if target.dim() == 1:
        return F.cross_entropy(logits, target)
    return -(target * F.log_softmax(logits, dim=-1)).sum(-1).mean()


def kd_term(student: Tensor, teacher: Tensor, temperature: float) -> Tensor:
    """T² KL(p_teacher^{(T)} ‖ p_student^{(T)}), batch mean; the teacher is detached."""
    t = temperature
    log_q = F.log_softmax(student / t, dim=-1)
    log_p = F.log_softmax(teacher.detach() / t, dim=-1)
    return t * t * F.kl_div(log_q, log_p, reduction="batchmean", log_target=True)


def multi_exit_loss(
    logits: list[Tensor],
    target: Tensor,
    *,
    weights: ExitWeights = "linear",
    kd: KDMode = "deepest",
    gamma: float = 0.1,
    temperature: float = 3.0,
) -> tuple[Tensor, dict[str, float]]:
    """L_k = L_sup + γ L_KD over the m active exits (SPEC §8); returns (loss, parts).

    ``kd="mutual"`` is DepthFL's mutual distillation, averaged over students:
    (1/m) Σ_i (1/(m−1)) Σ_{j≠i} T² KL(p_j ‖ p_i), every teacher detached.
    """
    m = len(logits)
    w = exit_weights(m, weights)
    per_exit = [soft_cross_entropy(z.float(), target) for z in logits]
    sup = sum((float(w[e]) * per_exit[e] for e in range(m) if w[e] > 0), logits[0].new_zeros(()))
    kd_loss = logits[0].new_zeros(())
    if m > 1 and kd == "deepest":
        kd_loss = sum(kd_term(z, logits[-1], temperature) for z in logits[:-1]) / (m - 1)
    elif m > 1 and kd == "mutual":
        pairs = [
            kd_term(logits[i], logits[j], temperature) for i in range(m) for j in range(m) if i != j
        ]
        kd_loss = sum(pairs) / (m * (m - 1))
    loss = sup + gamma * kd_loss
    parts = {"train/loss_sup": float(sup.detach()), "train/loss_kd": float(kd_loss.detach())}
    return loss, parts


# -- the subnet a client trains ---------------------------------------------------------


@dataclass
class Subnet:
    """What a client trains this round and how its update maps onto the global vector.

    ``model`` is the global model itself (depth prefixes) or a narrower copy (width
    baselines); ``params`` its trainable (name, parameter) pairs; ``mask`` the coverage
    over the global flat vector (None = the whole model).
    """

    model: EarlyExitViT
    depth: int
    params: list[tuple[str, nn.Parameter]]
    mask: Tensor | None

    def delta(self, start: Tensor) -> Tensor:
        """Pseudo-gradient over the global vector (zero where not covered)."""
        return get_params(self.model) - start


def as_multi_exit(model: nn.Module) -> EarlyExitViT:
    if not isinstance(model, EarlyExitViT):
        raise ConfigError(
            "this client algorithm needs a multi-exit model (model.name = 'eevit' or "
            f"'eevit_small'), got {type(model).__name__}"
        )
    return model


T = TypeVar("T")


def cycled(values: Sequence[T], client_id: int, default: T) -> T:
    """Tier of a client: values[k mod len] (SPEC §8 "resource tiers cycled")."""
    return values[client_id % len(values)] if values else default


@CLIENT_ALGORITHMS.register("multi_exit", tags=["needs_model=multi_exit", "uploads=mask"])
class MultiExit(ClientAlgorithm):
    """Depth-limited multi-exit training with deepest-exit KD (SPEC §8, seed 002)."""

    params_schema = MultiExitParams

    @property
    def p(self) -> MultiExitParams:
        return self.params  # type: ignore[return-value]

    def depth_for(self, client_id: int, num_exits: int) -> int:
        m = cycled(self.p.depths, client_id, num_exits)
        if not 1 <= m <= num_exits:
            raise ConfigError(f"client.params.depths: {m} is outside 1..{num_exits} exits")
        return m

    def make_subnet(self, model: EarlyExitViT, ctx: ClientContext) -> Subnet:
        m = self.depth_for(ctx.client_id, model.num_exits)
        # A full-depth client sends no mask, so all-full-depth runs keep the configured
        # (e.g. robust) aggregator instead of the coverage mean.
        mask = None if m == model.num_exits else model.prefix_mask(m)
        return Subnet(model, m, model.prefix_parameters(m), mask)

    def exit_logits(self, net: Subnet, x: Tensor) -> list[Tensor]:
        return net.model.forward_exits(x, net.depth)

    def expected_mask(self, client_id: int, model: nn.Module) -> Tensor | None:
        """The mask of this client's subnet, as the server predicts it from the client's
        tier (an upload with any other mask is rejected, SPEC §12)."""
        vit = as_multi_exit(model)
        dev = next(vit.parameters()).device
        return self.make_subnet(vit, ClientContext(client_id, 0, torch.Generator(), dev)).mask

    def lr_at(self, rnd: int, step: int, steps: int) -> float:
        lr, lo = self.spec.lr, self.p.lr_min
        if self.p.schedule == "local_cosine":
            frac = step / max(steps, 1)
        elif self.p.schedule == "round_cosine":
            assert self.p.schedule_rounds is not None  # checked by MultiExitParams
            frac = min((rnd - 1) / self.p.schedule_rounds, 1.0)
        else:
            return lr
        return lo + 0.5 * (lr - lo) * (1 + math.cos(math.pi * frac))

    def optimizer(self, net: Subnet) -> torch.optim.Optimizer:
        # Only the active prefix is optimised: AdamW's decoupled weight decay would
        # otherwise shrink parameters this client never trains.
        skip = net.model.no_weight_decay()
        decay = [p for n, p in net.params if p.ndim > 1 and n not in skip]
        rest = [p for n, p in net.params if not (p.ndim > 1 and n not in skip)]
        groups = [
            {"params": decay, "weight_decay": self.spec.weight_decay},
            {"params": rest, "weight_decay": 0.0},
        ]
        if self.p.optimizer == "adamw":
            return torch.optim.AdamW(groups, lr=self.spec.lr)
        return torch.optim.SGD(groups, lr=self.spec.lr, momentum=self.spec.momentum)

    def local_update(
        self,
        model: nn.Module,
        payload: Payload,
        data: TensorData,
        ctx: ClientContext,
        state: dict[str, Tensor],
    ) -> ClientUpdate:
        vit = as_multi_exit(model)
        set_params(vit, payload.params)
        set_buffers(vit, payload.buffers)
        net = self.make_subnet(vit, ctx)
        net.model.train()
        num_classes = vit.num_classes
        p, spec = self.p, self.spec
        opt = self.optimizer(net)
        mix = make_mixup(
            p.mixup, p.cutmix, p.mix_prob, p.mix_switch_prob, p.label_smoothing, num_classes
        )
        rand_aug = make_randaugment(p.randaugment)
        steps = spec.num_steps(len(data))
        total = torch.zeros((), device=ctx.device)
        parts_sum: dict[str, float] = {}
        with seeded_global_rng(ctx.generator):
            batches = batch_indices(len(data), spec.batch_size, steps, ctx.generator)
            for step, idx in enumerate(batches):
                x, y = data.batch(idx, ctx.device)
                if rand_aug is not None:
                    x = rand_aug(x)
                target: Tensor = y
                if mix is not None:
                    x, target = mix(x, y)
                elif p.label_smoothing > 0:
                    target = F.one_hot(y, num_classes).float() * (1 - p.label_smoothing) + (
                        p.label_smoothing / num_classes
                    )
                for group in opt.param_groups:
                    group["lr"] = self.lr_at(ctx.round, step, steps)
                opt.zero_grad(set_to_none=True)
                with autocast(ctx):
                    loss, parts = self.loss_of(net, x, target)
                loss.backward()
                opt.step()
                total += loss.detach().float()
                for k, v in parts.items():
                    parts_sum[k] = parts_sum.get(k, 0.0) + v
        n_steps = max(steps, 1)
        buffers = get_buffers(model)
        metrics = {
            "train/loss": float(total) / n_steps,
            "client/depth": float(net.depth),
            "comm/bytes": float(prefix_bytes(model, net.mask, buffers.numel())),
        }
        metrics.update({k: v / n_steps for k, v in parts_sum.items()})
        update = ClientUpdate(
            client_id=ctx.client_id,
            delta=net.delta(payload.params),
            num_examples=len(data),
            buffers=buffers,
            mask=net.mask,
            metrics=metrics,
        )
        return self.finish(model, update, payload, data, ctx, state)

    def loss_of(self, net: Subnet, x: Tensor, target: Tensor) -> tuple[Tensor, dict[str, float]]:
        return multi_exit_loss(
            self.exit_logits(net, x),
            target,
            weights=self.p.exit_weights,
            kd=self.p.kd,
            gamma=self.p.kd_weight,
            temperature=self.p.kd_temperature,
        )


class DepthFLParams(MultiExitParams):
    exit_weights: ExitWeights = "uniform"
    kd: KDMode = "mutual"
    kd_weight: float = Field(1.0, ge=0.0)
    kd_temperature: float = Field(1.0, gt=0.0)


@CLIENT_ALGORITHMS.register("depthfl", tags=["needs_model=multi_exit", "uploads=mask"])
class DepthFL(MultiExit):
    """DepthFL (Kim et al., ICLR 2023; SPEC §8 baselines): depth-prefix subnets, CE at
    every active exit plus mutual self-distillation among them (defaults: uniform exit
    weights, γ = 1, T = 1). Aggregation is the same per-layer coverage mean."""

    params_schema = DepthFLParams


class ReeFLParams(MultiExitParams):
    exit_weights: ExitWeights = "uniform"


@CLIENT_ALGORITHMS.register("reefl", tags=["needs_model=multi_exit", "uploads=mask"])
class ReeFL(MultiExit):
    """ReeFL (Lee et al., 2024; SPEC §8 baselines): depth-prefix subnets with one shared
    recurrent exit (``model.params.exit_mode = "recurrent"``); CE at every active exit
    plus KD from the deepest one (our simplification of its self-distillation)."""

    params_schema = ReeFLParams

    def make_subnet(self, model: EarlyExitViT, ctx: ClientContext) -> Subnet:
        if model.exit_mode != "recurrent":
            raise ConfigError(
                "client.algorithm = 'reefl' needs model.params.exit_mode = 'recurrent'"
            )
        return super().make_subnet(model, ctx)


__all__ = [
    "DepthFL",
    "MultiExit",
    "MultiExitParams",
    "ReeFL",
    "Subnet",
    "exit_weights",
    "kd_term",
    "multi_exit_loss",
    "soft_cross_entropy",
]
