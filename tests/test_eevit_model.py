"""Multi-exit ViT (early-exit ViT paper): exits, subnets and their bytes, routed inference,
pretrained weights (state dict round trip, 6-block truncation, offline HF cache, clear errors)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from timm.models.vision_transformer import VisionTransformer

from fedshield.core.flat import get_params
from fedshield.errors import ConfigError, DataError
from fedshield.models import MODELS, build_model
from fedshield.models.eevit import (
    PAPER_HF_REPO,
    EarlyExitViT,
    eevit_small,
    prefix_bytes,
    truncate_vit_state_dict,
)
from fedshield.routing import route


def tiny(shape=(1, 8, 8), **kw) -> EarlyExitViT:
    torch.manual_seed(0)
    args = {"patch_size": 2, "embed_dim": 32, "num_heads": 2, "depth": 4, **kw}
    return build_model("eevit", shape, 10, **args)


@pytest.mark.parametrize(
    ("shape", "patch"), [((1, 28, 28), 7), ((1, 28, 28), 4), ((1, 8, 8), 2), ((3, 32, 32), 4)]
)
def test_exits_on_bundled_shapes(shape, patch) -> None:
    m = tiny(shape, patch_size=patch).eval()
    x = torch.rand(3, *shape)
    exits = m.forward_exits(x)
    assert len(exits) == m.num_exits == 4
    assert all(z.shape == (3, 10) for z in exits)
    torch.testing.assert_close(m(x), exits[-1])  # forward = deepest exit
    assert len(m.forward_exits(x, depth=2)) == 2
    torch.testing.assert_close(m.forward_exits(x, depth=2)[1], exits[1])


def test_exit_representation_is_ln_of_cls_and_patch_mean() -> None:
    m = tiny().eval()
    x = torch.rand(2, 1, 8, 8)
    z = m.vit.blocks[0](m.stem(x))
    u = (z[:, 0] + z[:, 1:].mean(1)) / 2  # early-exit ViT paper: u_e = LN((z_cls + mean_j z_j) / 2)
    expected = m.exits[0].fc(torch.nn.functional.layer_norm(u, (32,), *_ln(m.exits[0].norm)))
    torch.testing.assert_close(m.forward_exits(x, 1)[0], expected)


def _ln(norm):
    return norm.weight, norm.bias, norm.eps


def test_grey_input_through_rgb_stem_and_resize() -> None:
    m = tiny((1, 28, 28), in_chans=3, img_size=32, patch_size=8).eval()
    assert m.vit.patch_embed.proj.in_channels == 3
    assert m(torch.rand(2, 1, 28, 28)).shape == (2, 10)


def test_bad_geometry_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match="patch_size"):
        tiny((1, 28, 28), patch_size=5)
    with pytest.raises(ConfigError, match="exit_mode"):
        tiny(exit_mode="shared")


def _module_numel(*modules) -> int:
    return sum(p.numel() for mod in modules for p in mod.parameters())


@pytest.mark.parametrize("m", [1, 2, 3, 4])
def test_subnet_of_depth_m_carries_exactly_its_prefix(m) -> None:
    model = tiny()
    v = model.vit
    stem = _module_numel(v.patch_embed) + v.cls_token.numel() + v.pos_embed.numel()
    prefix = stem + _module_numel(*v.blocks[:m], *model.exits[:m])
    mask = model.prefix_mask(m)
    assert int(mask.sum()) == prefix
    assert prefix_bytes(model, mask) == 4 * prefix  # float32
    # The mask marks exactly the parameters of those modules, in flat-vector order.
    for p in model.parameters():
        p.data.zero_()
    for _, p in model.prefix_parameters(m):
        p.data.fill_(1.0)
    assert torch.equal(get_params(model) == 1.0, mask)
    assert prefix_bytes(model, None) == 4 * sum(p.numel() for p in model.parameters())


def test_recurrent_exit_is_shared_and_always_covered() -> None:
    m = tiny(exit_mode="recurrent").eval()
    assert not hasattr(m, "exits")
    assert len(m.forward_exits(torch.rand(2, 1, 8, 8))) == 4
    shared = torch.cat([p.reshape(-1) for p in m.rexit.parameters()])
    for p in m.parameters():
        p.data.zero_()
    for p in m.rexit.parameters():
        p.data.fill_(1.0)
    # Depth 1 already holds the whole shared exit.
    assert bool(m.prefix_mask(1)[get_params(m) == 1.0].all())
    assert int((get_params(m) == 1.0).sum()) == shared.numel()


_STRUCTURES = {
    "stage": {},
    "recurrent": {"exit_mode": "recurrent"},
    "bottleneck": {"exit_bottleneck": "depthfl"},
    "placement": {"exit_blocks": [2, 4]},
}


@pytest.mark.parametrize("structure", list(_STRUCTURES))
@pytest.mark.parametrize("policy", ["fixed", "robust", "client_robust"])
def test_routed_inference_matches_route_on_all_exits(structure, policy) -> None:
    m = tiny(**_STRUCTURES[structure]).eval()
    # Sharpen the heads so that some samples leave early and some go deep.
    for p in m.parameters():
        p.data.mul_(3.0)
    x = torch.rand(64, 1, 8, 8)
    with torch.no_grad():
        probs = torch.stack([z.softmax(-1) for z in m.forward_exits(x)])
    score = torch.rand(64)
    idx, pred = route(probs, policy, score)
    idx2, pred2 = m.forward_routed(x, policy, score)
    assert torch.equal(idx, idx2) and torch.equal(pred, pred2)


def test_exit_placement_runs_and_covers_the_blocks_up_to_each_exit() -> None:
    model = tiny(exit_blocks=[2, 4])  # exits after blocks 2 and 4 of 4
    x = torch.rand(3, 1, 8, 8)
    assert model.num_exits == 2 and len(model.forward_exits(x)) == 2
    v = model.vit
    stem = _module_numel(v.patch_embed) + v.cls_token.numel() + v.pos_embed.numel()
    assert int(model.prefix_mask(1).sum()) == stem + _module_numel(*v.blocks[:2], model.exits[0])
    assert model.stage_of("vit.blocks.2.mlp.fc1.weight") == 2
    model.eval()
    z = v.blocks[1](v.blocks[0](model.stem(x)))
    torch.testing.assert_close(model.forward_exits(x, 1)[0], model.exits[0](model.summary(z)))
    for bad in ([2, 3], [3, 2, 4], [0, 4], []):
        with pytest.raises(ConfigError, match="exit_blocks"):
            tiny(exit_blocks=bad)


def _ree_manual(m: EarlyExitViT, x: torch.Tensor, modulate: bool) -> list[torch.Tensor]:
    """ReeFL's forward written out: CLS history → Ree → head(m_0 + cls_l); m_l → next CLS."""
    z, hist, out = m.stem(x), [], []
    for blk in m.vit.blocks:
        z = blk(z)
        hist.append(z[:, 0])
        r = m.rexit(torch.stack(hist, 1))
        out.append(m.rexit.head(r[:, 0] + hist[-1]))
        if modulate:
            z = torch.cat([r[:, -1:], z[:, 1:]], 1)
    return out


