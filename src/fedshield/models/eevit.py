"""Multi-exit ViT for depth-heterogeneous FL (SPEC §8 "Model"; seed 002 §III-A, §IV).

L stages (timm ``VisionTransformer`` blocks) with one exit after each. Exit e reads the
tokens z_e after block e and returns logits = W_e u_e + b_e with
u_e = LN((z_e^cls + mean_j z_{e,j}) / 2).

* ``eevit``: the generic builder (any patch / width / depth), e.g. the CIFAR-100 setting
  of the seed (dim 256, 4 heads, 6 exits) or a CPU-sized model (patch 4–7, dim 96).
* ``eevit_small``: the paper model, the first six blocks of
  ``vit_small_patch16_224.augreg_in21k_ft_in1k`` at 224×224 (bicubic resize), weights from
  a local state dict or an offline Hugging Face cache.
* ``exit_mode = "recurrent"`` swaps the per-stage heads for ReeFL's single shared recurrent
  exit (a transformer block over the stage summaries s_1..s_e), for that baseline.

Inputs are images in [0, 1] (as the data bundles deliver them); resizing, grey → RGB
expansion and mean/std normalisation happen inside ``forward`` so attacks and routing see
pixel space. Depth-limited training evaluates only the first m blocks (``forward_exits``).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal

import torch
import torch.nn.functional as F
from timm.layers import trunc_normal_
from timm.models.vision_transformer import Block, VisionTransformer
from torch import Tensor, nn

from fedshield.errors import ConfigError, DataError
from fedshield.models.base import MODELS, Classifier
from fedshield.routing import Policy, exit_threshold

PAPER_CHECKPOINT = "vit_small_patch16_224.augreg_in21k_ft_in1k"
PAPER_HF_REPO = f"timm/{PAPER_CHECKPOINT}"
# AugReg checkpoints normalise with mean = std = 0.5 (timm's pretrained_cfg).
_AUGREG_MEAN_STD = (0.5, 0.5)

ExitMode = Literal["stage", "recurrent"]


class ExitHead(nn.Module):
    """u_e = LN(s_e), logits = W_e u_e + b_e (SPEC §8)."""

    def __init__(self, dim: int, num_classes: int) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(dim, eps=1e-6)
        self.fc = nn.Linear(dim, num_classes)
        trunc_normal_(self.fc.weight, std=0.02)
        nn.init.zeros_(self.fc.bias)

    def forward(self, s: Tensor) -> Tensor:
        return self.fc(self.norm(s))


class RecurrentExit(nn.Module):
    """ReeFL's shared exit (Lee et al., 2024; SPEC §8 baselines): one transformer block
    over the stage summaries s_1..s_e plus a learned depth embedding; the output at
    position e goes through one shared LN + linear classifier. Shared by every exit, so
    every client covers it whatever its depth."""

    def __init__(self, dim: int, num_heads: int, num_exits: int, num_classes: int) -> None:
        super().__init__()
        self.depth_embed = nn.Parameter(torch.zeros(1, num_exits, dim))
        trunc_normal_(self.depth_embed, std=0.02)
        self.block = Block(dim, num_heads, qkv_bias=True)
        self.head = ExitHead(dim, num_classes)

    def forward(self, summaries: Tensor) -> Tensor:
        """``summaries`` [B, e, D] → logits of exit e [B, C]."""
        e = summaries.shape[1]
        z = self.block(summaries + self.depth_embed[:, :e])
        return self.head(z[:, -1])


class EarlyExitViT(Classifier):
    """timm ViT trunk (``self.vit``, timm parameter names) + one exit per block.

    ``forward(x)`` returns the deepest exit's logits, so the engine's accuracy, the
    adversarial attacks ("generated against the deepest exit") and FedCART-style wrappers
    see an ordinary classifier; ``forward_exits`` returns all (or the first m) exits.
    """

    def __init__(
        self,
        *,
        input_shape: Sequence[int],
        num_classes: int,
        img_size: int | None = None,
        patch_size: int = 4,
        embed_dim: int = 96,
        depth: int = 6,
        num_heads: int = 3,
        mlp_ratio: float = 4.0,
        in_chans: int | None = None,
        drop_path_rate: float = 0.0,
        mean: float | Sequence[float] = 0.5,
        std: float | Sequence[float] = 0.5,
        exit_mode: ExitMode = "stage",
    ) -> None:
        super().__init__()
        if exit_mode not in ("stage", "recurrent"):
            raise ConfigError(
                f"model.params.exit_mode must be 'stage' or 'recurrent', got {exit_mode!r}"
            )
        if depth < 1:
            raise ConfigError(f"model.params.depth must be >= 1, got {depth}")
        c_in, h_in, w_in = (int(v) for v in input_shape)
        self.input_shape = (c_in, h_in, w_in)
        self.in_chans = c_in if in_chans is None else int(in_chans)
        if c_in not in (1, self.in_chans):
            raise ConfigError(
                f"model.params.in_chans={self.in_chans} cannot take {c_in}-channel inputs"
            )
        self.img_size = int(img_size) if img_size is not None else h_in
        if self.img_size % patch_size:
            raise ConfigError(
                f"model.params: img_size {self.img_size} is not a multiple of "
                f"patch_size {patch_size}"
            )
        # Stochastic depth comes from timm's DropPath inside each Block (linear decay rule).
        self.vit = VisionTransformer(
            img_size=self.img_size,
            patch_size=patch_size,
            in_chans=self.in_chans,
            num_classes=0,
            global_pool="",
            embed_dim=embed_dim,
            depth=depth,
            num_heads=num_heads,
            mlp_ratio=mlp_ratio,
            final_norm=False,  # each exit has its own LN (u_e); timm's final norm is unused
            drop_path_rate=drop_path_rate,
        )
        self.num_exits = depth
        self.num_classes = num_classes
        self.num_features = embed_dim
        self.exit_mode: ExitMode = exit_mode
        if exit_mode == "stage":
            self.exits = nn.ModuleList(ExitHead(embed_dim, num_classes) for _ in range(depth))
        else:
            self.rexit = RecurrentExit(embed_dim, num_heads, depth, num_classes)
        self._mean = _per_channel(mean, self.in_chans, "mean")
        self._std = _per_channel(std, self.in_chans, "std")
        self.arch = {
            "patch_size": patch_size,
            "embed_dim": embed_dim,
            "depth": depth,
            "num_heads": num_heads,
            "mlp_ratio": mlp_ratio,
            "in_chans": self.in_chans,
            "img_size": self.img_size,
            "drop_path_rate": drop_path_rate,
            "mean": self._mean,
            "std": self._std,
            "exit_mode": exit_mode,
        }

    # -- input pipeline --------------------------------------------------------------
    def prepare(self, x: Tensor) -> Tensor:
        """[0, 1] images → normalised model input (grey → RGB, bicubic resize)."""
        if x.shape[1] != self.in_chans:
            x = x.expand(-1, self.in_chans, -1, -1)  # a grey image through an RGB stem
        if x.shape[-2:] != (self.img_size, self.img_size):
            # The checkpoint was trained at 224×224; the seed resizes CIFAR bicubically.
            x = F.interpolate(
                x, size=(self.img_size, self.img_size), mode="bicubic", align_corners=False
            )
        mean = x.new_tensor(self._mean)[None, :, None, None]
        std = x.new_tensor(self._std)[None, :, None, None]
        return (x - mean) / std

    def stem(self, x: Tensor) -> Tensor:
        """Tokens before block 1: patch embedding, class token, positions."""
        v = self.vit
        return v.norm_pre(v.patch_drop(v._pos_embed(v.patch_embed(self.prepare(x)))))

    def summary(self, tokens: Tensor) -> Tensor:
        """s_e = (z_e^cls + mean_j z_{e,j}) / 2 (before the exit LN)."""
        patches = tokens[:, self.vit.num_prefix_tokens :]
        return (tokens[:, 0] + patches.mean(dim=1)) / 2

    # -- forward passes ---------------------------------------------------------------
    def exit_logits(self, e: int, summaries: list[Tensor]) -> Tensor:
        """Logits of exit ``e`` (1-based) from the summaries s_1..s_e computed so far."""
        if self.exit_mode == "stage":
            return self.exits[e - 1](summaries[e - 1])
        return self.rexit(torch.stack(summaries[:e], dim=1))

    def forward_exits(self, x: Tensor, depth: int | None = None) -> list[Tensor]:
        """Logits of exits 1..m (m = ``depth``, default L); blocks past m are not run."""
        m = self.num_exits if depth is None else depth
        if not 1 <= m <= self.num_exits:
            raise ValueError(f"depth must be in 1..{self.num_exits}, got {m}")
        z = self.stem(x)
        summaries, out = [], []
        for e in range(1, m + 1):
            z = self.vit.blocks[e - 1](z)
            summaries.append(self.summary(z))
            out.append(self.exit_logits(e, summaries))
        return out

    def _summaries(self, x: Tensor) -> list[Tensor]:
        z = self.stem(x)
        out = []
        for blk in self.vit.blocks:
            z = blk(z)
            out.append(self.summary(z))
        return out

    def forward_features(self, x: Tensor) -> Tensor:
        """u_L (stage mode) — the representation the deepest exit's linear layer reads."""
        if self.exit_mode != "stage":
            raise NotImplementedError("forward_features needs exit_mode='stage'")
        return self.exits[-1].norm(self._summaries(x)[-1])

    def forward_head(self, z: Tensor) -> Tensor:
        return self.exits[-1].fc(z)

    @property
    def head(self) -> nn.Linear:  # type: ignore[override]
        return self.exits[-1].fc

    def forward(self, x: Tensor) -> Tensor:
        """Deepest exit's logits (full-depth inference)."""
        return self.exit_logits(self.num_exits, self._summaries(x))

    # -- subnets ------------------------------------------------------------------------
    def stage_of(self, name: str) -> int:
        """Shallowest depth m whose subnet contains parameter ``name`` (SPEC §8 prefix:
        patch embedding and tokens = 0, block e and head e = e, shared exit = 0)."""
        if match := re.match(r"(?:vit\.blocks|exits)\.(\d+)\.", name):
            return int(match.group(1)) + 1
        return 0

    def prefix_mask(self, depth: int) -> Tensor:
        """Bool mask over the flat parameter vector (``sim.flat`` order) of the depth-m
        subnet: stem + blocks 1..m + exits 1..m."""
        if not 1 <= depth <= self.num_exits:
            raise ValueError(f"depth must be in 1..{self.num_exits}, got {depth}")
        parts = [
            torch.full((p.numel(),), self.stage_of(n) <= depth, dtype=torch.bool)
            for n, p in self.named_parameters()
        ]
        return torch.cat(parts).to(next(self.parameters()).device)

    def prefix_parameters(self, depth: int) -> list[tuple[str, nn.Parameter]]:
        return [(n, p) for n, p in self.named_parameters() if self.stage_of(n) <= depth]

    def no_weight_decay(self) -> set[str]:
        """Positional/class tokens skip weight decay, as in timm."""
        return {f"vit.{n}" for n in self.vit.no_weight_decay()} | {"rexit.depth_embed"}

    # -- routed inference ---------------------------------------------------------------
    @torch.no_grad()
    def forward_routed(
        self, x: Tensor, policy: Policy | str, client_score: Tensor | float = 0.0
    ) -> tuple[Tensor, Tensor]:
        """(0-based exit index, prediction) with real early exit: samples accepted at e
        leave the batch, so deeper blocks run only on the deferred ones (SPEC §8 eq. 12)."""
        n = x.shape[0]
        exit_idx = torch.full((n,), self.num_exits - 1, dtype=torch.long, device=x.device)
        preds = torch.empty(n, dtype=torch.long, device=x.device)
        alive = torch.arange(n, device=x.device)
        score = torch.as_tensor(client_score, dtype=x.dtype, device=x.device)
        z = self.stem(x)
        summaries: list[Tensor] = []
        for e in range(1, self.num_exits + 1):
            z = self.vit.blocks[e - 1](z)
            summaries.append(self.summary(z))
            p = self.exit_logits(e, summaries).float().softmax(-1)
            if e == self.num_exits:  # exit L always accepts
                preds[alive] = p.argmax(-1)
                break
            s = score if score.dim() == 0 else score[alive]
            accept = p.amax(-1) > exit_threshold(p, e, self.num_exits, policy, s)
            done = alive[accept]
            exit_idx[done] = e - 1
            preds[done] = p[accept].argmax(-1)
            keep = ~accept
            alive, z = alive[keep], z[keep]
            summaries = [s_[keep] for s_ in summaries]
            if alive.numel() == 0:
                break
        return exit_idx, preds


