"""Depth-limited multi-exit local training (early-exit ViT paper, Sec. III-B, eqs. 2–3).

Client k trains the prefix of depth m_k (stem + blocks up to exit m_k + exits 1..m_k) with

    L_sup = Σ_{e≤m} (r_e / Σ_j r_j) ℓ_e,  r_e = e (e < m),  r_m = 2m
    L_KD  = (1/(m−1)) Σ_{e<m} T² KL(p_m^{(T)} ‖ p_e^{(T)})     (teacher p_m detached)
    L_k   = L_sup + γ L_KD,                                     γ = 0.1, T = 3

with AdamW + a cosine schedule, timm MixUp/CutMix (ℓ_e becomes soft-label CE) and
RandAugment, and uploads the pseudo-gradient with a coverage mask over the flat
parameters, so the server averages each parameter over the clients that trained it
(eq. 15, ``server.fedavg.coverage_mean``). The client reports the bytes of its active
prefix (``comm/bytes``, one direction), which the engine counts both ways (eq. 16).

The same loop serves the depth baselines defined here — DepthFL (mutual distillation,
bottleneck classifiers) and ReeFL (shared recurrent exit, per-client adaptive teacher) —
through the loss options (``exit_weights``, ``kd``, the KD schedule) and the hooks
:meth:`MultiExit.make_subnet`, :meth:`MultiExit.split_data` and :meth:`MultiExit.loss_of`;
the width baselines HeteroFL and ScaleFL live in ``width.py``.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal, TypeVar, cast

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
from fedshield.algorithms.client.pieces import ClientRound
from fedshield.core.context import ClientUpdate
from fedshield.core.flat import get_buffers, get_params, set_buffers, set_params
from fedshield.core.params import Params
from fedshield.data.bundle import TensorData
from fedshield.errors import ConfigError
from fedshield.models.eevit import EarlyExitViT, prefix_bytes

ExitWeights = Literal["linear", "proportional", "uniform", "sum", "last"]
KDMode = Literal["deepest", "deepest_weighted", "mutual", "best", "none"]

_MULTI_EXIT_TAGS = ["needs_model=multi_exit", "uploads=mask"]


class MultiExitParams(Params):
    depths: list[int] = Field(
        [], description="m_k tiers (exits) cycled over client ids (m_k = depths[k % len]); [] = all"
    )
    exit_weights: ExitWeights = Field(
        "linear",
        description="linear: r_e = e, r_m = 2m (paper); proportional: r_e = e (ScaleFL); "
        "uniform: 1/m; sum: 1 each, unnormalised (DepthFL, ReeFL); last: exit m only",
    )
    kd: KDMode = Field(
        "deepest",
        description="deepest: mean KL to the deepest exit (paper); deepest_weighted: each "
        "student's KL weighted by its exit weight (ScaleFL); mutual: every exit learns from "
        "every other (DepthFL); best: from the client's best exit (ReeFL); none",
    )
    kd_weight: float = Field(0.1, ge=0.0, description="gamma, the weight of the KD term")
    kd_temperature: float = Field(3.0, gt=0.0, description="T_KD, the distillation temperature")
    kd_detach_teacher: bool = Field(
        True, description="stop the KD gradient at the teacher (False: ScaleFL's code)"
    )
    kd_warmup_rounds: int | None = Field(
        0, ge=0, description="KD is off in rounds t <= this (None: the method's share of T_FL)"
    )
    kd_rampup_rounds: int | None = Field(
        0,
        ge=0,
        description="gamma_t = gamma·exp(−5(1 − min(t−1, R)/R)²) over R rounds, 0 = constant "
        "(None: the method's share of T_FL)",
    )
    grad_clip_value: float | None = Field(
        None, gt=0.0, description="clip every gradient entry to ±this before a step (ReeFL: 1)"
    )
    optimizer: Literal["adamw", "sgd"] = Field(
        "adamw", description="AdamW (paper) or SGD with client.momentum"
    )
    schedule: Literal["local_cosine", "round_cosine", "constant"] = Field(
        "local_cosine",
        description="local_cosine: lr → lr_min over each local run; round_cosine: the "
        "round's lr follows a cosine over schedule_rounds rounds",
    )
    schedule_rounds: int | None = Field(
        None,
        ge=1,
        description="T_FL, the round budget (round_cosine; the baselines' KD warm-up and ramp-up)",
    )
    lr_min: float = Field(0.0, ge=0.0, description="floor of the cosine schedule")
    mixup: float = Field(0.0, ge=0.0, description="MixUp alpha (0 = off)")
    cutmix: float = Field(0.0, ge=0.0, description="CutMix alpha (0 = off)")
    mix_prob: float = Field(1.0, ge=0.0, le=1.0, description="probability a batch is mixed")
    mix_switch_prob: float = Field(
        0.5, ge=0.0, le=1.0, description="probability CutMix replaces MixUp when both are on"
    )
    label_smoothing: float = Field(0.0, ge=0.0, lt=1.0, description="label smoothing epsilon")
    randaugment: str | None = Field(None, description="timm config, e.g. 'rand-m9-mstd0.5'")

    @model_validator(mode="after")
    def _round_budget(self) -> MultiExitParams:
        if self.schedule == "round_cosine" and self.schedule_rounds is None:
            raise ValueError("schedule = 'round_cosine' needs schedule_rounds (the round budget)")
        return self


# -- the loss (pure functions, tested on worked examples) ------------------------------


def exit_weights(m: int, scheme: ExitWeights = "linear") -> Tensor:
    """Exit weights w_e, e = 1..m (early-exit ViT paper, eq. 2: r_e / Σ_j r_j; ``sum``: w_e = 1)."""
    if m < 1:
        raise ValueError(f"depth m must be >= 1, got {m}")
    if scheme in ("linear", "proportional"):
        r = torch.arange(1, m + 1, dtype=torch.float64)
        if scheme == "linear":
            r[-1] = 2 * m  # the deepest active exit counts double
    elif scheme in ("uniform", "sum"):
        r = torch.ones(m, dtype=torch.float64)
        if scheme == "sum":  # DepthFL and ReeFL add the exits' losses
            return r
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


def kd_term(student: Tensor, teacher: Tensor, temperature: float, detach: bool = True) -> Tensor:
    """T² KL(p_teacher^{(T)} ‖ p_student^{(T)}), batch mean; the teacher is detached."""
    t = temperature
    log_q = F.log_softmax(student / t, dim=-1)
    log_p = F.log_softmax((teacher.detach() if detach else teacher) / t, dim=-1)
    return t * t * F.kl_div(log_q, log_p, reduction="batchmean", log_target=True)


def best_exit(logits: Sequence[Tensor], target: Tensor) -> int:
    """ReeFL's adaptive teacher: the exit (0-based) with the lowest CE on ``target``."""
    with torch.no_grad():
        losses = torch.stack([soft_cross_entropy(z.float(), target) for z in logits])
    return int(losses.argmin())


