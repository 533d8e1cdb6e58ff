"""Depth-heterogeneous FL on the multi-exit ViT (SPEC §8): the local loss, coverage-aware
aggregation (eq. 15), prefix communication (eq. 16), baselines, and an end-to-end run."""

from __future__ import annotations

import json
import math

import pytest
import torch
import torch.nn.functional as F

from fedshield import config
from fedshield.aggregators.mean import Mean
from fedshield.algorithms.client.base import ClientContext, LocalSpec
from fedshield.algorithms.client.multi_exit import (
    DepthFL,
    MultiExit,
    MultiExitParams,
    exit_weights,
    kd_term,
    multi_exit_loss,
)
from fedshield.algorithms.client.width import HeteroFL, HeteroFLParams, narrow_model, width_index
from fedshield.algorithms.server.fedavg import FedAvg, coverage_mean
from fedshield.core.context import ClientUpdate, Payload, RoundContext
from fedshield.core.flat import get_buffers, get_params, set_params
from fedshield.data.bundle import TensorData
from fedshield.errors import ConfigError
from fedshield.models import build_model
from fedshield.sim.builder import build
from fedshield.sim.engine import Simulator

# -- the local loss (SPEC §8, worked examples) ---------------------------------------------


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
    step = FedAvg(Mean()).update(params, torch.zeros(0), {}, updates, ctx, services=None)  # type: ignore[arg-type]
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
    return client.local_update(model, Payload(params, buffers), _data(), ctx, {})


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


def test_heterofl_width_subnet_slices_heads_and_scatters_back() -> None:
    model = _tiny_model(num_heads=4, embed_dim=32)
    sub = narrow_model(model, 0.5)
    assert sub.arch["embed_dim"] == 16 and sub.arch["num_heads"] == 2
    index = width_index(model, sub)
    assert index.unique().numel() == index.numel() == get_params(sub).numel()
    # qkv keeps the first two heads of each of q, k, v.
    qkv = dict(model.named_parameters())["vit.blocks.0.attn.qkv.weight"]  # [3·32, 32]
    set_params(sub, get_params(model)[index])
    sub_qkv = sub.vit.blocks[0].attn.qkv.weight  # [3·16, 16]
    for j in range(3):
        torch.testing.assert_close(sub_qkv[16 * j : 16 * (j + 1)], qkv[32 * j : 32 * j + 16, :16])
    client = HeteroFL(LocalSpec(lr=1e-3, batch_size=8, steps=2), HeteroFLParams(widths=[0.5, 1]))
    upd = _train(client, model, 0)
    assert int(upd.mask.sum()) == index.numel()
    assert torch.all(upd.delta[~upd.mask] == 0)
    assert upd.metrics["comm/bytes"] == 4 * index.numel()
    assert _train(client, model, 1).mask is None  # full width, full depth


def test_depthfl_client_runs_with_mutual_kd() -> None:
    upd = _train(DepthFL(LocalSpec(lr=1e-3, batch_size=8, steps=1)), _tiny_model(), 0)
    assert upd.metrics["train/loss_kd"] > 0 and math.isfinite(upd.metrics["train/loss"])


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


def test_mixed_depth_run_with_augmentation_is_deterministic(tmp_path) -> None:
    # A run is a pure function of (config, seed), MixUp/CutMix/RandAugment included.
    raw = _raw(tmp_rounds=1)
    raw["eval"] = {"every": 1}
    for out in ("a", "b"):
        Simulator(build(config.validate(raw)), tmp_path / out).run()
    a = (tmp_path / "a" / "metrics.jsonl").read_text()
    assert a == (tmp_path / "b" / "metrics.jsonl").read_text()
