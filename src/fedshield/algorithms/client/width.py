"""Width-scaled baselines on the multi-exit ViT family (the early-exit ViT paper's baselines,
Sec. IV).

* ``heterofl`` (Diao et al., ICLR 2021): client k trains the width-nested submodel of
  rate r_k at full depth, CE on the last exit, with HeteroFL's scaler, its masked
  cross-entropy, and its classifier aggregation over the clients holding each class;
* ``scalefl`` (Ilhan et al., CVPR 2023): width *and* depth tiers on ScaleFL's exit
  placement, exits weighted by depth, KD from the subnet's last exit.

Width nesting (both official codes' transformers): every attention head is kept and
narrowed to its first ⌈r·d_head⌉ channels of q, k and v, the token width to its first
⌈r·D⌉ channels and the MLP to its first ⌈r·hidden⌉ units (``width_slicing =
"head_dim"``); ``"heads"`` keeps the first ⌈r·H⌉ whole heads instead (our option: each
kept head is then identical to a global head, including its 1/√d_head scale).

The server needs nothing special: the client uploads its update scattered into the global
vector with a coverage mask of the entries it holds, and ``coverage_mean`` (eq. 15)
averages every entry over its holders — HeteroFL's element-wise aggregation.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import ClassVar, Literal

import torch
from pydantic import Field
from torch import Tensor, nn

from fedshield.algorithms.client.base import CLIENT_ALGORITHMS, ClientContext
from fedshield.algorithms.client.multi_exit import (
    ExitWeights,
    KDMode,
    MultiExit,
    MultiExitParams,
    Subnet,
    as_multi_exit,
    cycled,
)
from fedshield.algorithms.client.pieces import ClientRound
from fedshield.core.context import ClientUpdate
from fedshield.core.flat import get_params, param_slices, set_params
from fedshield.data.bundle import TensorData
from fedshield.errors import ConfigError
from fedshield.models.eevit import EarlyExitViT, scalefl_exit_blocks

WidthSlicing = Literal["head_dim", "heads"]
NormStats = Literal["kept", "full"]
Rounding = Callable[[float], int]

_WIDTH_TAGS = ["needs_model=multi_exit", "uploads=mask"]


# -- the narrow model ---------------------------------------------------------------------


class FullWidthLayerNorm(nn.LayerNorm):
    """LayerNorm of the kept d′ channels with the statistics of the full width D, the
    dropped D − d′ channels counting as zeros: μ = Σx/D, σ² = Σx²/D − μ² (our option
    ``norm = "full"``; the submodel then normalises like the global model whose extra
    channels are switched off)."""

    def __init__(self, dim: int, full_dim: int, eps: float = 1e-6) -> None:
        super().__init__(dim, eps=eps)
        self.full_dim = full_dim

    def forward(self, x: Tensor) -> Tensor:
        mean = x.sum(-1, keepdim=True) / self.full_dim
        var = (x * x).sum(-1, keepdim=True) / self.full_dim - mean * mean
        return (x - mean) * torch.rsqrt(var.clamp_min(0) + self.eps) * self.weight + self.bias


def narrow_arch(
    model: EarlyExitViT, rate: float, slicing: WidthSlicing, rounding: Rounding = math.ceil
) -> dict:
    """The architecture of ``model``'s width-``rate`` submodel."""
    if not 0 < rate <= 1:
        raise ConfigError(f"client.params.widths: {rate} is outside (0, 1]")
    arch = dict(model.arch)
    heads, dim, head_dim = model.num_heads, model.num_features, model.head_dim
    hidden = max(1, rounding(rate * model.mlp_hidden))
    if slicing == "heads":
        h = max(1, math.ceil(rate * heads))
        arch.update(embed_dim=h * head_dim, num_heads=h, attn_head_dim=None, mlp_hidden=hidden)
    else:
        dh = max(1, rounding(rate * head_dim))
        # ScaleFL's transformer (floor rounding) keeps D′ = H·d′_head; HeteroFL's, ⌈r·D⌉.
        d = heads * dh if rounding is math.floor else max(1, rounding(rate * dim))
        arch.update(embed_dim=d, num_heads=heads, attn_head_dim=dh, mlp_hidden=hidden)
    return arch