def multi_exit_loss(
    logits: list[Tensor],
    target: Tensor,
    *,
    weights: ExitWeights = "linear",
    kd: KDMode = "deepest",
    gamma: float = 0.1,
    temperature: float = 3.0,
    teacher: int | None = None,
    detach_teacher: bool = True,
) -> tuple[Tensor, dict[str, float]]:
    """L_k = Σ_e w_e ℓ_e + γ L_KD over the m active exits (early-exit ViT paper, eqs. 2–3);
    returns (loss, parts).

    L_KD by ``kd`` (KL = T² KL(p_teacher^{(T)} ‖ p_student^{(T)})):

    * ``deepest``: (1/(m−1)) Σ_{e<m} KL(p_m ‖ p_e) (early-exit ViT paper, eq. 3);
    * ``deepest_weighted``: Σ_{e<m} w_e KL(p_m ‖ p_e) (ScaleFL: KD inside each exit's term);
    * ``mutual``: Σ_i w_i (1/(m−1)) Σ_{j≠i} KL(p_j ‖ p_i) (DepthFL's mutual distillation);
    * ``best``: Σ_{j≠t} w_j KL(p_t ‖ p_j), t = ``teacher`` (ReeFL's per-client teacher).
    """
    m = len(logits)
    w = exit_weights(m, weights)
    per_exit = [soft_cross_entropy(z.float(), target) for z in logits]
    sup = sum((float(w[e]) * per_exit[e] for e in range(m) if w[e] > 0), logits[0].new_zeros(()))
    kd_loss = logits[0].new_zeros(())

    def kl(s: int, t: int) -> Tensor:
        return kd_term(logits[s], logits[t], temperature, detach_teacher)

    # cast: each sum below runs over m > 1 terms, so it is a tensor (never sum's start 0)
    if m > 1 and kd == "deepest":
        kd_loss = cast(Tensor, sum(kl(e, m - 1) for e in range(m - 1))) / (m - 1)
    elif m > 1 and kd == "deepest_weighted":
        kd_loss = cast(Tensor, sum(float(w[e]) * kl(e, m - 1) for e in range(m - 1)))
    elif m > 1 and kd == "mutual":
        kd_loss = cast(
            Tensor,
            sum(float(w[i]) * kl(i, j) / (m - 1) for i in range(m) for j in range(m) if i != j),
        )
    elif m > 1 and kd == "best":
        if teacher is None or not 0 <= teacher < m:
            raise ValueError(f"kd = 'best' needs a teacher exit in 0..{m - 1}, got {teacher}")
        kd_loss = cast(Tensor, sum(float(w[j]) * kl(j, teacher) for j in range(m) if j != teacher))
    loss = sup + gamma * kd_loss
    parts = {"train/loss_sup": float(sup.detach()), "train/loss_kd": float(kd_loss.detach())}
    return loss, parts


