"""Multi-exit ViT for depth-heterogeneous FL (early-exit ViT paper, Secs. III-A and IV).

L stages (timm ``VisionTransformer`` blocks) and exits after ``exit_blocks`` (default: one
after every block). Exit e reads the tokens z_e after its block and returns
logits = W_e u_e + b_e with u_e = LN((z_e^cls + mean_j z_{e,j}) / 2).

* ``eevit``: the generic builder (any patch / width / depth), e.g. the CIFAR-100 setting
  of the seed (dim 256, 4 heads, 6 exits) or a CPU-sized model (patch 4–7, dim 96).
* ``eevit_small``: the paper model, the first six blocks of
  ``vit_small_patch16_224.augreg_in21k_ft_in1k`` at 224×224 (bicubic resize), weights from
  a local state dict or the Hugging Face cache, downloaded from the Hub when allowed
  (:mod:`fedshield.models.pretrained`).

The baselines' exit structures are options of the same model, so every method runs on the
same timm trunk:

* ``exit_mode = "recurrent"``: ReeFL's single shared recurrent exit (:class:`ReeExit`);
* ``exit_bottleneck = "depthfl"``: DepthFL's bottleneck layers before each shallow
  classifier (:class:`TokenBottleneck`);
* ``exit_blocks``: the exit placement, e.g. ScaleFL's (:func:`scalefl_exit_blocks`);
* ``attn_head_dim`` / ``mlp_hidden``: the narrowed widths of a HeteroFL / ScaleFL submodel.

Inputs are images in [0, 1] (as the data bundles deliver them); resizing, grey → RGB
expansion and mean/std normalisation happen inside ``forward`` so attacks and routing see
pixel space. Depth-limited training evaluates only the blocks up to the m-th exit
(``forward_exits``).
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal, cast

import torch
import torch.nn.functional as F
from pydantic import Field, StrictBool
from timm.layers import Mlp, trunc_normal_
from timm.layers.attention import Attention
from timm.models.vision_transformer import VisionTransformer
from torch import Tensor, nn

from fedshield.core.params import Params, parse_params
from fedshield.errors import ConfigError, DataError
from fedshield.models.base import MODELS, Classifier
from fedshield.models.pretrained import load_exactly, read_state_dict, resolve_weights
from fedshield.routing import Policy, exit_threshold

PAPER_CHECKPOINT = "vit_small_patch16_224.augreg_in21k_ft_in1k"
PAPER_HF_REPO = f"timm/{PAPER_CHECKPOINT}"
# AugReg checkpoints normalise with mean = std = 0.5 (timm's pretrained_cfg).
_AUGREG_MEAN_STD = (0.5, 0.5)

ExitMode = Literal["stage", "recurrent"]
ExitBottleneck = Literal["none", "depthfl"]


def scalefl_exit_blocks(depth: int) -> list[int]:
    """ScaleFL's exit placement scaled to ``depth`` blocks (1-based block indices).

    ScaleFL (Ilhan et al., CVPR 2023; official code, ``config.py``) places the exits of its
    12-layer transformer after layers 4, 6, 9 and 12; we keep the same relative depths,
    ⌈depth·b/12⌉ for b ∈ {4, 6, 9, 12} (duplicates dropped): [2, 3, 5, 6] for 6 blocks.
    """
    if depth < 1:
        raise ConfigError(f"model.params.depth must be >= 1, got {depth}")
    return sorted({max(1, math.ceil(depth * b / 12)) for b in (4, 6, 9, 12)})


class ExitHead(nn.Module):
    """u_e = LN(s_e), logits = W_e u_e + b_e (early-exit ViT paper, Sec. IV)."""

    def __init__(self, dim: int, num_classes: int) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(dim, eps=1e-6)
        self.fc = nn.Linear(dim, num_classes)
        trunc_normal_(self.fc.weight, std=0.02)
        nn.init.zeros_(self.fc.bias)

    def forward(self, s: Tensor) -> Tensor:
        return self.fc(self.norm(s))


class TokenBottleneck(nn.Module):
    """One bottleneck layer of a shallow DepthFL classifier: z + W₂ GELU(W₁ LN(z)) on
    every token, hidden width ⌈ratio·D⌉.

    DepthFL (Kim et al., ICLR 2023) gives the classifier after stage e of a ResNet
    (L − e) "bottleneck layers" (depthwise-separable conv blocks, official code
    ``SepConv``) so that shallow classifiers have enough capacity of their own. A ViT has
    no feature map to downsample; our choice is this pre-norm residual MLP on the tokens
    (before the exit summary), with the same count rule: exit e of L gets L − e layers.
    """

    def __init__(self, dim: int, ratio: float) -> None:
        super().__init__()
        hidden = max(1, math.ceil(ratio * dim))
        self.norm = nn.LayerNorm(dim, eps=1e-6)
        self.fc1 = nn.Linear(dim, hidden)
        self.fc2 = nn.Linear(hidden, dim)
        for fc in (self.fc1, self.fc2):
            trunc_normal_(fc.weight, std=0.02)
            nn.init.zeros_(fc.bias)

    def forward(self, z: Tensor) -> Tensor:
        return z + self.fc2(F.gelu(self.fc1(self.norm(z))))


class _ReeAttention(nn.Module):
    """Multi-head self-attention with its own (small) inner width ``attn_dim``; the
    logits are scaled by attn_dim^(-1/2) as in ReeFL's official code."""

    def __init__(self, dim: int, heads: int, attn_dim: int) -> None:
        super().__init__()
        if attn_dim % heads:
            raise ConfigError(
                f"model.params.ree_attn_dim ({attn_dim}) must be a multiple of ree_heads ({heads})"
            )
        self.heads, self.attn_dim = heads, attn_dim
        self.qkv = nn.Linear(dim, 3 * attn_dim)
        self.proj = nn.Linear(attn_dim, dim)

    def forward(self, x: Tensor) -> Tensor:
        b, n, _ = x.shape
        qkv = self.qkv(x).view(b, n, 3, self.heads, self.attn_dim // self.heads)
        q, k, v = qkv.permute(2, 0, 3, 1, 4).unbind(0)
        out = F.scaled_dot_product_attention(q, k, v, scale=self.attn_dim**-0.5)
        return self.proj(out.transpose(1, 2).reshape(b, n, self.attn_dim))


class ReeExit(nn.Module):
    """ReeFL's shared recurrent early-exit module (Lee et al., ICML 2024, "Recurrent Early
    Exits for Federated Learning with Heterogeneous Clients").

    At block l it reads the class tokens of all blocks so far, [z_1^cls … z_l^cls],
    prepends a learned client (meta) token, adds a learned position embedding and runs a
    pre-norm transformer layer (attention of inner width ``attn_dim``, MLP ratio
    ``mlp_ratio``) ``steps`` times with shared weights; the output m is used twice:

    * exit logits = LN-linear head(m_0 + z_l^cls) (one classifier shared by every exit);
    * modulation: m_l replaces the backbone's class token before block l + 1.

    As in the official code (``accumulator_nets.Ree``); ``heads`` and ``steps`` are not
    given in the paper text we had — our choice: 1 head, 1 step (config parameters).
    Shared by every exit, so every client covers it whatever its depth.
    """

    def __init__(
        self,
        dim: int,
        num_blocks: int,
        num_classes: int,
        *,
        heads: int = 1,
        attn_dim: int = 16,
        mlp_ratio: float = 2.0,
        steps: int = 1,
        modulation: bool = True,
    ) -> None:
        super().__init__()
        self.steps, self.modulation = steps, modulation
        self.client_token = nn.Parameter(torch.zeros(1, 1, dim))
        self.pos_embed = nn.Parameter(torch.zeros(1, num_blocks + 1, dim))
        trunc_normal_(self.client_token, std=0.02)
        trunc_normal_(self.pos_embed, std=0.02)
        self.norm1 = nn.LayerNorm(dim)
        self.attn = _ReeAttention(dim, heads, attn_dim)
        self.norm2 = nn.LayerNorm(dim)
        self.mlp = Mlp(dim, max(1, int(dim * mlp_ratio)))
        self.head = ExitHead(dim, num_classes)

    def forward(self, cls_tokens: Tensor) -> Tensor:
        """``cls_tokens`` [B, l, D] → m [B, l + 1, D] (position 0: the client token)."""
        b, n, _ = cls_tokens.shape
        x = torch.cat([self.client_token.expand(b, -1, -1), cls_tokens], dim=1)
        x = x + self.pos_embed[:, : n + 1]
        for _ in range(self.steps):
            x = x + self.attn(self.norm1(x))
            x = x + self.mlp(self.norm2(x))
        return x

    def logits(self, m: Tensor, last_cls: Tensor) -> Tensor:
        return self.head(m[:, 0] + last_cls)


class EarlyExitViT(Classifier):
    """timm ViT trunk (``self.vit``, timm parameter names) + exits after ``exit_blocks``.

    ``forward(x)`` returns the deepest exit's logits, so the engine's accuracy, the
    adversarial attacks ("generated against the deepest exit") and FedCART-style wrappers
    see an ordinary classifier; ``forward_exits`` returns all (or the first m) exits.
    Depth m of a client counts exits: it trains the blocks up to the m-th exit.
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
        exit_blocks: Sequence[int] | None = None,
        exit_bottleneck: ExitBottleneck = "none",
        bottleneck_ratio: float = 0.25,
        ree_heads: int = 1,
        ree_attn_dim: int = 16,
        ree_mlp_ratio: float = 2.0,
        ree_steps: int = 1,
        ree_modulation: bool = True,
        attn_head_dim: int | None = None,
        mlp_hidden: int | None = None,
    ) -> None:
        super().__init__()
        if exit_mode not in ("stage", "recurrent"):
            raise ConfigError(
                f"model.params.exit_mode must be 'stage' or 'recurrent', got {exit_mode!r}"
            )
        if depth < 1:
            raise ConfigError(f"model.params.depth must be >= 1, got {depth}")
        if attn_head_dim is None and embed_dim % num_heads:
            raise ConfigError(
                f"model.params.embed_dim ({embed_dim}) must be a multiple of num_heads "
                f"({num_heads})"
            )
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
        blocks = _check_exit_blocks(exit_blocks, depth)
        hidden = int(mlp_hidden) if mlp_hidden is not None else int(embed_dim * mlp_ratio)
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
            # timm's Block takes int(dim · ratio) hidden units; +0.5 makes that exact.
            mlp_ratio=(hidden + 0.5) / embed_dim,
            final_norm=False,  # each exit has its own LN (u_e); timm's final norm is unused
            drop_path_rate=drop_path_rate,
            attn_layer=_attention_layer(attn_head_dim),
        )
        self.exit_blocks = blocks
        self.num_exits = len(blocks)
        self.num_classes = num_classes
        self.num_features = embed_dim
        self.num_heads = num_heads
        self.head_dim = attn_head_dim if attn_head_dim is not None else embed_dim // num_heads
        self.mlp_hidden = hidden
        self.exit_mode: ExitMode = exit_mode
        # block index (0-based) → exit index (0-based); block → the depth m that needs it
        self._exit_at = {b - 1: e for e, b in enumerate(blocks)}
        self._block_stage = [
            next(e + 1 for e, b in enumerate(blocks) if b > i) for i in range(depth)
        ]
        self.bottlenecks: nn.ModuleList | None = None
        if exit_mode == "stage":
            self.exits = nn.ModuleList(ExitHead(embed_dim, num_classes) for _ in blocks)
            if exit_bottleneck == "depthfl":
                self.bottlenecks = nn.ModuleList(
                    nn.Sequential(
                        *(
                            TokenBottleneck(embed_dim, bottleneck_ratio)
                            for _ in range(self.num_exits - e - 1)
                        )
                    )
                    for e in range(self.num_exits)
                )
        else:
            if exit_bottleneck != "none":
                raise ConfigError("model.params.exit_bottleneck needs exit_mode = 'stage'")
            self.rexit = ReeExit(
                embed_dim,
                depth,
                num_classes,
                heads=ree_heads,
                attn_dim=ree_attn_dim,
                mlp_ratio=ree_mlp_ratio,
                steps=ree_steps,
                modulation=ree_modulation,
            )
        self._mean = _per_channel(mean, self.in_chans, "mean")
        self._std = _per_channel(std, self.in_chans, "std")
        self.arch: dict[str, Any] = {
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
            "exit_blocks": list(blocks),
            "exit_bottleneck": exit_bottleneck,
            "bottleneck_ratio": bottleneck_ratio,
            "ree_heads": ree_heads,
            "ree_attn_dim": ree_attn_dim,
            "ree_mlp_ratio": ree_mlp_ratio,
            "ree_steps": ree_steps,
            "ree_modulation": ree_modulation,
            "attn_head_dim": attn_head_dim,
            "mlp_hidden": hidden,
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
    def block_step(self, b: int, z: Tensor, history: list[Tensor]) -> tuple[Tensor, Tensor | None]:
        """Run block ``b`` (0-based) on tokens ``z``: (tokens for block b + 1, logits of the
        exit after block b or None). ``history`` collects the class tokens ReeFL's shared
        exit reads (recurrent mode; callers pass an empty list and keep it)."""
        z = self.vit.blocks[b](z)
        e = self._exit_at.get(b)
        if self.exit_mode == "stage":
            if e is None:
                return z, None
            t = self.bottlenecks[e](z) if self.bottlenecks is not None else z
            return z, self.exits[e](self.summary(t))
        history.append(z[:, 0])
        m = self.rexit(torch.stack(history, dim=1))
        logits = self.rexit.logits(m, history[-1]) if e is not None else None
        if self.rexit.modulation:  # m_l becomes the class token of block l + 1
            z = torch.cat([m[:, -1:], z[:, 1:]], dim=1)
        return z, logits

    def forward_exits(self, x: Tensor, depth: int | None = None) -> list[Tensor]:
        """Logits of exits 1..m (m = ``depth``, default all); blocks past exit m are not run."""
        m = self.num_exits if depth is None else depth
        if not 1 <= m <= self.num_exits:
            raise ValueError(f"depth must be in 1..{self.num_exits}, got {m}")
        history: list[Tensor]
        z, history, out = self.stem(x), [], []
        for b in range(self.exit_blocks[m - 1]):
            z, logits = self.block_step(b, z, history)
            if logits is not None:
                out.append(logits)
        return out

    def forward_features(self, x: Tensor) -> Tensor:
        """u_L (stage mode) — the representation the deepest exit's linear layer reads."""
        if self.exit_mode != "stage":
            raise NotImplementedError("forward_features needs exit_mode='stage'")
        z = self.stem(x)
        for blk in self.vit.blocks:
            z = blk(z)
        return self._last_exit.norm(self.summary(z))  # the last exit has no bottleneck

    def forward_head(self, z: Tensor) -> Tensor:
        return self._last_exit.fc(z)

    @property
    def head(self) -> nn.Linear:  # type: ignore[override]
        return self._last_exit.fc

    @property
    def _last_exit(self) -> ExitHead:
        return cast(ExitHead, self.exits[-1])  # a ModuleList's items are typed nn.Module

    def forward(self, x: Tensor) -> Tensor:
        """Deepest exit's logits (full-depth inference)."""
        return self.forward_exits(x)[-1]

    # -- subnets ------------------------------------------------------------------------
    def stage_of(self, name: str) -> int:
        """Shallowest depth m whose subnet contains parameter ``name`` (the prefix of the
        early-exit ViT paper's subnets: patch embedding and tokens = 0, a block = the first exit at
        or after it, exit e and its bottleneck = e, ReeFL's shared exit = 0)."""
        if match := re.match(r"vit\.blocks\.(\d+)\.", name):
            return self._block_stage[int(match.group(1))]
        if (e := self.exit_of(name)) is not None:
            return e
        return 0

    def exit_of(self, name: str) -> int | None:
        """The exit (1-based) whose head or bottleneck holds ``name``; None for the trunk
        and the shared recurrent exit."""
        if match := re.match(r"(?:exits|bottlenecks)\.(\d+)\.", name):
            return int(match.group(1)) + 1
        return None

    def prefix_mask(self, depth: int) -> Tensor:
        """Bool mask over the flat parameter vector (``core.flat`` order) of the depth-m
        subnet: stem + blocks up to exit m + exits 1..m."""
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
        return {f"vit.{n}" for n in self.vit.no_weight_decay()} | {
            "rexit.pos_embed",
            "rexit.client_token",
        }

    # -- routed inference ---------------------------------------------------------------
    @torch.no_grad()
    def forward_routed(
        self, x: Tensor, policy: Policy | str, client_score: Tensor | float = 0.0
    ) -> tuple[Tensor, Tensor]:
        """(0-based exit index, prediction) with real early exit: samples accepted at e
        leave the batch, so deeper blocks run only on the deferred ones (early-exit ViT paper, eq.
        12)."""
        n, num_exits = x.shape[0], self.num_exits
        exit_idx = torch.full((n,), num_exits - 1, dtype=torch.long, device=x.device)
        preds = torch.empty(n, dtype=torch.long, device=x.device)
        alive = torch.arange(n, device=x.device)
        score = torch.as_tensor(client_score, dtype=x.dtype, device=x.device)
        history: list[Tensor]
        z, history = self.stem(x), []
        for b in range(self.exit_blocks[-1]):
            z, logits = self.block_step(b, z, history)
            if logits is None:
                continue
            e = self._exit_at[b] + 1
            p = logits.float().softmax(-1)
            if e == num_exits:  # exit L always accepts
                preds[alive] = p.argmax(-1)
                break
            s = score if score.dim() == 0 else score[alive]
            accept = p.amax(-1) > exit_threshold(p, e, num_exits, policy, s)
            done = alive[accept]
            exit_idx[done] = e - 1
            preds[done] = p[accept].argmax(-1)
            keep = ~accept
            alive, z = alive[keep], z[keep]
            history[:] = [h[keep] for h in history]
            if alive.numel() == 0:
                break
        return exit_idx, preds


_NARROW_ATTENTION: dict[int, type[Attention]] = {}


def _attention_layer(head_dim: int | None) -> type[Attention]:
    """timm's Attention, or one with a fixed per-head width (a width-narrowed submodel whose
    heads are narrower than D / H); timm's Block needs a class, not a partial."""
    if head_dim is None:
        return Attention
    if head_dim not in _NARROW_ATTENTION:

        def init(self: Attention, dim: int, num_heads: int = 8, **kw: Any) -> None:
            Attention.__init__(self, dim, num_heads, attn_head_dim=head_dim, **kw)

        _NARROW_ATTENTION[head_dim] = type(f"Attention{head_dim}", (Attention,), {"__init__": init})
    return _NARROW_ATTENTION[head_dim]


def _check_exit_blocks(blocks: Sequence[int] | None, depth: int) -> list[int]:
    if blocks is None:
        return list(range(1, depth + 1))
    out = [int(b) for b in blocks]
    if not out or any(b2 <= b1 for b1, b2 in zip(out, out[1:])) or out[0] < 1:
        raise ConfigError(
            f"model.params.exit_blocks must be increasing block indices in 1..{depth}, got {out}"
        )
    if out[-1] != depth:
        raise ConfigError(
            f"model.params.exit_blocks must end with the last block ({depth}): the final "
            f"classifier sits after it; got {out}"
        )
    return out


def _per_channel(v: float | Sequence[float], chans: int, key: str) -> tuple[float, ...]:
    vals = (float(v),) * chans if isinstance(v, int | float) else tuple(float(t) for t in v)
    if len(vals) == 1:
        vals = vals * chans
    if len(vals) != chans:
        raise ConfigError(f"model.params.{key} needs 1 or {chans} values, got {len(vals)}")
    return vals


# -- pretrained weights -----------------------------------------------------------------


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


def load_pretrained(
    model: EarlyExitViT, path: str | Path | None, hf_repo: str, download: bool | str = "auto"
) -> list[str]:
    """Load the trunk of ``model`` from ``path`` (a timm state dict: .pth/.pt/.bin or
    .safetensors) or, when ``path`` is None, from the Hugging Face cache of ``hf_repo``,
    downloaded there first when ``download`` allows it (:mod:`fedshield.models.pretrained`).

    The exit heads are new (the checkpoint has one classifier, after block 12), so they
    keep their fresh initialisation. Returns the checkpoint keys that were dropped.
    """
    from timm.models.vision_transformer import checkpoint_filter_fn

    file = resolve_weights(path, hf_repo, download)
    raw = read_state_dict(file)
    # timm's filter converts foreign layouts and resamples pos_embed to our grid.
    try:
        converted = checkpoint_filter_fn(raw, model.vit)
    except (RuntimeError, ValueError, KeyError) as err:
        raise DataError(f"{file}: not a timm ViT checkpoint for this model ({err})") from None
    # The trunk has `depth` blocks; exit_blocks only places the exits (it used to be cut to
    # the number of exits, a trunk with exits after [2, 4, 6] lost blocks 3..5).
    kept = truncate_vit_state_dict(converted, len(model.vit.blocks))
    load_exactly(model.vit, kept, file)
    return sorted(set(converted) - set(kept))


# -- registry -------------------------------------------------------------------------


class ExitOptions(Params):
    """The exit structure shared by both factories (ours and the baselines')."""

    exit_mode: ExitMode = Field(
        "stage",
        description="stage: one LN-linear head per exit (ours); recurrent: ReeFL's shared exit",
    )
    exit_blocks: list[int] | None = Field(
        None,
        description="1-based blocks followed by an exit, ending with the last block; "
        "None = every block (ScaleFL: [2, 3, 5, 6] for 6 blocks)",
    )
    exit_bottleneck: ExitBottleneck = Field(
        "none", description="depthfl: L − e token bottleneck layers before shallow exit e"
    )
    bottleneck_ratio: float = Field(
        0.25, gt=0.0, le=4.0, description="hidden width / D of a DepthFL bottleneck layer"
    )
    ree_heads: int = Field(1, ge=1, description="attention heads of ReeFL's shared exit")
    ree_attn_dim: int = Field(16, ge=1, description="inner attention width of ReeFL's exit")
    ree_mlp_ratio: float = Field(2.0, gt=0.0, description="MLP ratio of ReeFL's exit")
    ree_steps: int = Field(1, ge=1, description="recurrent steps of ReeFL's exit layer")
    ree_modulation: bool = Field(
        True, description="ReeFL's exit output replaces the class token of the next block"
    )
    drop_path_rate: float = Field(0.0, ge=0.0, lt=1.0, description="stochastic depth (timm)")
    pretrained: bool = Field(
        False, description="load the trunk from the Hugging Face cache (see pretrained_download)"
    )
    pretrained_path: str | None = Field(
        None, description="a timm state dict (.pth/.pt/.bin/.safetensors) for the trunk"
    )
    pretrained_download: StrictBool | Literal["auto"] = Field(
        "auto",
        description="weights not in the cache: auto/true download them from the Hub (a clear "
        "error without network), false never does (the error says how to fill the cache)",
    )


class EeViTParams(ExitOptions):
    hf_repo: str = Field(PAPER_HF_REPO, description="Hugging Face repo of the weights")
    img_size: int | None = Field(None, ge=1, description="model resolution; None = input's")
    patch_size: int = Field(4, ge=1, description="must divide img_size")
    embed_dim: int = Field(96, ge=1, description="token width D")
    depth: int = Field(6, ge=1, description="number of blocks L")
    num_heads: int = Field(3, ge=1, description="attention heads (divides embed_dim)")
    mlp_ratio: float = Field(4.0, gt=0.0, description="block MLP hidden width / D")
    in_chans: int | None = Field(None, ge=1, description="stem channels; None = input's")
    mean: float | list[float] = Field(0.5, description="input normalisation mean (per channel)")
    std: float | list[float] = Field(0.5, description="input normalisation std (per channel)")


class EeViTSmallParams(ExitOptions):
    depth: int = Field(6, ge=1, le=12, description="first blocks of ViT-S/16 kept (paper: 6)")
    img_size: int = Field(224, ge=16, description="model resolution (bicubic resize)")


_MODEL_TAGS = ["family=multi_exit|width"]


@MODELS.register("eevit", schema=EeViTParams, tags=_MODEL_TAGS)
def eevit(input_shape: tuple[int, int, int], num_classes: int, **params: Any) -> EarlyExitViT:
    """Builds a multi-exit ViT of any size from timm blocks, with one exit per block by
    default (early-exit ViT paper).

    Defaults: the CPU model (patch 4, dim 96, 3 heads, 6 blocks) at the input resolution;
    ``patch_size`` must divide ``img_size``. The exit options select the baselines' exit
    structures (ReeFL's recurrent exit, DepthFL's bottlenecks, ScaleFL's placement)."""
    p = parse_params(EeViTParams, params, "model.params").kwargs()
    pretrained, path, repo = p.pop("pretrained"), p.pop("pretrained_path"), p.pop("hf_repo")
    download = p.pop("pretrained_download")
    if isinstance(p["mean"], list):
        p["mean"] = tuple(p["mean"])
    if isinstance(p["std"], list):
        p["std"] = tuple(p["std"])
    model = EarlyExitViT(input_shape=input_shape, num_classes=num_classes, **p)
    if pretrained or path is not None:
        load_pretrained(model, path, repo, download)
    return model


@MODELS.register("eevit_small", schema=EeViTSmallParams, tags=_MODEL_TAGS)
def eevit_small(input_shape: tuple[int, int, int], num_classes: int, **params: Any) -> EarlyExitViT:
    """Builds the paper's multi-exit model, the first six blocks of ViT-S/16 (dim 384,
    6 heads) at 224×224 with AugReg normalisation (early-exit ViT paper, Sec. IV).

    Random init unless ``pretrained`` (the Hugging Face cache, downloaded there when
    ``pretrained_download`` allows it) or ``pretrained_path`` is set (the paper starts from timm's
    ViT-S/16 weights, Sec. IV); the paper presets set ``pretrained = true``, which fails with a
    clear error saying how to fill the cache when the weights are neither cached nor
    downloadable."""
    p = parse_params(EeViTSmallParams, params, "model.params").kwargs()
    mean, std = _AUGREG_MEAN_STD
    return eevit(
        input_shape,
        num_classes,
        hf_repo=PAPER_HF_REPO,
        patch_size=16,
        embed_dim=384,
        num_heads=6,
        mlp_ratio=4.0,
        in_chans=3,
        mean=mean,
        std=std,
        **p,
    )


def prefix_bytes(model: nn.Module, mask: Tensor | None, num_buffers: int = 0) -> int:
    """Serialized size of the active prefix (raw tensor bytes, protocol overhead excluded)."""
    elem = next(model.parameters()).element_size()
    count = sum(p.numel() for p in model.parameters()) if mask is None else int(mask.sum())
    return (count + num_buffers) * elem


__all__ = [
    "PAPER_CHECKPOINT",
    "EarlyExitViT",
    "EeViTParams",
    "EeViTSmallParams",
    "ExitHead",
    "ReeExit",
    "TokenBottleneck",
    "eevit",
    "eevit_small",
    "load_pretrained",
    "prefix_bytes",
    "scalefl_exit_blocks",
    "truncate_vit_state_dict",
]
