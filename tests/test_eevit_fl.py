"""Depth-heterogeneous FL on the multi-exit ViT (early-exit ViT paper): the local loss,
coverage-aware aggregation (eq. 15), prefix communication (eq. 16), baselines, and an end-to-end
run."""

from __future__ import annotations

import json
import math

import pytest
import torch
import torch.nn.functional as F

from fedshield import config
from fedshield.aggregators.mean import Mean
from fedshield.algorithms.client.base import ClientContext, ClientRound, LocalSpec
from fedshield.algorithms.client.multi_exit import (
    DepthFL,
    DepthFLParams,
    MultiExit,
    MultiExitParams,
    ReeFL,
    ReeFLParams,
    best_exit,
    exit_weights,
    kd_rampup,
    kd_term,
    multi_exit_loss,
)
from fedshield.algorithms.client.width import (
    FullWidthLayerNorm,
    HeteroFL,
    HeteroFLParams,
    ScaleFL,
    ScaleFLParams,
    attach_scaler,
    class_mask_logits,
    narrow_arch,
    narrow_model,
    width_index,
)
from fedshield.algorithms.server import ServerRound
from fedshield.algorithms.server.fedavg import FedAvg, coverage_mean
from fedshield.core.context import ClientUpdate, Payload, RoundContext
from fedshield.core.flat import get_buffers, get_params, param_slices, set_params
from fedshield.data.bundle import TensorData
from fedshield.errors import ConfigError
from fedshield.models import build_model
from fedshield.models.eevit import scalefl_exit_blocks
from fedshield.sim.builder import build
from fedshield.sim.engine import Simulator

# -- the local loss (early-exit ViT paper, worked examples) ----------------------------------------


def test_exit_weights_worked_examples() -> None:
    # m = 3: r = (1, 2, 2·3) → (1, 2, 6) / 9
    torch.testing.assert_close(exit_weights(3), torch.tensor([1, 2, 6], dtype=torch.float64) / 9)
    # m = 4: r = (1, 2, 3, 8) / 14;  m = 1: r_1 = 2 → weight 1
    torch.testing.assert_close(
        exit_weights(4), torch.tensor([1, 2, 3, 8.0], dtype=torch.float64) / 14
    )
    torch.testing.assert_close(exit_weights(1), torch.ones(1, dtype=torch.float64))
    torch.testing.assert_close(
        exit_weights(4, "uniform"), torch.full((4,), 0.25, dtype=torch.float64)
    )
    torch.testing.assert_close(
        exit_weights(3, "last"), torch.tensor([0, 0, 1.0], dtype=torch.float64)
    )


def test_multi_exit_loss_worked_example() -> None:
    torch.manual_seed(0)
    logits = [torch.randn(5, 4) for _ in range(3)]
    y = torch.tensor([0, 1, 2, 3, 0])
    loss, parts = multi_exit_loss(logits, y, gamma=0.1, temperature=3.0)
    ce = [F.cross_entropy(z, y) for z in logits]
    sup = (1 * ce[0] + 2 * ce[1] + 6 * ce[2]) / 9

    def kl(student, teacher, t=3.0):  # T² KL(p_teacher^T ‖ p_student^T), per-sample mean
        p, q = (teacher / t).softmax(-1), (student / t).softmax(-1)
        return t * t * (p * (p.log() - q.log())).sum(-1).mean()

    kd = (kl(logits[0], logits[2]) + kl(logits[1], logits[2])) / 2  # 1/(m−1) Σ_{e<m}
    torch.testing.assert_close(loss, sup + 0.1 * kd)
    assert parts["train/loss_sup"] == pytest.approx(float(sup))
    assert parts["train/loss_kd"] == pytest.approx(float(kd))


def test_single_exit_has_no_kd_and_plain_ce() -> None:
    z = torch.randn(6, 3)
    y = torch.randint(0, 3, (6,))
    loss, parts = multi_exit_loss([z], y)
    torch.testing.assert_close(loss, F.cross_entropy(z, y))
    assert parts["train/loss_kd"] == 0.0


def test_kd_teacher_is_detached_and_soft_labels() -> None:
    s, t = torch.randn(4, 5, requires_grad=True), torch.randn(4, 5, requires_grad=True)
    kd_term(s, t, 3.0).backward()
    assert t.grad is None and s.grad is not None
    assert float(kd_term(t.detach(), t.detach(), 3.0)) == pytest.approx(0.0, abs=1e-6)
    # Soft-label CE (MixUp/CutMix targets) equals CE for one-hot targets.
    y = torch.tensor([1, 0, 4, 2])
    logits = [torch.randn(4, 5)]
    hard, _ = multi_exit_loss(logits, y, kd="none")
    soft, _ = multi_exit_loss(logits, F.one_hot(y, 5).float(), kd="none")
    torch.testing.assert_close(hard, soft)


