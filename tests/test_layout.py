"""run.memory_format: the rule that picks a model's layout, what a channels_last run
changes (float summation order only) and the exactness of max-pooling across layouts."""

from __future__ import annotations

import copy
from typing import Any

import pytest
import torch
import torch.nn.functional as F

from fedshield import config
from fedshield.models import MODELS, build_model, model_tags
from fedshield.models.layout import choose_layout
from fedshield.sim.builder import build
from fedshield.sim.engine import Simulator

CPU, CUDA = torch.device("cpu"), torch.device("cuda")
EPS32 = torch.finfo(torch.float32).eps
#: the families measured faster in channels_last on CPU (docs/results/bench_layout.txt)
CHANNELS_LAST_ON_CPU = {"cnn_small", "cnn_emnist", "cnn_cifar10", "cnn_cifar100"}


def _auto(name: str, params: dict[str, Any] | None = None, device: torch.device = CPU) -> str:
    return choose_layout("auto", model_tags(name, params), (3, 32, 32), device)[0]


def test_the_rule_gives_channels_last_to_the_cpu_cnns_only():
    on_cpu = {name for name in MODELS.names() if _auto(name) == "channels_last"}
    # dual_head's default backbone is cnn_small: it inherits the backbone's layout
    assert on_cpu == CHANNELS_LAST_ON_CPU | {"dual_head"}
    assert _auto("dual_head", {"backbone": "mlp"}) == "contiguous"
    assert _auto("dual_head", {"backbone": "cnn_emnist"}) == "channels_last"
    assert _auto("resnet18") == "contiguous"  # measured within noise of NCHW
    # nothing was measured on a GPU: CUDA keeps NCHW
    assert not {name for name in MODELS.names() if _auto(name, device=CUDA) != "contiguous"}
    # the override wins either way, and says so
    forced = choose_layout("contiguous", model_tags("cnn_small"), (1, 28, 28), CPU)
    assert forced == ("contiguous", "run.memory_format='contiguous'")
    assert choose_layout("channels_last", model_tags("mlp"), (1, 8, 8), CPU)[0] == "channels_last"


def raw_cfg(layout: str, **sections: dict[str, Any]) -> dict[str, Any]:
    raw: dict[str, Any] = {
        "name": "layout",
        "seed": 1,
        "rounds": 1,
        "data": {"dataset": "digits", "num_clients": 4, "partition": "iid"},
        "model": {"name": "cnn_small", "params": {"width": 8, "hidden": 16}},
        "client": {"lr": 0.1, "batch_size": 16, "local_steps": 3},
        "server": {"clients_per_round": 4},
        "eval": {"every": 1},
        "run": {"progress": False, "device": "cpu", "vectorize": False, "memory_format": layout},
    }
    for key, value in sections.items():
        raw[key] = {**raw.get(key, {}), **value}
    return raw


def test_the_builder_converts_the_model_and_records_the_layout(tmp_path):
    exp = build(config.validate(raw_cfg("auto")))
    conv = exp.model.trunk[3].weight  # the second conv (the first has one input channel)
    assert conv.is_contiguous(memory_format=torch.channels_last) and not conv.is_contiguous()
    # a one-channel batch as loaded: the first convolution already writes channels_last,
    # so its max-pool takes the fast kernel (the reason for the layout)
    x, _ = exp.clients[0].batch(torch.arange(4))
    first = exp.model.trunk[0](x)
    assert first.is_contiguous(memory_format=torch.channels_last) and not first.is_contiguous()
    sim = Simulator(exp)
    sim.run_round(1)
    assert sim.finish(0.0)["provenance"]["memory_format"] == "channels_last"
    plain = build(config.validate(raw_cfg("contiguous")))
    assert plain.model.trunk[3].weight.is_contiguous()