def _per_channel(v: float | Sequence[float], chans: int, key: str) -> tuple[float, ...]:
    vals = (float(v),) * chans if isinstance(v, int | float) else tuple(float(t) for t in v)
    if len(vals) == 1:
        vals = vals * chans
    if len(vals) != chans:
        raise ConfigError(f"model.params.{key} needs 1 or {chans} values, got {len(vals)}")
    return vals


# -- pretrained weights -----------------------------------------------------------------


def _read_state_dict(path: Path) -> dict[str, Tensor]:
    try:
        if path.suffix == ".safetensors":
            from safetensors.torch import load_file

            sd: Any = load_file(str(path))
        else:
            sd = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as err:  # unpickling / format errors of many kinds
        raise DataError(
            f"{path}: cannot read a state dict ({type(err).__name__}: {err}); expected a "
            f"timm checkpoint saved with torch.save (.pth/.pt/.bin) or .safetensors"
        ) from None
    for key in ("model", "state_dict"):  # common checkpoint wrappers
        if isinstance(sd, dict) and isinstance(sd.get(key), dict):
            sd = sd[key]
    if not isinstance(sd, dict):
        raise DataError(f"{path}: not a state dict")
    return sd


def _hf_cache_file(repo: str) -> Path | None:
    """The checkpoint from an offline Hugging Face cache (never touches the network)."""
    try:
        from huggingface_hub import try_to_load_from_cache
    except ImportError:  # pragma: no cover - a dependency of timm
        return None
    for fname in ("model.safetensors", "pytorch_model.bin"):
        hit = try_to_load_from_cache(repo, fname)
        if isinstance(hit, str):
            return Path(hit)
    return None