def test_depthfl_mutual_kd_is_the_pairwise_mean() -> None:
    logits = [torch.randn(3, 4) for _ in range(3)]
    y = torch.tensor([0, 1, 2])
    loss, _ = multi_exit_loss(logits, y, weights="uniform", kd="mutual", gamma=1.0, temperature=1.0)
    pairs = [kd_term(logits[i], logits[j], 1.0) for i in range(3) for j in range(3) if i != j]
    ce = sum(F.cross_entropy(z, y) for z in logits) / 3
    torch.testing.assert_close(loss, ce + sum(pairs) / 6)


# -- coverage-aware aggregation (eq. 15) --------------------------------------------------


def _upd(k: int, delta: torch.Tensor, n: int, mask: torch.Tensor | None) -> ClientUpdate:
    return ClientUpdate(k, delta, n, torch.zeros(0), mask=mask)


def _server_step(updates: list[ClientUpdate], params: torch.Tensor) -> torch.Tensor:
    ctx = RoundContext(1, tuple(range(len(updates))), (), 0, len(updates), torch.device("cpu"))
    step = FedAvg(Mean()).update(ServerRound(params, torch.zeros(0), {}, updates, ctx))
    return step.params


def test_coverage_mean_equals_fedavg_when_everything_is_covered() -> None:
    torch.manual_seed(0)
    params = torch.randn(7)
    deltas = torch.randn(3, 7)
    n = [10, 30, 60]
    full = torch.ones(7, dtype=torch.bool)
    with_masks = _server_step([_upd(k, deltas[k], n[k], full) for k in range(3)], params)
    plain = _server_step([_upd(k, deltas[k], n[k], None) for k in range(3)], params)
    fedavg = params + (torch.tensor(n, dtype=torch.float32)[:, None] * deltas).sum(0) / 100
    torch.testing.assert_close(with_masks, fedavg)
    torch.testing.assert_close(plain, fedavg)


def test_coverage_mean_averages_over_holders_and_keeps_uncovered() -> None:
    params = torch.tensor([1.0, 2.0, 3.0, 4.0])
    # θ_{i,k} = θ_i + g_{i,k}: client 0 (n = 1) covers entries 0–1, client 1 (n = 3) covers
    # entries 0 and 2; nobody covers entry 3.
    d0, d1 = torch.tensor([4.0, 8.0, 0.0, 0.0]), torch.tensor([8.0, 0.0, 12.0, 0.0])
    m0 = torch.tensor([True, True, False, False])
    m1 = torch.tensor([True, False, True, False])
    new = _server_step([_upd(0, d0, 1, m0), _upd(1, d1, 3, m1)], params)
    expected = torch.tensor([1 + (1 * 4 + 3 * 8) / 4, 2 + 8, 3 + 12, 4.0])  # eq. 15 per entry
    torch.testing.assert_close(new, expected)
    assert new[3] == params[3]  # K_i empty ⇒ previous global value retained
    # The same from the bare function, uniform weighting.
    agg = coverage_mean(torch.stack([d0, d1]), None, torch.stack([m0, m1]))
    torch.testing.assert_close(agg, torch.tensor([6.0, 8.0, 12.0, 0.0]))


# -- depth-limited clients ------------------------------------------------------------------


def _tiny_model(**kw):
    torch.manual_seed(0)
    args = {"patch_size": 2, "embed_dim": 32, "num_heads": 2, "depth": 4, **kw}
    return build_model("eevit", (1, 8, 8), 10, **args)


def _data(n: int = 24) -> TensorData:
    g = torch.Generator().manual_seed(0)
    return TensorData(torch.rand(n, 1, 8, 8, generator=g), torch.randint(0, 10, (n,), generator=g))


def _train(client, model, k: int, steps: int = 2) -> ClientUpdate:
    params, buffers = get_params(model), get_buffers(model)
    ctx = ClientContext(k, 1, torch.Generator().manual_seed(k), torch.device("cpu"))
    return client.local_update(model, ClientRound(Payload(params, buffers), _data(), {}, ctx))


def test_depth_tiers_are_cycled_and_updates_stay_in_the_prefix() -> None:
    model = _tiny_model()
    spec = LocalSpec(lr=1e-3, batch_size=8, steps=2, weight_decay=0.05)
    client = MultiExit(spec, MultiExitParams(depths=[1, 3]))
    assert [client.depth_for(k, 4) for k in range(4)] == [1, 3, 1, 3]
    start = get_params(model).clone()
    for k, m in ((0, 1), (1, 3)):
        upd = _train(client, model, k)
        mask = model.prefix_mask(m)
        assert torch.equal(upd.mask, mask)
        # AdamW's weight decay must not touch what the client does not train.
        assert torch.all(upd.delta[~mask] == 0) and torch.any(upd.delta[mask] != 0)
        assert upd.metrics["comm/bytes"] == 4 * int(mask.sum())
        assert upd.metrics["client/depth"] == m
        set_params(model, start)
    with pytest.raises(ConfigError, match="outside 1..4"):
        _train(MultiExit(spec, MultiExitParams(depths=[5])), model, 0)


