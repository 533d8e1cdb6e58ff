"""Width-scaled baselines on the multi-exit ViT family (SPEC §8 "Baselines").

* ``heterofl`` (Diao et al., ICLR 2021): client k trains the width-nested submodel that
  keeps the first ⌈rate·H⌉ attention heads (embed dim h·d_head) and the first
  ⌊dim·mlp_ratio⌋ MLP channels of every layer, full depth, CE on the last exit;
* ``scalefl`` (Ilhan et al., CVPR 2023): width *and* depth tiers, CE at every active exit
  plus KD from the subnet's last exit.

The server needs nothing special: the client uploads its update scattered into the global
vector with a coverage mask of the entries it holds, and ``coverage_mean`` (eq. 15)
averages every entry over its holders — HeteroFL's element-wise aggregation.

Our simplifications (documented): no HeteroFL "scaler" (it rescales activations of
width-reduced BatchNorm CNNs; the ViT uses LayerNorm), LayerNorm statistics are taken
over the kept channels, and ScaleFL's loss uses uniform exit weights with γ = 1, T = 3.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

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
    cycled,
)
from fedshield.core.flat import get_params, param_slices, set_params
from fedshield.errors import ConfigError
from fedshield.models.eevit import EarlyExitViT


def narrow_model(model: EarlyExitViT, rate: float) -> EarlyExitViT:
    """The same architecture at width ``rate``: ⌈rate·H⌉ heads of the same head dim."""
    if not 0 < rate <= 1:
        raise ConfigError(f"client.params.widths: {rate} is outside (0, 1]")
    arch = dict(model.arch)
    heads, dim = arch["num_heads"], arch["embed_dim"]
    h = max(1, math.ceil(rate * heads))
    arch.update(embed_dim=h * (dim // heads), num_heads=h)
    sub = EarlyExitViT(
        input_shape=model.input_shape, num_classes=model.num_classes, **arch
    )  # fmt: skip
    return sub.to(next(model.parameters()).device)


def _slice_index(name: str, full: Tensor, sub_shape: torch.Size) -> Tensor:
    """Flat positions (within ``full``) of the entries the narrow parameter holds."""
    pos = torch.arange(full.numel()).view(full.shape)
    if name.endswith("attn.qkv.weight") or name.endswith("attn.qkv.bias"):
        # qkv rows are [q | k | v], each [H, d_head]: keep the first heads of each.
        d_full, d_sub = full.shape[0] // 3, sub_shape[0] // 3
        pos = pos.view(3, d_full, *full.shape[1:])
        pos = pos[(slice(None), slice(0, d_sub), *(slice(0, s) for s in sub_shape[1:]))]
    else:
        pos = pos[tuple(slice(0, s) for s in sub_shape)]
    return pos.reshape(-1)


def width_index(model: nn.Module, sub: nn.Module) -> Tensor:
    """For every entry of ``sub``'s flat vector, its position in ``model``'s flat vector."""
    slices = param_slices(model)
    full = dict(model.named_parameters())
    parts = []
    for name, p in sub.named_parameters():
        parts.append(_slice_index(name, full[name], p.shape) + slices[name].start)
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


class WidthParams(MultiExitParams):
    widths: list[float] = Field([], description="width tiers cycled over client ids; [] = 1")


class HeteroFLParams(WidthParams):
    exit_weights: ExitWeights = "last"
    kd: KDMode = "none"


class ScaleFLParams(WidthParams):
    exit_weights: ExitWeights = "uniform"
    kd_weight: float = Field(1.0, ge=0.0)


class WidthScaled(MultiExit):
    """Depth prefix of a width-nested submodel (tiers: ``depths``, ``widths``)."""

    params_schema = WidthParams
    name = "width"
    _cache: dict[float, tuple[EarlyExitViT, Tensor]]

    def make_subnet(self, model: EarlyExitViT, ctx: ClientContext) -> Subnet:
        if model.exit_mode != "stage":
            raise ConfigError(f"client.algorithm = '{self.name}' needs exit_mode = 'stage'")
        rate = float(cycled(self.params.widths, ctx.client_id, 1.0))  # type: ignore[attr-defined]
        m = self.depth_for(ctx.client_id, model.num_exits)
        if rate == 1.0:
            return super().make_subnet(model, ctx)
        cache = self.__dict__.setdefault("_cache", {})
        if rate not in cache:  # the narrow architecture and its index map never change
            sub = narrow_model(model, rate)
            cache[rate] = (sub, width_index(model, sub))
        sub, index = cache[rate]
        full = get_params(model)
        set_params(sub, full[index])
        keep = sub.prefix_mask(m)
        mask = torch.zeros_like(full, dtype=torch.bool)
        mask[index[keep]] = True
        return WidthSubnet(
            sub, m, sub.prefix_parameters(m), mask, index=index, start_sub=full[index].clone()
        )


@CLIENT_ALGORITHMS.register("heterofl", tags=["needs_model=multi_exit", "uploads=mask"])
class HeteroFL(WidthScaled):
    """HeteroFL: width tiers, full depth, CE on the last exit (no early exits)."""

    params_schema = HeteroFLParams
    name = "heterofl"


@CLIENT_ALGORITHMS.register("scalefl", tags=["needs_model=multi_exit", "uploads=mask"])
class ScaleFL(WidthScaled):
    """ScaleFL: width and depth tiers, CE at every active exit + KD from the last one."""

    params_schema = ScaleFLParams
    name = "scalefl"


__all__ = ["HeteroFL", "ScaleFL", "WidthSubnet", "narrow_model", "width_index"]