@pytest.mark.numerics
@pytest.mark.parametrize(
    ("client", "passes"),
    [
        ({"algorithm": "sgd"}, 1),
        # PGD-2 adversarial training: 2 attack passes (input gradients) + the training pass
        ({"algorithm": "fedpgd", "params": {"steps": 2}}, 3),
    ],
    ids=["sgd", "fedpgd"],
)
def test_a_channels_last_round_agrees_with_the_contiguous_one(client, passes):
    """Same seed, same draws: the layouts compute the same float32 operations with their
    reductions in another order. As in tests/test_vectorized.py (``tolerance``): a reduction
    of n ≤ 16 × 2¹¹ terms (batch × cnn_small's largest activation on 8×8) is within
    log₂(n)·ε ≤ 16ε relative, once forward and once backward for each of the 4 layers with
    parameters — 128ε per pass — and a local step of U runs ``passes`` passes:
    128ε · U · passes of a tensor's largest entry. (No TRADES/CalFAT here: their sign(∇ₓ)
    ascent starts at a stationary point where rounding flips signs, see test_vectorized.)"""
    raw = raw_cfg("channels_last", client=client)
    rel = 128 * EPS32 * raw["client"]["local_steps"] * passes
    runs = {}
    for layout in ("channels_last", "contiguous"):
        raw["run"]["memory_format"] = layout
        sim = Simulator(build(config.validate(copy.deepcopy(raw))))
        plan = sim.begin_round(1)
        ups = sim.train_cohort(plan)
        rec = sim.end_round(plan, ups)
        sim.record(rec, 0.0)  # the callbacks evaluate (eval.every = 1)
        runs[layout] = (ups, rec)
    (cl, rec_cl), (nc, rec_nc) = runs["channels_last"], runs["contiguous"]
    for u, v in zip(cl, nc, strict=True):
        scale = float(v.delta.abs().max())
        assert float((u.delta - v.delta).abs().max()) <= rel * scale, u.client_id
    # the first round's metrics (accuracy counts argmaxes, which a last-bit difference
    # flips only at an exact tie of two logits)
    for key in ("train/loss", "test_loss"):
        assert rec_cl[key] == pytest.approx(rec_nc[key], rel=rel), key
    assert rec_cl["test_acc"] == rec_nc["test_acc"]


@pytest.mark.numerics
@pytest.mark.parametrize("shape", [(4, 8, 28, 28), (4, 8, 7, 9), (3, 5, 8, 8)])
def test_max_pool_is_bit_identical_in_both_layouts(shape):
    """Max-pooling selects an input; it sums nothing, so a layout's kernel must give the
    same values and route each output's gradient to the same input — including at ties,
    which ReLU outputs on zero-padded backgrounds make common (here: quantised values)."""
    g = torch.Generator().manual_seed(0)
    x = (torch.randint(0, 4, shape, generator=g).float() / 4).requires_grad_(True)
    xc = x.detach().contiguous(memory_format=torch.channels_last).requires_grad_(True)
    out, out_c = F.max_pool2d(x, 2), F.max_pool2d(xc, 2)
    assert out_c.is_contiguous(memory_format=torch.channels_last)
    assert torch.equal(out, out_c)
    w = torch.randn(out.shape, generator=g)
    (gx,) = torch.autograd.grad((out * w).sum(), x)
    (gc,) = torch.autograd.grad((out_c * w).sum(), xc)
    assert torch.equal(gx, gc)


def test_model_outputs_match_across_layouts_in_eval():
    """A no-grad forward of each converted family is the NCHW one to float tolerance:
    conv reductions of n ≤ 64·5² = 1600 terms (cnn_cifar10's second conv) within
    log₂(n)·ε ≈ 11ε relative per layer, 5 layers → 64ε of the largest logit."""
    for name in ("cnn_small", "cnn_cifar10"):
        torch.manual_seed(0)
        m = build_model(name, (3, 32, 32), 10).eval()
        x = torch.rand(8, 3, 32, 32)
        with torch.no_grad():
            ref = m(x)
            got = copy.deepcopy(m).to(memory_format=torch.channels_last)(x)
        assert float((got - ref).abs().max()) <= 64 * EPS32 * float(ref.abs().max()), name