def test_full_depth_client_sends_no_mask_so_robust_rules_still_apply() -> None:
    model = _tiny_model()
    upd = _train(MultiExit(LocalSpec(lr=1e-3, batch_size=8, steps=1)), model, 0)
    assert upd.mask is None
    assert upd.metrics["comm/bytes"] == 4 * get_params(model).numel()


def test_width_subnet_slices_and_scatters_back_in_both_slicings() -> None:
    model = _tiny_model(num_heads=4, embed_dim=32)  # 4 heads of 8 channels
    qkv = dict(model.named_parameters())["vit.blocks.0.attn.qkv.weight"]  # [3·32, 32]
    # "heads": the first two whole heads of q, k, v (HeteroFL's channels/heads).
    sub = narrow_model(model, 0.5, "heads")
    assert (sub.num_features, sub.num_heads, sub.head_dim) == (16, 2, 8)
    index = width_index(model, sub)
    assert index.unique().numel() == index.numel() == get_params(sub).numel()
    set_params(sub, get_params(model)[index])
    sub_qkv = sub.vit.blocks[0].attn.qkv.weight  # [3·16, 16]
    for j in range(3):
        torch.testing.assert_close(sub_qkv[16 * j : 16 * (j + 1)], qkv[32 * j : 32 * j + 16, :16])
    # "head_dim" (HeteroFL's / ScaleFL's transformers): all four heads, each narrowed to 4.
    sub = narrow_model(model, 0.5)
    assert (sub.num_features, sub.num_heads, sub.head_dim) == (16, 4, 4)
    index = width_index(model, sub)
    assert index.unique().numel() == index.numel() == get_params(sub).numel()
    set_params(sub, get_params(model)[index])
    sub_qkv = sub.vit.blocks[0].attn.qkv.weight.view(3, 4, 4, 16)
    torch.testing.assert_close(sub_qkv, qkv.view(3, 4, 8, 32)[:, :, :4, :16])
    proj = dict(model.named_parameters())["vit.blocks.0.attn.proj.weight"].view(32, 4, 8)
    torch.testing.assert_close(sub.vit.blocks[0].attn.proj.weight.view(16, 4, 4), proj[:16, :, :4])
    assert sub.vit.blocks[0].mlp.fc1.weight.shape == (64, 16)  # ⌈0.5 · 128⌉ hidden units
    # ScaleFL rounds down per head: ⌊0.7 · 8⌋ = 5 channels per head, D′ = 4 · 5.
    arch = narrow_arch(model, 0.7, "head_dim", math.floor)
    assert (arch["embed_dim"], arch["attn_head_dim"], arch["mlp_hidden"]) == (20, 5, 89)
    # A client scatters its update back and covers exactly the entries it holds.
    params = HeteroFLParams(widths=[0.5, 1.0], masked_ce=False, class_rows="all")
    client = HeteroFL(LocalSpec(lr=1e-3, batch_size=8, steps=2), params)
    upd = _train(client, model, 0)
    idx = width_index(model, narrow_model(model, 0.5))
    head_rows = [  # HeteroFL trains the last exit only: the other heads are not uploaded
        i for n, s in param_slices(model).items() if n.startswith("exits.") and not
        n.startswith("exits.3.") for i in range(s.start, s.stop)
    ]  # fmt: skip
    expected = torch.zeros_like(upd.mask)
    expected[idx] = True
    expected[head_rows] = False
    assert torch.equal(upd.mask, expected)
    assert torch.all(upd.delta[~upd.mask] == 0) and torch.any(upd.delta[upd.mask] != 0)
    assert upd.metrics["comm/bytes"] == 4 * int(expected.sum())


# -- HeteroFL: scaler, masked cross-entropy, normalisation ---------------------------------


def test_heterofl_masked_ce_ignores_absent_classes() -> None:
    torch.manual_seed(0)
    logits = torch.randn(6, 5, requires_grad=True)
    y = torch.tensor([0, 2, 2, 0, 3, 0])
    present = torch.bincount(y, minlength=5) > 0  # classes 1 and 4 are absent
    masked = class_mask_logits(logits, present)
    loss = F.cross_entropy(masked, y)
    loss.backward()
    assert torch.all(logits.grad[:, ~present] == 0) and torch.all(logits.grad[:, present] != 0)
    # Absent classes enter as the constant 0 (HeteroFL's masked_fill(…, 0)): the loss is
    # CE over the present logits plus exp(0) per absent class in the partition function.
    z = logits.detach()
    lse = torch.logsumexp(torch.cat([z[:, present], torch.zeros(6, 2)], 1), 1)
    torch.testing.assert_close(loss.detach(), (lse - z[torch.arange(6), y]).mean())