def narrow_model(
    model: EarlyExitViT,
    rate: float,
    slicing: WidthSlicing = "head_dim",
    rounding: Rounding = math.ceil,
    norm: NormStats = "kept",
) -> EarlyExitViT:
    """The same architecture at width ``rate`` (see the module docstring)."""
    if model.exit_mode != "stage":
        raise ConfigError("width-scaled submodels need model.params.exit_mode = 'stage'")
    arch = narrow_arch(model, rate, slicing, rounding)
    sub = EarlyExitViT(input_shape=model.input_shape, num_classes=model.num_classes, **arch)
    if norm == "full":
        _full_width_norms(sub, model.num_features)
    return sub.to(next(model.parameters()).device)


def _full_width_norms(sub: nn.Module, full_dim: int) -> None:
    for name, mod in list(sub.named_modules()):
        if isinstance(mod, nn.LayerNorm) and not isinstance(mod, FullWidthLayerNorm):
            parent = sub.get_submodule(name.rpartition(".")[0]) if "." in name else sub
            new = FullWidthLayerNorm(mod.normalized_shape[0], full_dim, mod.eps)
            setattr(parent, name.rpartition(".")[2], new)


#: Linear layers whose outputs HeteroFL's scaler divides by the rate (plus the embedding).
_SCALED = ("attn.qkv", "attn.proj", "mlp.fc1", "mlp.fc2")


def attach_scaler(model: EarlyExitViT, rate: float) -> None:
    """HeteroFL's scaler: in training mode the token embedding (patch projection + class
    token + positions) and the outputs of every q/k/v, attention-output and MLP linear
    layer are divided by the rate r; in eval mode it is the identity (official code,
    ``Scaler``). The exit classifiers are not scaled, as HeteroFL's output layer."""

    def hook(mod: nn.Module, args: tuple, out: Tensor) -> Tensor:
        return out / rate if mod.training else out

    model.vit.norm_pre.register_forward_hook(hook)  # right after the token embedding
    for name, mod in model.vit.blocks.named_modules():
        if name.endswith(_SCALED):
            mod.register_forward_hook(hook)


def _slice_index(name: str, full: Tensor, sub_shape: torch.Size, heads: tuple[int, int]) -> Tensor:
    """Flat positions (within ``full``) of the entries the narrow parameter holds."""
    pos = torch.arange(full.numel()).view(full.shape)
    h_full, h_sub = heads
    if name.endswith(("attn.qkv.weight", "attn.qkv.bias")):
        # qkv rows are [q | k | v], each [H, d_head]: keep the first heads / channels of each.
        d_full, d_sub = full.shape[0] // (3 * h_full), sub_shape[0] // (3 * h_sub)
        pos = pos.view(3, h_full, d_full, *full.shape[1:])
        pos = pos[
            (slice(None), slice(0, h_sub), slice(0, d_sub), *(slice(0, s) for s in sub_shape[1:]))
        ]
    elif name.endswith("attn.proj.weight"):
        d_full, d_sub = full.shape[1] // h_full, sub_shape[1] // h_sub
        pos = pos.view(full.shape[0], h_full, d_full)[: sub_shape[0], :h_sub, :d_sub]
    else:
        pos = pos[tuple(slice(0, s) for s in sub_shape)]
    return pos.reshape(-1)


def width_index(model: EarlyExitViT, sub: EarlyExitViT) -> Tensor:
    """For every entry of ``sub``'s flat vector, its position in ``model``'s flat vector."""
    slices = param_slices(model)
    full = dict(model.named_parameters())
    heads = (model.num_heads, sub.num_heads)
    parts = []
    for name, p in sub.named_parameters():
        parts.append(_slice_index(name, full[name], p.shape, heads) + slices[name].start)
    return torch.cat(parts).to(next(model.parameters()).device)


@dataclass
class WidthSubnet(Subnet):
    """A narrower copy; its update is scattered back onto the global vector."""

    index: Tensor = field(default_factory=lambda: torch.zeros(0, dtype=torch.long))
    start_sub: Tensor = field(default_factory=lambda: torch.zeros(0))

    def delta(self, start: Tensor) -> Tensor:
        out = torch.zeros_like(start)
        out[self.index] = get_params(self.model) - self.start_sub
        return out