@pytest.mark.parametrize("modulate", [True, False])
def test_recurrent_exit_reads_the_class_tokens_and_modulates_the_trunk(modulate) -> None:
    m = tiny(exit_mode="recurrent", ree_modulation=modulate).eval()
    x = torch.rand(2, 1, 8, 8)
    with torch.no_grad():
        got = m.forward_exits(x)
        for a, b in zip(got, _ree_manual(m, x, modulate)):
            torch.testing.assert_close(a, b)
        other = _ree_manual(m, x, not modulate)
    # Modulation changes what the deeper blocks see, never the first exit.
    torch.testing.assert_close(got[0], other[0])
    assert not torch.allclose(got[-1], other[-1])
    assert m.rexit.pos_embed.shape == (1, 5, 32)  # client token + 4 class tokens


def test_model_schema_tags_and_typos() -> None:
    for name in ("eevit", "eevit_small"):
        entry = MODELS.entry(name)
        assert entry.declared and entry.tag_values("family") == {"multi_exit", "width"}
        assert entry.help.startswith("Builds") and entry.help.endswith(".")
        assert all(f.description for f in entry.schema.model_fields.values())
    with pytest.raises(ConfigError, match="did you mean 'patch_size'"):
        tiny(patch_sise=2)
    with pytest.raises(ConfigError, match="model.params.exit_bottleneck"):
        tiny(exit_bottleneck="sepconv")
    small = eevit_small((3, 32, 32), 10, depth=2, img_size=32, exit_mode="recurrent")
    assert small.exit_mode == "recurrent" and small.num_exits == 2