def test_heterofl_classifier_rows_of_absent_classes() -> None:
    model = _tiny_model()
    g = torch.Generator().manual_seed(1)
    data = TensorData(torch.rand(16, 1, 8, 8, generator=g), torch.tensor([0, 1, 2] * 5 + [0]))
    counts = data.class_counts(10)
    spec = LocalSpec(lr=1e-2, batch_size=8, steps=3, weight_decay=0.05)
    sl = param_slices(model)
    w, b = sl["exits.3.fc.weight"], sl["exits.3.fc.bias"]
    weight_rows = torch.arange(w.start, w.stop).view(10, 32)
    rows = torch.cat([weight_rows, torch.arange(b.start, b.stop)[:, None]], 1)  # row c, bias c

    def run(client):
        ctx = ClientContext(0, 1, torch.Generator().manual_seed(0), torch.device("cpu"))
        payload = Payload(get_params(model).clone(), get_buffers(model))
        return client.local_update(model, ClientRound(payload, data, {}, ctx))

    # "all": the tier's mask (the server predicts it), absent rows not updated.
    client = HeteroFL(spec, HeteroFLParams(widths=[1.0], class_rows="all"))
    upd = run(client)
    assert torch.equal(upd.mask, client.expected_mask(0, model))
    assert bool(upd.mask[rows].all())
    assert torch.all(upd.delta[rows[3:]] == 0) and torch.any(upd.delta[rows[:3]] != 0)
    # "holders" (the default, HeteroFL's combine): the rows of classes 3–9 leave the
    # client's coverage, so the server averages each row over the clients holding its class.
    client = HeteroFL(spec, HeteroFLParams(widths=[1.0]))
    upd = run(client)
    assert bool(upd.mask[rows[:3]].all()) and not bool(upd.mask[rows[3:]].any())
    assert torch.equal(upd.mask, client.expected_mask(0, model, counts))
    other = upd.mask.clone()
    other[rows[3:]] = True
    deltas = torch.stack([upd.delta, upd.delta + 1])
    agg = coverage_mean(deltas, None, torch.stack([upd.mask, other]))
    torch.testing.assert_close(agg[rows[4]], upd.delta[rows[4]] + 1)  # one holder
    torch.testing.assert_close(agg[rows[0]], upd.delta[rows[0]] + 0.5)  # two holders
    with pytest.raises(ConfigError, match="label counts"):
        client.expected_mask(0, model)


def test_heterofl_scaler_divides_by_the_rate_in_training_only() -> None:
    model = _tiny_model(num_heads=4)
    sub, plain = narrow_model(model, 0.25), narrow_model(model, 0.25)
    attach_scaler(sub, 0.25)
    plain.load_state_dict(sub.state_dict())
    seen: dict[str, list[torch.Tensor]] = {"sub": [], "plain": []}
    for key, net in (("sub", sub), ("plain", plain)):
        net.vit.blocks[1].mlp.fc1.register_forward_hook(lambda m, a, o, k=key: seen[k].append(o))
    x = torch.rand(3, 1, 8, 8)
    sub.eval(), plain.eval()
    torch.testing.assert_close(sub(x), plain(x))  # eval: the identity
    sub.train(), plain.train()
    z_sub, z_plain = sub.stem(x), plain.stem(x)
    torch.testing.assert_close(z_sub, z_plain / 0.25)  # the embedding is scaled
    blk_s, blk_p = sub.vit.blocks[0], plain.vit.blocks[0]
    h = blk_p.norm1(z_plain)
    torch.testing.assert_close(blk_s.attn.qkv(h), blk_p.attn.qkv(h) / 0.25)
    sub(x), plain(x)
    assert not torch.allclose(seen["sub"][-1], seen["plain"][-1])
    # The global model (rate 1) is never scaled, and the scaler is on by default.
    client = HeteroFL(LocalSpec(lr=1e-3, batch_size=8, steps=1), HeteroFLParams(widths=[0.5]))
    net = client.make_subnet(model, ClientContext(0, 1, torch.Generator(), torch.device("cpu")))
    net.model.train()
    xe = net.model.stem(x)
    net.model.eval()
    torch.testing.assert_close(xe, net.model.stem(x) / 0.5)