# -- the clients --------------------------------------------------------------------------


class WidthParams(MultiExitParams):
    widths: list[float] = Field([], description="width tiers r_k cycled over client ids; [] = 1")
    width_slicing: WidthSlicing = Field(
        "head_dim",
        description="head_dim: every head narrowed (HeteroFL's and ScaleFL's code); "
        "heads: the first ⌈r·H⌉ whole heads",
    )
    scaler: bool = Field(True, description="divide narrow outputs by r in training (Scaler)")
    norm: NormStats = Field(
        "kept",
        description="kept: LayerNorm statistics over the kept channels (HeteroFL's "
        "transformer); full: over the full width, dropped channels as zeros",
    )


class WidthScaled(MultiExit):
    """Depth prefix of a width-nested submodel (tiers: ``depths``, ``widths``)."""

    params_schema = WidthParams
    params: WidthParams
    name: ClassVar[str] = "width"
    rounding: ClassVar[staticmethod[[float], int]] = staticmethod(math.ceil)

    @property
    def wp(self) -> WidthParams:
        return self.params

    def check_layout(self, model: EarlyExitViT) -> None:
        if model.exit_mode != "stage":
            raise ConfigError(f"client.algorithm = '{self.name}' needs exit_mode = 'stage'")
        for rate in self.wp.widths:
            if not 0 < rate <= 1:
                raise ConfigError(f"client.params.widths: {rate} is outside (0, 1]")

    def make_subnet(self, model: EarlyExitViT, ctx: ClientContext) -> Subnet:
        self.check_layout(model)
        rate = float(cycled(self.wp.widths, ctx.client_id, 1.0))
        m = self.depth_for(ctx.client_id, model.num_exits)
        if rate == 1.0:
            return super().make_subnet(model, ctx)
        cache = self.__dict__.setdefault("_cache", {})
        if rate not in cache:  # the narrow architecture and its index map never change
            sub = narrow_model(model, rate, self.wp.width_slicing, self.rounding, self.wp.norm)
            if self.wp.scaler:
                attach_scaler(sub, rate)
            cache[rate] = (sub, width_index(model, sub))
        sub, index = cache[rate]
        full = get_params(model)
        set_params(sub, full[index])
        params = self._trained(sub, sub.prefix_parameters(m), m)
        keep = {n for n, _ in params}
        sub_mask = torch.cat(
            [torch.full((p.numel(),), n in keep) for n, p in sub.named_parameters()]
        )
        mask = torch.zeros_like(full, dtype=torch.bool)
        mask[index[sub_mask.to(index.device)]] = True
        return WidthSubnet(sub, m, params, mask, index=index, start_sub=full[index].clone())


class HeteroFLParams(WidthParams):
    widths: list[float] = Field(
        [1.0, 0.5, 0.25, 0.125, 0.0625],
        description="width tiers cycled over client ids (HeteroFL's levels a–e)",
    )
    exit_weights: ExitWeights = Field("last", description="HeteroFL trains the last exit only")
    kd: KDMode = Field("none", description="HeteroFL has no distillation")
    masked_ce: bool = Field(
        True, description="logits of classes absent from the client's data are 0 in the loss"
    )
    class_rows: Literal["all", "holders"] = Field(
        "holders",
        description="classifier rows of classes a client lacks: all: uploaded with a zero "
        "update; holders: left out of its coverage (HeteroFL's combine; the server must "
        "know each client's label set)",
    )


def class_mask_logits(logits: Tensor, present: Tensor) -> Tensor:
    """HeteroFL's masking trick: the logits of classes absent from the client's data are
    replaced by 0 (official code: ``masked_fill(label_mask == 0, 0)``), so the loss does not
    depend on them and their classifier rows get no gradient."""
    return logits.masked_fill(~present, 0.0)


