"""The 2×2 channels_last max-pool kernel (fedshield.models.fast_pool): PyTorch's max_pool2d
bit for bit — values, the input gradient, ties (first tap), NaN and ±inf — its second
derivative through PyTorch's own backward, and PyTorch's path wherever the kernel does not
apply or is not built."""

from __future__ import annotations

import copy
import os
import shutil

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from fedshield.models import build_model, fast_pool
from fedshield.models.fast_pool import MaxPool2x2, fast_path, kernel
from fedshield.testing.grads import penalty_grads

CL = torch.channels_last
#: torch builds the kernel with $CXX or c++; without any compiler runs take PyTorch's pool
#: (tested below), and the kernel's own tests have nothing to run
HAS_COMPILER = any(shutil.which(c) for c in (os.environ.get("CXX", "c++"), "g++", "clang++"))
needs_kernel = pytest.mark.skipif(not HAS_COMPILER, reason="no C++ compiler on this machine")


def _native_pools(model: nn.Module) -> nn.Module:
    """``model`` with each MaxPool2x2 a plain nn.MaxPool2d(2), in place."""
    for seq in [m for m in model.modules() if isinstance(m, nn.Sequential)]:
        for j, mod in enumerate(seq):
            if isinstance(mod, MaxPool2x2):
                seq[j] = nn.MaxPool2d(2)
    return model


@needs_kernel
def test_the_kernel_builds_here() -> None:
    # a compile error must fail the suite, not silently hand every run PyTorch's path
    assert kernel() is not None, "the fast pool kernel did not build (see the log)"


def _inputs() -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    plain = torch.randn(4, 16, 12, 10, generator=g)
    ties = torch.relu(plain)  # half the windows hold several zeros
    coarse = torch.randint(-2, 3, (3, 5, 8, 8), generator=g).float()  # ties everywhere
    special = torch.randn(2, 3, 6, 6, generator=g)
    special[0, 0, 0, 1] = float("nan")
    special[0, 1, 2, 2] = float("inf")
    special[1, 2, 4, 5] = float("-inf")
    special[1, 0, :2, :2] = float("-inf")  # a window of -inf only
    one_channel = torch.randn(5, 1, 4, 6, generator=g)
    return [t.contiguous(memory_format=CL) for t in (plain, ties, coarse, special, one_channel)]


@needs_kernel
@pytest.mark.parametrize("i", range(5), ids=["plain", "relu-ties", "int-ties", "nan-inf", "C=1"])
def test_values_and_input_gradient_are_max_pool2d_s(i: int) -> None:
    x = _inputs()[i]
    assert fast_path(x)
    a, b = x.clone().requires_grad_(), x.clone().requires_grad_()
    out, ref = MaxPool2x2()(a), F.max_pool2d(b, 2)
    assert out.is_contiguous(memory_format=CL)
    torch.testing.assert_close(out, ref, rtol=0, atol=0, equal_nan=True)
    g = torch.randn(ref.shape, generator=torch.Generator().manual_seed(i))
    out.backward(g)
    ref.backward(g)
    assert a.grad is not None and b.grad is not None
    assert torch.equal(a.grad, b.grad)  # the same taps, +0 elsewhere
    assert a.grad.is_contiguous(memory_format=CL)


@needs_kernel
def test_second_derivatives_go_through_pytorchs_backward() -> None:
    # an input-gradient penalty (create_graph) on float32 cnn_small: d/dθ ||dL/dx||²
    torch.manual_seed(1)
    fast = build_model("cnn_small", (1, 28, 28), 10).to(memory_format=CL)
    plain = _native_pools(copy.deepcopy(fast))
    x, y = torch.rand(3, 1, 28, 28), torch.tensor([1, 2, 3])
    got, ref = penalty_grads(fast, x, y), penalty_grads(plain, x, y)
    assert all(torch.equal(a, b) for a, b in zip(got, ref, strict=True))


@needs_kernel
def test_training_steps_are_the_native_pools_bit_for_bit() -> None:
    torch.manual_seed(2)
    fast = build_model("cnn_small", (1, 28, 28), 10).to(memory_format=CL)
    assert [type(m) for m in fast.trunk if isinstance(m, nn.MaxPool2d)] == [MaxPool2x2] * 2
    plain = _native_pools(copy.deepcopy(fast))
    assert fast.state_dict().keys() == plain.state_dict().keys()
    x, y = torch.rand(16, 1, 28, 28), torch.randint(0, 10, (16,))
    for model in (fast, plain):
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        for _ in range(3):
            opt.zero_grad()
            F.cross_entropy(model(x), y).backward()
            opt.step()
    for a, b in zip(fast.parameters(), plain.parameters(), strict=True):
        assert torch.equal(a, b)


@needs_kernel
def test_pytorchs_path_wherever_the_kernel_does_not_apply(monkeypatch) -> None:
    x = torch.randn(2, 4, 6, 6).contiguous(memory_format=CL)
    assert fast_path(x)
    assert not fast_path(x.contiguous())  # NCHW
    assert not fast_path(x.double())
    assert not fast_path(torch.randn(2, 4, 7, 6).contiguous(memory_format=CL))  # odd height
    assert not fast_path(x[0])  # unbatched
    pool = MaxPool2x2()
    for odd in (torch.randn(2, 4, 7, 5).contiguous(memory_format=CL), x.contiguous(), x.double()):
        assert torch.equal(pool(odd), F.max_pool2d(odd, 2))
    # inside torch.func transforms (the batched trainer's vmap): PyTorch's pool
    xs = torch.randn(3, 2, 4, 6, 6)
    got = torch.func.vmap(pool)(xs)
    assert torch.equal(got, torch.func.vmap(lambda t: F.max_pool2d(t, 2))(xs))
    # where the kernel is not built
    monkeypatch.setattr(fast_pool, "kernel", lambda: None)
    assert not fast_path(x) and torch.equal(pool(x), F.max_pool2d(x, 2))


def test_the_kernel_is_off_when_the_environment_says_so(monkeypatch) -> None:
    monkeypatch.setenv("FEDSHIELD_NATIVE_POOL", "0")
    assert fast_pool.kernel.__wrapped__() is None  # the uncached builder


def test_a_failed_build_falls_back_and_says_why(monkeypatch, caplog) -> None:
    from torch.utils import cpp_extension

    def broken(*args, **kwargs):
        raise RuntimeError("Ninja is required to load C++ extensions")

    monkeypatch.setattr(cpp_extension, "load_inline", broken)
    with caplog.at_level("WARNING", logger="fedshield"):
        assert fast_pool.kernel.__wrapped__() is None
    assert "did not build (Ninja is required" in caplog.text