def test_full_width_layer_norm_is_layer_norm_of_the_zero_padded_vector() -> None:
    torch.manual_seed(0)
    ln = FullWidthLayerNorm(5, 8)
    ln.weight.data.uniform_(0.5, 1.5), ln.bias.data.normal_()
    x = torch.randn(4, 3, 5)
    padded = torch.cat([x, torch.zeros(4, 3, 3)], -1)
    ref = F.layer_norm(padded, (8,), eps=ln.eps)[..., :5] * ln.weight + ln.bias
    torch.testing.assert_close(ln(x), ref)
    sub = narrow_model(_tiny_model(), 0.5, norm="full")
    norms = [m for m in sub.modules() if isinstance(m, torch.nn.LayerNorm)]
    assert norms and all(isinstance(m, FullWidthLayerNorm) and m.full_dim == 32 for m in norms)
    assert not any(
        isinstance(m, FullWidthLayerNorm) for m in narrow_model(_tiny_model(), 0.5).modules()
    )


# -- DepthFL: bottleneck classifiers, mutual distillation ----------------------------------


def test_depthfl_bottleneck_classifiers_exist_and_train() -> None:
    model = _tiny_model(exit_bottleneck="depthfl")  # L = 4 exits
    assert [len(b) for b in model.bottlenecks] == [3, 2, 1, 0]  # exit e has L − e layers
    # The exit reads its bottlenecked tokens: head(summary(B_e(z_e))).
    x = torch.rand(2, 1, 8, 8)
    model.eval()
    z = model.vit.blocks[0](model.stem(x))
    expected = model.exits[0](model.summary(model.bottlenecks[0](z)))
    torch.testing.assert_close(model.forward_exits(x, 1)[0], expected)
    spec = LocalSpec(lr=1e-3, batch_size=8, steps=2)
    upd = _train(DepthFL(spec, DepthFLParams(depths=[2])), model, 0)
    sl = param_slices(model)
    for name, s in sl.items():
        if name.startswith("bottlenecks."):
            e = int(name.split(".")[1]) + 1
            covered = bool(upd.mask[s].all())
            assert covered == (e <= 2), name  # exits 1–2 are in the depth-2 subnet
            assert bool((upd.delta[s] != 0).any()) == (e <= 2), name
    assert upd.metrics["train/loss_kd"] > 0 and math.isfinite(upd.metrics["train/loss"])
    with pytest.raises(ConfigError, match="exit_bottleneck = 'depthfl'"):
        _train(DepthFL(spec), _tiny_model(), 0)


def test_depthfl_loss_is_the_sum_of_ce_and_mutual_kd() -> None:
    torch.manual_seed(0)
    logits = [torch.randn(4, 5) for _ in range(3)]
    y = torch.tensor([0, 1, 2, 3])
    loss, _ = multi_exit_loss(logits, y, weights="sum", kd="mutual", gamma=0.7, temperature=1.0)
    ce = sum(F.cross_entropy(z, y) for z in logits)  # Σ_i ℓ_i (DepthFL adds the losses)
    kd = sum(kd_term(logits[i], logits[j], 1.0) / 2 for i in range(3) for j in range(3) if i != j)
    torch.testing.assert_close(loss, ce + 0.7 * kd)
    # The consistency weight ramps up as exp(−5(1 − t/R)²) (DepthFL: R = 300 rounds).
    assert kd_rampup(1, 300) == pytest.approx(math.exp(-5))
    assert kd_rampup(151, 300) == pytest.approx(math.exp(-1.25))
    assert kd_rampup(301, 300) == kd_rampup(900, 300) == 1.0
    client = DepthFL(LocalSpec(lr=1e-3, batch_size=8), DepthFLParams(schedule_rounds=100))
    assert client.kd_weight_at(1) == pytest.approx(math.exp(-5))  # R = 0.3 · 100
    assert client.kd_weight_at(31) == 1.0


# -- ScaleFL: exit placement, depth-weighted exits, KD from the last exit --------------------


def test_scalefl_loss_matches_its_official_form() -> None:
    torch.manual_seed(0)
    logits = [torch.randn(5, 4, requires_grad=True) for _ in range(3)]
    y = torch.tensor([0, 1, 2, 3, 0])
    loss, _ = multi_exit_loss(
        logits, y, weights="proportional", kd="deepest_weighted", gamma=0.5, temperature=3.0,
        detach_teacher=False,
    )  # fmt: skip

    def kl(s, t, temp=3.0):
        p, q = (t / temp).softmax(-1), (s / temp).softmax(-1)
        return temp * temp * (p * (p.log() - q.log())).sum(-1).mean()

    ce = [F.cross_entropy(z, y) for z in logits]
    # [Σ_{j<m} j (ℓ_j + γ T² KL(p_m ‖ p_j)) + m ℓ_m] / (m(m+1)/2), m = 3
    kd = [0.5 * kl(logits[j], logits[2]) for j in range(2)]
    ref = (1 * (ce[0] + kd[0]) + 2 * (ce[1] + kd[1]) + 3 * ce[2]) / 6
    torch.testing.assert_close(loss, ref)
    # ScaleFL's teacher is not detached: the KD term also moves the last exit.
    kd_only, _ = multi_exit_loss(
        logits, y, weights="proportional", kd="deepest_weighted", gamma=1.0, detach_teacher=False
    )
    grad_with = torch.autograd.grad(kd_only, logits[2])[0]
    grad_ce = torch.autograd.grad(ce[2] * 3 / 6, logits[2])[0]
    assert not torch.allclose(grad_with, grad_ce)
    # KD is off during the first quarter of the round budget.
    client = ScaleFL(LocalSpec(lr=1e-3, batch_size=8), ScaleFLParams(schedule_rounds=20))
    assert [client.kd_weight_at(t) for t in (1, 5, 6)] == [0.0, 0.0, 1.0]