# -- pretrained weights -------------------------------------------------------------------


def _timm_vit(depth: int = 8) -> VisionTransformer:
    torch.manual_seed(1)
    return VisionTransformer(
        img_size=16, patch_size=4, in_chans=3, num_classes=7, embed_dim=32, depth=depth,
        num_heads=2,
    )  # fmt: skip


def _assert_trunk_equal(model: EarlyExitViT, sd: dict, depth: int) -> None:
    ours = model.vit.state_dict()
    for key in ("cls_token", "pos_embed", "patch_embed.proj.weight"):
        torch.testing.assert_close(ours[key], sd[key])
    for b in range(depth):
        for key in ("attn.qkv.weight", "mlp.fc2.bias", "norm1.weight"):
            torch.testing.assert_close(ours[f"blocks.{b}.{key}"], sd[f"blocks.{b}.{key}"])


@pytest.mark.parametrize("suffix", [".pth", ".safetensors"])
def test_pretrained_state_dict_round_trip_with_truncation(tmp_path: Path, suffix) -> None:
    src = _timm_vit(depth=8)
    sd = src.state_dict()
    path = tmp_path / f"vit{suffix}"
    if suffix == ".safetensors":
        from safetensors.torch import save_file

        save_file({k: v.contiguous() for k, v in sd.items()}, str(path))
    else:
        torch.save({"model": sd}, path)  # a wrapped checkpoint is unwrapped
    m = build_model(
        "eevit", (3, 16, 16), 10, patch_size=4, embed_dim=32, num_heads=2, depth=6,
        pretrained_path=str(path),
    )  # fmt: skip
    _assert_trunk_equal(m, sd, 6)
    trunc = truncate_vit_state_dict(sd, 6)
    assert "blocks.5.mlp.fc1.weight" in trunc and "blocks.6.mlp.fc1.weight" not in trunc
    assert not any(k.startswith(("norm.", "head.")) for k in trunc)


def test_paper_model_from_a_vit_small_state_dict(tmp_path: Path) -> None:
    torch.manual_seed(2)
    src = VisionTransformer(
        patch_size=16, embed_dim=384, depth=12, num_heads=6, num_classes=1000
    )  # ViT-S/16's architecture (random weights; no network here)
    sd = src.state_dict()
    torch.save(sd, tmp_path / "vit_s16.pth")
    m = eevit_small((3, 32, 32), 100, pretrained_path=str(tmp_path / "vit_s16.pth"))
    assert m.num_exits == 6 and m.img_size == 224 and len(m.vit.blocks) == 6
    _assert_trunk_equal(m, sd, 6)
    assert m(torch.rand(1, 3, 32, 32)).shape == (1, 100)  # CIFAR → bicubic 224