def kd_rampup(rnd: int, rounds: int) -> float:
    """exp(−5 (1 − min(t−1, R)/R)²): the sigmoid-shaped KD ramp-up of DepthFL's and
    ReeFL's official code (R = 300 of their 1,000 rounds); 1 when R = 0."""
    if rounds <= 0:
        return 1.0
    phase = 1.0 - min(max(rnd - 1, 0), rounds) / rounds
    return math.exp(-5.0 * phase * phase)


# -- the subnet a client trains ---------------------------------------------------------


@dataclass
class Subnet:
    """What a client trains this round and how its update maps onto the global vector.

    ``model`` is the global model itself (depth prefixes) or a narrower copy (width
    baselines); ``params`` its trainable (name, parameter) pairs; ``mask`` the coverage
    over the global flat vector (None = the whole model); ``gamma`` this round's KD
    weight; ``extra`` per-call state of a baseline (held-out data, present classes).
    """

    model: EarlyExitViT
    depth: int
    params: list[tuple[str, nn.Parameter]]
    mask: Tensor | None
    gamma: float = 0.0
    extra: dict[str, Any] = field(default_factory=dict)

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
    """Tier of a client: values[k mod len] (resource tiers cycled over the clients; early-exit
    ViT paper, Sec. IV)."""
    return values[client_id % len(values)] if values else default