def test_scalefl_needs_its_exit_placement_and_trains_width_and_depth_tiers() -> None:
    assert scalefl_exit_blocks(6) == [2, 3, 5, 6] and scalefl_exit_blocks(12) == [4, 6, 9, 12]
    spec = LocalSpec(lr=1e-3, batch_size=8, steps=2)
    with pytest.raises(ConfigError, match=r"exit_blocks = \[2, 3, 5, 6\]"):
        _train(ScaleFL(spec), _tiny_model(depth=6), 0)
    model = _tiny_model(depth=6, exit_blocks=[2, 3, 5, 6])
    assert model.num_exits == 4 and len(model.exits) == 4
    client = ScaleFL(spec)  # official tiers: (0.7, 1 exit), (0.7, 2), (0.75, 3), (1.0, 4)
    upd = _train(client, model, 0)
    sl = param_slices(model)
    covered = {n for n, s in sl.items() if bool(upd.mask[s].any())}
    assert {n.split(".")[2] for n in covered if n.startswith("vit.blocks.")} == {"0", "1"}
    assert {n.split(".")[1] for n in covered if n.startswith("exits.")} == {"0"}
    assert upd.metrics["client/depth"] == 1
    sub = narrow_model(model, 0.7, rounding=math.floor)
    assert int(upd.mask.sum()) == int(sub.prefix_mask(1).sum())
    assert _train(client, model, 3).mask is None  # the full tier: width 1, all 4 exits
    upd = _train(client, model, 2)
    assert upd.metrics["client/depth"] == 3 and upd.metrics["train/loss_kd"] > 0


# -- ReeFL: shared recurrent exit, per-client adaptive teacher -------------------------------


def test_reefl_teacher_is_the_best_exit_and_follows_the_data() -> None:
    # Exit 0 predicts class 0, exit 1 class 1, exit 2 class 2, each confidently.
    logits = [torch.full((4, 3), -2.0) for _ in range(3)]
    for e, z in enumerate(logits):
        z[:, e] = 3.0
    assert best_exit(logits, torch.tensor([1, 1, 1, 1])) == 1
    assert best_exit(logits, torch.tensor([2, 2, 2, 0])) == 2  # other data, other teacher
    # Every other exit distils from the teacher; the teacher gets no KD gradient.
    z = [t.clone().requires_grad_() for t in logits]
    y = torch.tensor([2, 2, 2, 0])
    loss, parts = multi_exit_loss(
        z, y, weights="sum", kd="best", gamma=0.5, temperature=1.0, teacher=2
    )
    ce = sum(F.cross_entropy(t, y) for t in z)
    kd = kd_term(z[0], z[2], 1.0) + kd_term(z[1], z[2], 1.0)
    torch.testing.assert_close(loss, ce + 0.5 * kd)
    _, parts = multi_exit_loss(
        z, y, weights="sum", kd="best", gamma=1.0, temperature=1.0, teacher=2
    )
    (g_teacher,) = torch.autograd.grad(kd_term(z[0], z[2], 1.0), z[2], allow_unused=True)
    assert g_teacher is None or torch.all(g_teacher == 0)
    with pytest.raises(ValueError, match="teacher"):
        multi_exit_loss(z, y, kd="best")


def test_reefl_client_picks_its_teacher_on_held_out_data() -> None:
    model = _tiny_model(exit_mode="recurrent")
    spec = LocalSpec(lr=1e-3, batch_size=8, steps=3)
    client = ReeFL(spec, ReeFLParams(depths=[3]))
    ctx = ClientContext(0, 1, torch.Generator().manual_seed(0), torch.device("cpu"))
    net = client.make_subnet(model, ctx)
    data = _data(20)
    train, extra = client.split_data(net, data, ctx)
    assert len(train) == 16  # 20 % held out, not trained on
    xv, yv = next(extra["val"])
    held = {tuple(r.flatten()[:4].tolist()) for r in xv}
    assert not held & {tuple(r.flatten()[:4].tolist()) for r in train.x}
    # The teacher is the active exit with the lowest CE on that held-out batch.
    ce = [F.cross_entropy(z, yv).item() for z in model.forward_exits(xv, 3)]
    assert client.select_teacher(net, xv, yv) == min(range(3), key=ce.__getitem__)
    # Two clients whose data favour different exits get different teachers.
    logits = model.forward_exits(xv, 3)
    picks = {best_exit(logits, z.argmax(-1)) for z in logits}
    assert len(picks) > 1
    upd = _train(client, model, 0)
    assert 1 <= upd.metrics["train/teacher_exit"] <= 3
    with pytest.raises(ConfigError, match="exit_mode = 'recurrent'"):
        _train(client, _tiny_model(), 0)