def truncate_vit_state_dict(sd: dict[str, Tensor], depth: int) -> dict[str, Tensor]:
    """Keep the stem and blocks 0..depth-1 of a timm ViT state dict (drop deeper blocks,
    the final norm and the classifier), as the paper keeps the first six blocks."""
    out = {}
    for k, v in sd.items():
        if match := re.match(r"blocks\.(\d+)\.", k):
            if int(match.group(1)) < depth:
                out[k] = v
        elif k.split(".")[0] in ("patch_embed", "cls_token", "pos_embed", "reg_token"):
            out[k] = v
    return out


def load_pretrained(model: EarlyExitViT, path: str | Path | None, hf_repo: str) -> list[str]:
    """Load the trunk of ``model`` from ``path`` (a timm state dict: .pth/.pt/.bin or
    .safetensors) or, when ``path`` is None, from the offline HF cache of ``hf_repo``.

    The exit heads are new (the checkpoint has one classifier, after block 12), so they
    keep their fresh initialisation. Returns the checkpoint keys that were dropped.
    """
    from timm.models.vision_transformer import checkpoint_filter_fn

    if path is not None:
        file = Path(path).expanduser()
        if not file.is_file():
            raise DataError(
                f"model.params.pretrained_path: {file} not found (set pretrained = false "
                f"to start from random init)"
            )
    else:
        file = _hf_cache_file(hf_repo)
        if file is None:
            raise DataError(
                f"pretrained weights for {hf_repo} are not in the Hugging Face cache "
                f"({_hf_cache_dir()}); set model.params.pretrained_path to a local state "
                f"dict, or pretrained = false"
            )
    raw = _read_state_dict(file)
    # timm's filter converts foreign layouts and resamples pos_embed to our grid.
    converted = checkpoint_filter_fn(raw, model.vit)
    kept = truncate_vit_state_dict(converted, model.num_exits)
    try:
        model.vit.load_state_dict(kept, strict=True)
    except RuntimeError as err:
        raise DataError(f"{file}: does not fit the model: {err}") from None
    return sorted(set(converted) - set(kept))