@CLIENT_ALGORITHMS.register("multi_exit", tags=_MULTI_EXIT_TAGS)
class MultiExit(ClientAlgorithm):
    """Each client trains the prefix of its depth tier with linearly weighted exit losses
    and distillation from its deepest exit (early-exit ViT paper, eqs. 2–3).

    The base of the depth and width baselines: subclasses change the subnet, the data
    split and the loss through the hooks below.
    """

    params_schema = MultiExitParams
    params: MultiExitParams
    #: the method's KD warm-up / ramp-up as a share of T_FL when the param is None
    kd_warmup_share: ClassVar[float] = 0.0
    kd_rampup_share: ClassVar[float] = 0.0

    @property
    def p(self) -> MultiExitParams:
        return self.params

    def depth_for(self, client_id: int, num_exits: int) -> int:
        m = cycled(self.p.depths, client_id, num_exits)
        if not 1 <= m <= num_exits:
            raise ConfigError(f"client.params.depths: {m} is outside 1..{num_exits} exits")
        return m

    def check_model(self, model: nn.Module) -> None:
        net = as_multi_exit(model)
        for k in range(len(self.p.depths)):  # every tier the cycle can hand out
            self.depth_for(k, net.num_exits)
        self.check_layout(net)

    def check_layout(self, model: EarlyExitViT) -> None:
        """What the method needs of the model's exits (default: nothing); checked before
        data (:meth:`check_model`) and again by :meth:`make_subnet`."""

    # -- hooks --------------------------------------------------------------------------
    def make_subnet(self, model: EarlyExitViT, ctx: ClientContext) -> Subnet:
        self.check_layout(model)
        m = self.depth_for(ctx.client_id, model.num_exits)
        params = self._trained(model, model.prefix_parameters(m), m)
        # A full-depth client sends no mask, so all-full-depth runs keep the configured
        # (e.g. robust) aggregator instead of the coverage mean.
        if len(params) == len(list(model.parameters())):
            return Subnet(model, m, params, None)
        keep = {n for n, _ in params}
        parts = [torch.full((p.numel(),), n in keep) for n, p in model.named_parameters()]
        mask = torch.cat(parts).to(next(model.parameters()).device)
        return Subnet(model, m, params, mask)

    def _trained(
        self, model: EarlyExitViT, params: list[tuple[str, nn.Parameter]], m: int
    ) -> list[tuple[str, nn.Parameter]]:
        """Drop the heads of exits that enter no loss term (``exit_weights = "last"``
        without KD): they get no gradient, and AdamW's weight decay must not move them."""
        if self.p.exit_weights != "last" or self.p.kd != "none":
            return params
        return [(n, p) for n, p in params if model.exit_of(n) in (None, m)]

    def split_data(
        self, net: Subnet, data: TensorData, ctx: ClientContext
    ) -> tuple[TensorData, dict]:
        """(the data to train on, per-call state for :meth:`loss_of`)."""
        return data, {}

    def exit_logits(self, net: Subnet, x: Tensor) -> list[Tensor]:
        return net.model.forward_exits(x, net.depth)

    def loss_of(self, net: Subnet, x: Tensor, target: Tensor) -> tuple[Tensor, dict[str, float]]:
        return self.loss_from(net, self.exit_logits(net, x), target)

    def loss_from(
        self, net: Subnet, logits: list[Tensor], target: Tensor, teacher: int | None = None
    ) -> tuple[Tensor, dict[str, float]]:
        return multi_exit_loss(
            logits,
            target,
            weights=self.p.exit_weights,
            kd=self.p.kd,
            gamma=net.gamma,
            temperature=self.p.kd_temperature,
            teacher=teacher,
            detach_teacher=self.p.kd_detach_teacher,
        )

    def upload_mask(self, model: EarlyExitViT, net: Subnet, data: TensorData) -> Tensor | None:
        """The coverage this client uploads (``model`` is the global model); it must equal
        :meth:`expected_mask`, which the server predicts from the client's tier."""
        return net.mask

    def expected_mask(
        self, client_id: int, model: nn.Module, class_counts: Tensor | None = None
    ) -> Tensor | None:
        """The mask of this client's subnet, as the server predicts it from the client's
        tier (an upload with any other mask is rejected, docs/security.md §1)."""
        vit = as_multi_exit(model)
        dev = next(vit.parameters()).device
        return self.make_subnet(vit, ClientContext(client_id, 0, torch.Generator(), dev)).mask

    # -- schedules ------------------------------------------------------------------------
    def _budget_share(self, value: int | None, share: float) -> int:
        if value is not None:
            return value
        t = self.p.schedule_rounds
        return int(share * t) if t else 0

    def kd_weight_at(self, rnd: int) -> float:
        """γ_t: zero during the warm-up, then γ times the ramp-up factor."""
        if rnd <= self._budget_share(self.p.kd_warmup_rounds, self.kd_warmup_share):
            return 0.0
        ramp = self._budget_share(self.p.kd_rampup_rounds, self.kd_rampup_share)
        return self.p.kd_weight * kd_rampup(rnd, ramp)

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
        # Only the trained parameters are optimised: AdamW's decoupled weight decay would
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

    # -- the loop ---------------------------------------------------------------------------
    def local_update(self, model: nn.Module, rnd: ClientRound) -> ClientUpdate:
        payload, data, ctx = rnd.payload, rnd.data, rnd.ctx
        vit = as_multi_exit(model)
        set_params(vit, payload.params)
        set_buffers(vit, payload.buffers)
        net = self.make_subnet(vit, ctx)
        net.gamma = self.kd_weight_at(ctx.round)
        net.model.train()
        num_classes = vit.num_classes
        p, spec = self.p, self.spec
        opt = self.optimizer(net)
        mix = make_mixup(
            p.mixup, p.cutmix, p.mix_prob, p.mix_switch_prob, p.label_smoothing, num_classes
        )
        rand_aug = make_randaugment(p.randaugment)
        total = torch.zeros((), device=ctx.device)
        parts_sum: dict[str, float] = {}
        with seeded_global_rng(ctx.generator):
            train, net.extra = self.split_data(net, data, ctx)
            steps = spec.num_steps(len(train))
            batches = batch_indices(len(train), spec.batch_size, steps, ctx.generator)
            for step, idx in enumerate(batches):
                x, y = train.batch(idx, ctx.device)
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
                if p.grad_clip_value is not None:
                    torch.nn.utils.clip_grad_value_([q for _, q in net.params], p.grad_clip_value)
                opt.step()
                total += loss.detach().float()
                for k, v in parts.items():
                    parts_sum[k] = parts_sum.get(k, 0.0) + v
        n_steps = max(steps, 1)
        buffers = get_buffers(model)
        mask = self.upload_mask(vit, net, data)
        delta = net.delta(payload.params)
        if mask is not None:  # what a client does not cover carries no update
            delta = torch.where(mask, delta, torch.zeros_like(delta))
        metrics = {
            "train/loss": float(total) / n_steps,
            "train/kd_weight": net.gamma,
            "client/depth": float(net.depth),
            "comm/bytes": float(prefix_bytes(model, mask, buffers.numel())),
        }
        metrics.update({k: v / n_steps for k, v in parts_sum.items()})
        update = ClientUpdate(
            client_id=ctx.client_id,
            delta=delta,
            num_examples=len(data),
            buffers=buffers,
            mask=mask,
            metrics=metrics,
        )
        return self.finish(model, update, rnd)