def absent_class_rows(model: EarlyExitViT, absent: Tensor) -> Tensor:
    """Bool mask over the global flat vector: the exit classifiers' weight rows and biases
    of the ``absent`` classes (HeteroFL aggregates each output row over its holders)."""
    out = torch.zeros(sum(p.numel() for p in model.parameters()), dtype=torch.bool)
    slices = param_slices(model)
    cls = absent.nonzero().flatten().cpu()
    for e in range(model.num_exits):
        w, b = slices[f"exits.{e}.fc.weight"], slices[f"exits.{e}.fc.bias"]
        rows = torch.arange(w.start, w.stop).view(model.num_classes, -1)[cls]
        out[rows.reshape(-1)] = True
        out[b.start + cls] = True
    return out.to(next(model.parameters()).device)


@CLIENT_ALGORITHMS.register("heterofl", tags=_WIDTH_TAGS)
class HeteroFL(WidthScaled):
    """HeteroFL (Diao et al., ICLR 2021) trains width-nested submodels at full depth with
    its scaler and masked cross-entropy on the last exit, averaged element-wise over their
    holders.

    * Scaler: the narrow model's embedding and linear outputs are divided by the rate r in
      training only (:func:`attach_scaler`).
    * Masked CE: logits of classes absent locally are 0 in the loss (no gradient reaches
      their classifier rows). HeteroFL's server also averages each output row over the
      clients holding its class (official ``combine``, with the label splits it knows):
      ``class_rows = "holders"``, the default — the server predicts each upload's mask from
      the client's tier and label counts (docs/security.md §1). ``"all"`` uploads those rows with a
      zero update instead (a non-holder then damps a row's update by its weight).
    * Normalisation: HeteroFL's static BatchNorm exists because BN keeps running
      statistics that differ between width submodels and clients; it tracks none during
      training and recomputes them for the global model afterwards. The ViT uses
      LayerNorm, which keeps no running statistics (per-sample in training and at test
      time, nothing to aggregate or recompute), so nothing is static-ised. Its statistics
      run over the kept channels (``norm = "kept"``, as HeteroFL's own transformer
      ``nn.LayerNorm(⌈r·E⌉)``); ``norm = "full"`` uses the full-width statistics with the
      dropped channels as zeros (:class:`FullWidthLayerNorm`).
    """

    params_schema = HeteroFLParams
    params: HeteroFLParams
    name = "heterofl"

    def split_data(
        self, net: Subnet, data: TensorData, ctx: ClientContext
    ) -> tuple[TensorData, dict]:
        counts = data.class_counts(net.model.num_classes).to(ctx.device)
        return data, {"present": counts > 0}

    def loss_of(self, net: Subnet, x: Tensor, target: Tensor) -> tuple[Tensor, dict[str, float]]:
        logits = self.exit_logits(net, x)
        if self.hp.masked_ce:
            logits = [class_mask_logits(z, net.extra["present"]) for z in logits]
        return self.loss_from(net, logits, target)

    def upload_mask(self, model: EarlyExitViT, net: Subnet, data: TensorData) -> Tensor | None:
        present = net.extra["present"]
        if self.hp.class_rows == "all" or bool(present.all()):
            return net.mask
        return self._without_rows(model, net.mask, ~present)

    def local_update(self, model: nn.Module, rnd: ClientRound) -> ClientUpdate:
        update = super().local_update(model, rnd)
        if self.hp.masked_ce and self.hp.class_rows == "all":
            # The rows of absent classes got no gradient; what weight decay did to them
            # locally is not uploaded: the client contributes "no change" there.
            counts = rnd.data.class_counts(as_multi_exit(model).num_classes).to(update.delta.device)
            rows = absent_class_rows(as_multi_exit(model), counts == 0)
            update.delta[rows] = 0.0
        return update

    def expected_mask(
        self, client_id: int, model: nn.Module, class_counts: Tensor | None = None
    ) -> Tensor | None:
        """The tier's mask; with ``class_rows = "holders"`` minus the classifier rows of
        the classes the client lacks, which needs its ``class_counts`` (HeteroFL's server
        knows every client's label split)."""
        mask = super().expected_mask(client_id, model)
        if self.hp.class_rows == "all":
            return mask
        if class_counts is None:
            raise ConfigError(
                "client.params.class_rows = 'holders' needs the server to know each client's "
                "label counts (the server passes them); use class_rows = 'all' otherwise"
            )
        absent = class_counts == 0
        if not bool(absent.any()):
            return mask
        return self._without_rows(as_multi_exit(model), mask, absent)

    @staticmethod
    def _without_rows(model: EarlyExitViT, mask: Tensor | None, absent: Tensor) -> Tensor:
        if mask is None:
            mask = torch.ones(sum(p.numel() for p in model.parameters()), dtype=torch.bool)
        mask = mask.to(next(model.parameters()).device)
        return mask & ~absent_class_rows(model, absent.to(mask.device))

    @property
    def hp(self) -> HeteroFLParams:
        return self.params