def _hf_cache_dir() -> str:
    try:
        from huggingface_hub import constants

        return str(constants.HF_HUB_CACHE)
    except ImportError:  # pragma: no cover
        return "~/.cache/huggingface/hub"


# -- registry -------------------------------------------------------------------------


@MODELS.register("eevit")
def eevit(
    input_shape: tuple[int, int, int],
    num_classes: int,
    *,
    pretrained: bool = False,
    pretrained_path: str | None = None,
    hf_repo: str = PAPER_HF_REPO,
    **arch: Any,
) -> EarlyExitViT:
    """Multi-exit ViT, any size (SPEC §8). Defaults: the CPU model (patch 4, dim 96,
    3 heads, 6 blocks) at the input resolution; ``patch_size`` must divide ``img_size``."""
    model = EarlyExitViT(input_shape=input_shape, num_classes=num_classes, **arch)
    if pretrained or pretrained_path is not None:
        load_pretrained(model, pretrained_path, hf_repo)
    return model


@MODELS.register("eevit_small")
def eevit_small(
    input_shape: tuple[int, int, int],
    num_classes: int,
    *,
    pretrained: bool = False,
    pretrained_path: str | None = None,
    depth: int = 6,
    drop_path_rate: float = 0.0,
    img_size: int = 224,
    exit_mode: ExitMode = "stage",
) -> EarlyExitViT:
    """The paper model: first ``depth`` = 6 blocks of ViT-S/16 (dim 384, 6 heads),
    224×224 bicubic inputs, AugReg normalisation (seed 002 §IV).

    Random init unless ``pretrained`` (offline HF cache) or ``pretrained_path`` is set
    (SPEC §8); the paper presets set ``pretrained = true``, which fails with a clear
    error naming the cache when the weights are absent."""
    mean, std = _AUGREG_MEAN_STD
    return eevit(
        input_shape,
        num_classes,
        pretrained=pretrained,
        pretrained_path=pretrained_path,
        hf_repo=PAPER_HF_REPO,
        img_size=img_size,
        patch_size=16,
        embed_dim=384,
        depth=depth,
        num_heads=6,
        mlp_ratio=4.0,
        in_chans=3,
        drop_path_rate=drop_path_rate,
        mean=mean,
        std=std,
        exit_mode=exit_mode,
    )


def prefix_bytes(model: nn.Module, mask: Tensor | None, num_buffers: int = 0) -> int:
    """Serialized size of the active prefix (raw tensor bytes, protocol overhead excluded)."""
    elem = next(model.parameters()).element_size()
    count = sum(p.numel() for p in model.parameters()) if mask is None else int(mask.sum())
    return (count + num_buffers) * elem


__all__ = [
    "PAPER_CHECKPOINT",
    "EarlyExitViT",
    "ExitHead",
    "RecurrentExit",
    "eevit",
    "eevit_small",
    "load_pretrained",
    "prefix_bytes",
    "truncate_vit_state_dict",
]