# -- DepthFL ------------------------------------------------------------------------------


class DepthFLParams(MultiExitParams):
    exit_weights: ExitWeights = Field("sum", description="DepthFL adds the exits' CE losses")
    kd: KDMode = Field("mutual", description="DepthFL: mutual self-distillation among exits")
    kd_weight: float = Field(1.0, ge=0.0, description="consistency weight (DepthFL: 1)")
    kd_temperature: float = Field(1.0, gt=0.0, description="T_KD (DepthFL: 1)")
    kd_rampup_rounds: int | None = Field(
        None, ge=0, description="KD ramp-up rounds; None = 0.3·T_FL (DepthFL: 300 of 1,000)"
    )
    require_bottlenecks: bool = Field(
        True, description="refuse a model without DepthFL's bottleneck classifiers"
    )


@CLIENT_ALGORITHMS.register("depthfl", tags=_MULTI_EXIT_TAGS)
class DepthFL(MultiExit):
    """DepthFL (Kim et al., ICLR 2023) trains depth-prefix subnets, whose shallow
    classifiers carry bottleneck layers, with CE at every exit plus mutual
    self-distillation.

    Loss (official code, Flower baseline ``depthfl``): Σ_i ℓ_i + γ_t Σ_i (1/(m−1))
    Σ_{j≠i} KL(p_j ‖ p_i) with T = 1 and γ_t ramped up by exp(−5(1 − t/R)²) over
    R = 0.3·T_FL rounds. The bottlenecks are a model option
    (``model.params.exit_bottleneck = "depthfl"``: exit e of L has L − e bottleneck layers).
    Aggregation is the coverage mean over holders (DepthFL's FedAvg variant; its FedDyn
    variant is not in this library).
    """

    params_schema = DepthFLParams
    params: DepthFLParams
    kd_rampup_share = 0.3

    def check_layout(self, model: EarlyExitViT) -> None:
        if self.params.require_bottlenecks and model.bottlenecks is None:
            raise ConfigError(
                "client.algorithm = 'depthfl' needs its bottleneck classifiers: set "
                "model.params.exit_bottleneck = 'depthfl' (or client.params."
                "require_bottlenecks = false)"
            )


# -- ReeFL --------------------------------------------------------------------------------