class ScaleFLParams(WidthParams):
    widths: list[float] = Field(
        [0.7, 0.7, 0.75, 1.0], description="width tiers (ScaleFL's vertical scale ratios)"
    )
    depths: list[int] = Field(
        [1, 2, 3, 4], description="exit tiers (ScaleFL's horizontal ratios: 1–4 of 4 exits)"
    )
    exit_weights: ExitWeights = Field("proportional", description="ScaleFL: r_e = e")
    kd: KDMode = Field("deepest_weighted", description="ScaleFL: KD from the last exit")
    kd_weight: float = Field(1.0, ge=0.0, description="gamma (our choice; see the docstring)")
    kd_temperature: float = Field(3.0, gt=0.0, description="T_KD (ScaleFL: 3)")
    kd_detach_teacher: bool = Field(
        False, description="ScaleFL's code lets the KD gradient reach the last exit"
    )
    kd_warmup_rounds: int | None = Field(
        None, ge=0, description="KD off for t <= this; None = T_FL/4 (ScaleFL)"
    )
    exit_blocks: list[int] | None = Field(
        None,
        description="the exit placement the model must have; None = ScaleFL's "
        "(⌈L·b/12⌉, b = 4, 6, 9, 12)",
    )


@CLIENT_ALGORITHMS.register("scalefl", tags=_WIDTH_TAGS)
class ScaleFL(WidthScaled):
    """ScaleFL (Ilhan et al., CVPR 2023) trains submodels scaled in width and depth on its
    own exit placement, with exits weighted by depth and distilled from the last exit.

    Placement: exits after blocks ⌈L·b/12⌉ for its 12-layer transformer's b ∈ {4, 6, 9, 12}
    ([2, 3, 5, 6] for L = 6; set ``model.params.exit_blocks`` to it). Tiers: the official
    levels (width 0.7, 0.7, 0.75, 1.0 with 1, 2, 3, 4 exits), widths rounded down per head.
    Loss (official ``train.py``): [Σ_{j<m} j (ℓ_j + γ T² KL(p_m ‖ p_j)) + m ℓ_m] /
    (m(m+1)/2), KD on once the first quarter of the rounds is over, T = 3, the teacher not
    detached. Our choices: KL is the batch mean (the official ``nn.KLDivLoss()`` also
    averages over classes, i.e. its γ is ours times C) and γ = 1. The scaler is as
    HeteroFL's.
    """

    params_schema = ScaleFLParams
    params: ScaleFLParams
    name = "scalefl"
    rounding = staticmethod(math.floor)
    kd_warmup_share = 0.25

    def check_layout(self, model: EarlyExitViT) -> None:
        super().check_layout(model)
        want = self.params.exit_blocks or scalefl_exit_blocks(len(model.vit.blocks))
        if model.exit_blocks != list(want):
            raise ConfigError(
                f"client.algorithm = 'scalefl' places its exits after blocks {list(want)}; "
                f"the model has them after {model.exit_blocks}: set model.params.exit_blocks "
                f"= {list(want)} (or client.params.exit_blocks to the model's)"
            )


__all__ = [
    "FullWidthLayerNorm",
    "HeteroFL",
    "HeteroFLParams",
    "ScaleFL",
    "ScaleFLParams",
    "WidthSubnet",
    "absent_class_rows",
    "attach_scaler",
    "class_mask_logits",
    "narrow_arch",
    "narrow_model",
    "width_index",
]