# -- end to end -----------------------------------------------------------------------------


def _raw(tmp_rounds: int = 2) -> dict:
    return {
        "name": "eevit-e2e",
        "seed": 0,
        "rounds": tmp_rounds,
        "data": {"dataset": "digits", "num_clients": 4, "partition": "dirichlet", "beta": 0.5},
        "model": {
            "name": "eevit",
            "params": {"patch_size": 2, "embed_dim": 32, "num_heads": 2, "depth": 4},
        },
        "client": {
            "algorithm": "multi_exit",
            "lr": 1e-3,
            "batch_size": 32,
            "local_steps": 2,
            "weight_decay": 0.05,
            "params": {
                "depths": [1, 2, 4],
                "mixup": 0.8,
                "cutmix": 1.0,
                "label_smoothing": 0.1,
                "randaugment": "rand-m9-mstd0.5",
            },
        },
        "server": {"clients_per_round": 4},
        "eval": {
            "every": 1,
            "metrics": ["routing", "routing_adv"],
            "params": {
                "routing": {"client_test_size": 50},
                "routing_adv": {"adv_samples": 16, "eps": [1e-3, 1e-2]},
            },
        },
        "checkpoint": {"every": 1},
        "run": {"progress": False},
    }


def test_end_to_end_mixed_depths_write_routing_metrics(tmp_path) -> None:
    raw = _raw()
    sim = Simulator(build(config.validate(raw)), tmp_path / "a")
    sim.run()
    summary = json.loads((tmp_path / "a" / "summary.json").read_text())
    final = summary["final"]
    for key in (
        "route/full/acc", "route/full/top5", "route/exit/1/acc", "route/robust/acc",
        "route/robust/depth_saving", "route/fixed/exit/1/frac", "route/robust/exit/1/err_accepted",
        "route_local/client_robust/worst_acc", "route_local/fixed/mean_acc", "profile/0/score",
        "route_adv/pgd/0.01/robust/acc", "route_adv/fgsm/0.001/full/acc",
        "route_adv/clean/fixed/acc",
    ):  # fmt: skip
        assert key in final, key
    assert 0 <= final["route/robust/depth_saving"] <= 1 - 1 / 4
    assert final["route/full/acc"] == pytest.approx(final["test_acc"])
    # Communication: every client's active prefix, both ways (depths cycle 1, 2, 4, 1).
    model = sim.model
    per_client = [4 * int(model.prefix_mask(m).sum()) for m in (1, 2, 4, 1)]
    rows = [
        json.loads(line)
        for line in (tmp_path / "a" / "metrics.jsonl").read_text().split("\n")
        if line
    ]
    assert rows[0]["comm/up_bytes"] == rows[0]["comm/down_bytes"] == sum(per_client)
    assert rows[1]["comm/cum_gib"] == pytest.approx(4 * sum(per_client) / 2**30)


_BASELINE_RUNS = {
    "heterofl": ({"widths": [0.5, 0.25, 1.0]}, {}),
    "scalefl": ({"depths": [1, 2, 3], "widths": [0.7, 0.75, 1.0]}, {"exit_blocks": [2, 3, 4]}),
    "depthfl": ({"depths": [1, 2, 4]}, {"exit_bottleneck": "depthfl"}),
    "reefl": ({"depths": [1, 2, 4]}, {"exit_mode": "recurrent"}),
}


@pytest.mark.parametrize("algorithm", list(_BASELINE_RUNS))
def test_baseline_uploads_pass_the_servers_mask_check(tmp_path, algorithm) -> None:
    # The server predicts every client's mask from its tier (docs/security.md) and rejects any
    # other.
    client_params, model_params = _BASELINE_RUNS[algorithm]
    raw = _raw(tmp_rounds=1)
    raw["client"] |= {"algorithm": algorithm, "params": client_params, "local_steps": 1}
    raw["model"]["params"] |= model_params
    raw["eval"] = {"every": 1}
    Simulator(build(config.validate(raw)), tmp_path / algorithm).run()
    row = json.loads((tmp_path / algorithm / "metrics.jsonl").read_text().splitlines()[-1])
    assert row["sys/rejected"] == 0 and math.isfinite(row["test_acc"])