class ReeFLParams(MultiExitParams):
    exit_weights: ExitWeights = Field("sum", description="ReeFL adds the exits' CE losses")
    kd: KDMode = Field("best", description="ReeFL: KD from the client's best exit")
    kd_weight: float = Field(1.0, ge=0.0, description="KD weight (ReeFL: 1, ramped up)")
    kd_temperature: float = Field(1.0, gt=0.0, description="T_KD (ReeFL: 1)")
    kd_rampup_rounds: int | None = Field(
        None, ge=0, description="KD ramp-up rounds; None = 0.3·T_FL (DepthFL's schedule)"
    )
    grad_clip_value: float | None = Field(1.0, gt=0.0, description="ReeFL clips values at 1")
    teacher_val_fraction: float = Field(
        0.2,
        ge=0.0,
        lt=1.0,
        description="share of the client's data held out to pick the teacher (ReeFL: 0.2); "
        "0 = pick it on another training batch",
    )


@CLIENT_ALGORITHMS.register("reefl", tags=_MULTI_EXIT_TAGS)
class ReeFL(MultiExit):
    """ReeFL (Lee et al., ICML 2024) trains depth-prefix subnets that share one recurrent
    transformer exit over the class tokens and distils every exit from the client's best.

    At every local step the client evaluates its active exits on a held-out batch of its
    own data (a fresh seeded ``teacher_val_fraction`` split each round, not trained on) and
    takes as teacher the exit with the lowest CE there, so the teacher adapts to the
    client and changes as training moves; every other exit distils from it:
    Σ_i ℓ_i + γ_t Σ_{j≠t} KL(p_t ‖ p_j), T = 1, γ_t ramped up as in DepthFL (official
    code, ``kl_loss = "dynamic"``). Needs ``model.params.exit_mode = "recurrent"``.
    """

    params_schema = ReeFLParams
    params: ReeFLParams
    kd_rampup_share = 0.3

    @property
    def rp(self) -> ReeFLParams:
        return self.params

    def check_layout(self, model: EarlyExitViT) -> None:
        if model.exit_mode != "recurrent":
            raise ConfigError(
                "client.algorithm = 'reefl' needs model.params.exit_mode = 'recurrent'"
            )

    def split_data(
        self, net: Subnet, data: TensorData, ctx: ClientContext
    ) -> tuple[TensorData, dict]:
        if self.p.kd != "best":
            return data, {}
        n, frac = len(data), self.rp.teacher_val_fraction
        if frac == 0 or n < 2:  # ReeFL's fallback: another batch of the training data
            return data, {"val": _batches(data, self.spec.batch_size, ctx.generator)}
        n_val = min(max(1, round(frac * n)), n - 1)
        perm = torch.randperm(n, generator=ctx.generator)
        held = data.subset(perm[:n_val])
        return data.subset(perm[n_val:]), {
            "val": _batches(held, self.spec.batch_size, ctx.generator)
        }

    def select_teacher(self, net: Subnet, x: Tensor, y: Tensor) -> int:
        """The client's best exit (0-based) on (x, y): lowest CE, no gradient."""
        with torch.no_grad():
            return best_exit(self.exit_logits(net, x), y)

    def loss_of(self, net: Subnet, x: Tensor, target: Tensor) -> tuple[Tensor, dict[str, float]]:
        teacher = None
        if self.p.kd == "best":
            xv, yv = next(net.extra["val"])
            teacher = self.select_teacher(net, xv.to(x.device), yv.to(x.device))
        loss, parts = self.loss_from(net, self.exit_logits(net, x), target, teacher)
        if teacher is not None:
            parts["train/teacher_exit"] = float(teacher + 1)
        return loss, parts


def _batches(data: TensorData, batch_size: int, gen: torch.Generator) -> Iterator:
    """Endless seeded mini-batches (x, y) of ``data`` (fresh permutation per pass)."""
    while True:
        for idx in batch_indices(len(data), batch_size, math.ceil(len(data) / batch_size), gen):
            yield data.batch(idx)


__all__ = [
    "DepthFL",
    "DepthFLParams",
    "MultiExit",
    "MultiExitParams",
    "ReeFL",
    "ReeFLParams",
    "Subnet",
    "best_exit",
    "exit_weights",
    "kd_rampup",
    "kd_term",
    "multi_exit_loss",
    "soft_cross_entropy",
]
