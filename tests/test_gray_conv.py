"""The one-channel convolution's matmul input gradient (fedshield.models.gray_conv): the
same gradient as the transposed convolution, the native forward and weight gradients bit
for bit, and the native path wherever the fast one does not apply."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from fedshield.adversarial.linf import input_grad
from fedshield.models import build_model
from fedshield.models.gray_conv import GrayConv2d, conv2d, one_channel_input_grad
from fedshield.testing.grads import penalty_grads

CL = torch.channels_last


@pytest.mark.parametrize(("k", "pad", "hw"), [(3, 1, (28, 28)), (5, 2, (28, 28)), (3, 0, (9, 7))])
def test_matmul_input_gradient_is_the_transposed_convolution(
    k: int, pad: int, hw: tuple[int, int]
) -> None:
    # float64 against torch's own reference (conv2d_input: the transposed convolution)
    g = torch.Generator().manual_seed(k + pad)
    w = torch.randn(6, 1, k, k, generator=g, dtype=torch.float64)
    h_out, w_out = hw[0] + 2 * pad - k + 1, hw[1] + 2 * pad - k + 1
    grad = torch.randn(4, 6, h_out, w_out, generator=g, dtype=torch.float64)
    ref = torch.nn.grad.conv2d_input((4, 1, *hw), w, grad, padding=pad)
    got = one_channel_input_grad(grad, w, (pad, pad))
    assert got.shape == ref.shape
    torch.testing.assert_close(got, ref, rtol=0, atol=1e-12)


def _pair(model: nn.Module) -> tuple[nn.Module, nn.Module]:
    """``model`` and a copy whose GrayConv2d modules are plain nn.Conv2d (same weights)."""
    import copy

    plain = copy.deepcopy(model)
    for mod in plain.modules():
        if isinstance(mod, GrayConv2d):
            mod.__class__ = nn.Conv2d
    return model, plain


@pytest.mark.parametrize("name", ["cnn_small", "cnn_emnist"])
@pytest.mark.parametrize("fmt", [torch.contiguous_format, CL])
def test_grayscale_models_keep_forward_and_weight_gradients_and_match_the_input_gradient(
    name: str, fmt: torch.memory_format
) -> None:
    torch.manual_seed(0)
    fast, plain = _pair(build_model(name, (1, 28, 28), 10).to(memory_format=fmt))
    assert isinstance(fast.trunk[0], GrayConv2d) and type(plain.trunk[0]) is nn.Conv2d
    assert not isinstance(fast.trunk[3], GrayConv2d)  # 16 or 32 input channels: native
    x = torch.rand(8, 1, 28, 28)
    y = torch.randint(0, 10, (8,))
    outs, grads = [], []
    for model in (fast, plain):
        xx = x.clone().requires_grad_(True)
        out = model(xx)
        F.cross_entropy(out, y).backward()
        outs.append(out.detach())
        grads.append(([p.grad.clone() for p in model.parameters()], xx.grad))
    assert torch.equal(outs[0], outs[1])  # the forward is oneDNN's, unchanged
    for a, b in zip(grads[0][0], grads[1][0], strict=True):
        assert torch.equal(a, b)  # weight and bias gradients: the native kernels
    # the input gradient: k²·C_out float32 products summed in another order
    dx, ref = grads[0][1], grads[1][1]
    c_out, k = fast.trunk[0].out_channels, fast.trunk[0].kernel_size[0]
    tol = 4 * k * k * c_out * torch.finfo(torch.float32).eps * ref.abs().max().item()
    torch.testing.assert_close(dx, ref, rtol=0, atol=tol)


def test_an_attack_step_asks_only_for_the_input_gradient() -> None:
    # input_grad (every attack's step) leaves the parameters' .grad untouched on the fast
    # path too, and agrees with the native one
    torch.manual_seed(1)
    fast, plain = _pair(build_model("cnn_small", (1, 28, 28), 10).to(memory_format=CL))
    x, y = torch.rand(4, 1, 28, 28), torch.tensor([0, 1, 2, 3])
    got = input_grad(fast, x, lambda out: F.cross_entropy(out, y))
    ref = input_grad(plain, x, lambda out: F.cross_entropy(out, y))
    assert all(p.grad is None for p in fast.parameters())
    torch.testing.assert_close(got, ref, rtol=1e-5, atol=1e-6 * ref.abs().max().item())


def test_second_order_gradients_flow_through_the_fast_path() -> None:
    # d/dW of ||dL/dx||² (an input-gradient penalty) is the native one
    torch.manual_seed(2)
    fast, plain = _pair(build_model("cnn_small", (1, 28, 28), 10).double())
    x, y = torch.rand(3, 1, 28, 28, dtype=torch.float64), torch.tensor([1, 2, 3])
    got, ref = penalty_grads(fast, x, y), penalty_grads(plain, x, y)
    for a, b in zip(got, ref, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-15)


def test_the_native_path_wherever_the_fast_one_does_not_apply() -> None:
    conv = GrayConv2d(1, 4, 3, padding=1)
    x = torch.rand(2, 1, 8, 8, requires_grad=True)
    assert conv._fast_input_grad(x)
    assert not conv._fast_input_grad(x.detach())  # no input gradient asked
    with torch.no_grad():
        assert not conv._fast_input_grad(x)
    assert not GrayConv2d(1, 4, 3, stride=2)._fast_input_grad(x)
    assert not GrayConv2d(1, 4, 3, padding="same")._fast_input_grad(x)
    # inside torch.func transforms (the batched trainer's vmap) the native path runs
    ref = torch.func.grad(lambda a: nn.Conv2d.forward(conv, a).sum())(x.detach())
    got = torch.func.grad(lambda a: conv(a).sum())(x.detach())
    assert torch.equal(got, ref)
    xs = torch.rand(3, 2, 1, 8, 8)
    batched = torch.func.vmap(torch.func.grad(lambda a: conv(a).square().sum()))(xs)
    assert batched.shape == xs.shape


def test_factory_and_state_dict() -> None:
    assert type(conv2d(1, 4, 3, 1)) is GrayConv2d and type(conv2d(3, 4, 3, 1)) is nn.Conv2d
    plain = nn.Conv2d(1, 4, 3, padding=1)
    gray = GrayConv2d(1, 4, 3, padding=1)
    gray.load_state_dict(plain.state_dict())  # same keys and shapes: checkpoints load
    x = torch.rand(2, 1, 6, 6)
    assert torch.equal(gray(x), plain(x))


def test_opacus_samples_it_as_the_convolution_it_is() -> None:
    # DP-SGD (fedshield.privacy.local) gets per-sample gradients from Opacus' own conv
    # sampler for a GrayConv2d (Opacus looks samplers up by exact type), equal to nn.Conv2d's
    from opacus import GradSampleModule

    from fedshield.privacy.local import _gsm_class

    gsm = _gsm_class()
    assert GrayConv2d in GradSampleModule.GRAD_SAMPLERS
    torch.manual_seed(3)
    fast, plain = _pair(build_model("cnn_small", (1, 28, 28), 10))
    x, y = torch.rand(4, 1, 28, 28), torch.tensor([0, 1, 2, 3])
    samples = []
    for model in (fast, plain):
        for mod in model.modules():
            if isinstance(mod, nn.ReLU):
                mod.inplace = False  # Opacus' full backward hooks forbid in-place outputs
        wrapped = gsm(model)
        F.cross_entropy(wrapped(x), y).backward()
        samples.append(model.trunk[0].weight.grad_sample)
        wrapped._close()
    assert samples[0].shape == (4, 16, 1, 3, 3)
    assert torch.equal(samples[0], samples[1])