def test_pretrained_from_offline_hf_cache(tmp_path: Path, monkeypatch) -> None:
    from huggingface_hub import constants
    from safetensors.torch import save_file

    sd = _timm_vit(depth=6).state_dict()
    repo = tmp_path / ("models--" + PAPER_HF_REPO.replace("/", "--"))
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text("abc123")
    snap = repo / "snapshots" / "abc123"
    snap.mkdir(parents=True)
    save_file({k: v.contiguous() for k, v in sd.items()}, str(snap / "model.safetensors"))
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path))
    m = build_model(
        "eevit", (3, 16, 16), 10, patch_size=4, embed_dim=32, num_heads=2, depth=6,
        pretrained=True,
    )  # fmt: skip
    _assert_trunk_equal(m, sd, 6)


def test_missing_weights_are_clear_errors(tmp_path: Path, monkeypatch) -> None:
    from huggingface_hub import constants

    with pytest.raises(DataError, match="nope.pth not found"):
        eevit_small((3, 32, 32), 10, pretrained_path=str(tmp_path / "nope.pth"))
    (tmp_path / "bad.pth").write_text("not a checkpoint")
    with pytest.raises(DataError, match="bad.pth: cannot read a state dict"):
        eevit_small((3, 32, 32), 10, pretrained_path=str(tmp_path / "bad.pth"))
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "empty"))
    with pytest.raises(DataError, match="vit_small_patch16_224.augreg_in21k_ft_in1k.*empty"):
        eevit_small((3, 32, 32), 10, pretrained=True, pretrained_download=False)
    # Without pretrained weights the same architecture starts from random init.
    assert eevit_small((3, 32, 32), 10, pretrained=False, depth=1).num_exits == 1


def test_pretrained_trunk_keeps_depth_blocks_with_exit_blocks(tmp_path: Path) -> None:
    """With exit_blocks the trunk was cut to the number of exits (3), not depth
    (6): "Missing keys blocks.3..." for a checkpoint that has every block."""
    sd = _timm_vit(depth=8).state_dict()
    torch.save(sd, tmp_path / "vit.pth")
    m = build_model(
        "eevit", (3, 16, 16), 10, patch_size=4, embed_dim=32, num_heads=2, depth=6,
        exit_blocks=[2, 4, 6], pretrained_path=str(tmp_path / "vit.pth"),
    )  # fmt: skip
    assert m.num_exits == 3 and len(m.vit.blocks) == 6
    _assert_trunk_equal(m, sd, 6)


def test_a_checkpoint_that_does_not_fit_is_one_line_naming_the_key(tmp_path: Path) -> None:
    """A shape mismatch printed load_state_dict's 77-line error."""
    torch.manual_seed(1)
    other = VisionTransformer(
        img_size=16, patch_size=4, in_chans=3, num_classes=7, embed_dim=32, depth=6,
        num_heads=2, mlp_ratio=2.0,
    )  # fmt: skip
    torch.save(other.state_dict(), tmp_path / "narrow.pth")
    with pytest.raises(DataError) as err:
        build_model(
            "eevit", (3, 16, 16), 10, patch_size=4, embed_dim=32, num_heads=2, depth=6,
            pretrained_path=str(tmp_path / "narrow.pth"),
        )  # fmt: skip
    text = str(err.value)
    assert "\n" not in text, text
    want = "blocks.0.mlp.fc1.weight has shape (64, 32) in the checkpoint, (128, 32) in the model"
    assert want in text, text
    assert "(and 17 more keys)" in text, text  # fc1.weight/bias, fc2.weight of 6 blocks
    torch.save(_timm_vit(depth=4).state_dict(), tmp_path / "shallow.pth")
    with pytest.raises(DataError, match=r"lacks the model's blocks\.4\.\S+ \(and \d+ more\)$"):
        build_model(
            "eevit", (3, 16, 16), 10, patch_size=4, embed_dim=32, num_heads=2, depth=6,
            pretrained_path=str(tmp_path / "shallow.pth"),
        )  # fmt: skip