def test_mixed_depth_run_with_augmentation_is_deterministic(tmp_path) -> None:
    # A run is a pure function of (config, seed), MixUp/CutMix/RandAugment and the routing
    # evaluators (client profiling, FGSM/PGD routing) included: metrics.jsonl is identical.
    raw = _raw(tmp_rounds=1)
    for out in ("a", "b"):
        Simulator(build(config.validate(raw)), tmp_path / out).run()
    a = (tmp_path / "a" / "metrics.jsonl").read_text()
    assert a == (tmp_path / "b" / "metrics.jsonl").read_text()


def test_client_algorithms_declare_schemas_tags_and_help() -> None:
    from fedshield.algorithms.client import CLIENT_ALGORITHMS

    for name in ("multi_exit", "depthfl", "reefl", "heterofl", "scalefl"):
        entry = CLIENT_ALGORITHMS.entry(name)
        assert entry.declared and entry.help.endswith("."), name
        assert entry.tag_values("needs_model") == {"multi_exit"}, name
        assert entry.tag_values("uploads") == {"mask"}, name
        assert all(f.description for f in entry.schema.model_fields.values()), name
    with pytest.raises(ConfigError, match="did you mean 'teacher_val_fraction'"):
        CLIENT_ALGORITHMS.parse("reefl", {"teacher_val_frac": 0.1}, "client.params")


# -- presets ---------------------------------------------------------------------------------


def test_eevit_presets_are_the_generators_output() -> None:
    import importlib.util
    from importlib import resources
    from pathlib import Path

    path = Path(__file__).resolve().parents[1] / "tools" / "make_presets.py"
    spec = importlib.util.spec_from_file_location("make_presets", path)
    gen = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gen)
    presets = resources.files("fedshield.presets")
    files = gen.eevit_files()
    assert len(files) == 16
    for rel, text in files.items():
        assert presets.joinpath(rel).read_text() == text, f"{rel}: run tools/make_presets.py"


def test_early_exit_presets_train_every_client_at_full_depth_and_tiers_are_a_grid() -> None:
    """The early-exit ViT paper's default is m_k = L for every client; the depth tiers (2, 4, 6)
    are a choice of their own grid, and attacks read the whole test split."""
    from fedshield.sweep import expand, read_grid

    for name in ("eevit-mnist5k-dir0.5-cpu", "eevit-mnist5k-dir0.1-cpu", "eevit-cifar10-dir0.5"):
        cfg = config.load(preset=name)
        assert "depths" not in cfg.client.params, name
    cpu = config.load(preset="eevit-mnist5k-dir0.5-cpu")
    assert cpu.eval.params["routing_adv"].get("adv_samples") is None
    _, tiers = expand(*read_grid(grid="eevit-tiers-cpu"))
    _, full = expand(*read_grid(grid="eevit-alpha-cpu"))
    assert all(config.validate(r.raw).client.params["depths"] == [2, 4, 6] for r in tiers)
    assert all("depths" not in config.validate(r.raw).client.params for r in full)


def test_baseline_grid_variants_build_every_client_subnet() -> None:
    from fedshield.algorithms.client import CLIENT_ALGORITHMS
    from fedshield.sweep import expand, read_grid

    _, runs = expand(*read_grid(grid="eevit-baselines-cpu"))
    assert {r.name for r in runs} >= {"heterofl", "depthfl", "scalefl", "reefl"}
    for run in runs:
        cfg = config.validate(run.raw)
        model = build_model(cfg.model.name, (1, 28, 28), 10, **cfg.model.params)
        cls = CLIENT_ALGORITHMS.get(cfg.client.algorithm)
        client = cls(LocalSpec(lr=1e-3, batch_size=8), cls.params_schema(**cfg.client.params))
        counts = torch.ones(10)  # every class present: the tier alone decides
        masks = [client.expected_mask(k, model, counts) for k in range(cfg.data.num_clients)]
        assert (run.name == "ours_all_depth6") == all(m is None for m in masks), run.name


@pytest.mark.parametrize(
    ("sets", "message"),
    [
        (["client.params.depths=[10]"], "outside 1..6 exits"),
        (['client.algorithm="reefl"'], "exit_mode = 'recurrent'"),
        (['client.algorithm="depthfl"'], "bottleneck"),
        (['client.algorithm="heterofl"', 'model.params.exit_mode="recurrent"'], "'stage'"),
        (['client.algorithm="heterofl"', "client.params.widths=[1.5]"], "outside (0, 1]"),
    ],
)
def test_a_tier_or_exit_layout_the_model_lacks_fails_before_any_data(
    tmp_path, capsys, sets, message
) -> None:
    """These were found at the first local update, after data, model and config.toml."""
    from fedshield.cli import main

    out = tmp_path / "run"
    argv = ["run", "--preset", "eevit-digits-cpu", "--out", str(out), "-q"]
    for s in sets:
        argv += ["--set", s]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and message in err[0]
    assert not out.exists()
