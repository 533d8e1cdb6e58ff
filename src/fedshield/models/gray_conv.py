"""A one-input-channel convolution whose input gradient on CPU is a matmul and k² shifted adds.

Every attack step (PGD, FGSM, CW, APGD, TRADES' and CalFAT's inner maximisation) needs the
gradient of the loss with respect to the image, so it runs the first convolution's
transposed kernel. For a grayscale input (one channel) oneDNN's kernel for it is slow: on
cnn_small's [32, 16, 28, 28] first layer, one thread, 2.0-2.7 ms against 0.34 ms for the
same gradient as a [k², C_out] × [C_out, N·H·W] matmul followed by k² shifted adds, and
48 against 4.3 ms at the evaluation's batch of 500 (``bench/bench_layout.py``). A
one-channel gradient has no channel reduction left after the matmul, which is why the
im2col-free formulation wins here and not at three channels (measured slower for
cnn_cifar10's 3 → 64 conv5×5).

Only the input gradient changes path: the forward pass and the weight and bias gradients
stay oneDNN's (bit for bit, tests/test_models.py), and the input gradient equals the
transposed convolution up to float32 summation order. The fast path is taken on CPU, for
stride 1, dilation 1, one group, zero padding, when the input requires a gradient and no
``torch.func`` transform is active (the batched trainer's ``vmap`` keeps the native path);
everything else is ``nn.Conv2d``'s own forward.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn


def one_channel_input_grad(grad: Tensor, weight: Tensor, padding: tuple[int, int]) -> Tensor:
    """d loss / d x of ``conv2d(x, weight, padding=padding)`` (stride 1, one input channel)
    from the output gradient ``grad`` [N, C_out, H_out, W_out]: G = Wᵀ · grad as one matmul,
    tap-major ([k², N·H_out·W_out], so each tap's plane is contiguous for the adds: 1.4-2.3×
    faster than position-major), then dx_pad[:, a + i, c + j] += G[(a, c), :, i, j] for each
    of the k² taps. Returned as [N, 1, H, W] (channels_last and contiguous are the same
    layout at one channel)."""
    n, c_out, h_out, w_out = grad.shape
    kh, kw = weight.shape[-2:]
    ph, pw = padding
    rows = grad.permute(0, 2, 3, 1).reshape(-1, c_out)
    taps = torch.mm(weight.reshape(c_out, kh * kw).t(), rows.t()).view(kh, kw, n, h_out, w_out)
    padded = grad.new_zeros(n, h_out + kh - 1, w_out + kw - 1)
    for a in range(kh):
        for c in range(kw):
            padded[:, a : a + h_out, c : c + w_out] += taps[a, c]
    h, w = h_out + kh - 1 - 2 * ph, w_out + kw - 1 - 2 * pw
    return padded[:, ph : ph + h, pw : pw + w].unsqueeze(1)


class _InputGradByMatmul(torch.autograd.Function):
    """Identity on the convolution's output ``y`` whose backward also routes the gradient
    to the convolution's input ``x`` by :func:`one_channel_input_grad`; ``y`` itself was
    computed from ``x.detach()``, so its weight and bias gradients stay the native ones,
    and autograd still skips them when only ``x`` is asked for."""

    @staticmethod
    def forward(ctx: Any, y: Tensor, x: Tensor, weight: Tensor, padding: tuple[int, int]) -> Tensor:
        ctx.save_for_backward(weight)
        ctx.padding = padding
        return y.view_as(y)

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor, Tensor | None, None, None]:
        (weight,) = ctx.saved_tensors
        dx = one_channel_input_grad(grad, weight, ctx.padding) if ctx.needs_input_grad[1] else None
        return grad, dx, None, None


class GrayConv2d(nn.Conv2d):
    """``nn.Conv2d`` (same parameters, state dict and forward values) with the fast CPU
    input gradient of the module docstring for a one-channel input."""

    def forward(self, x: Tensor) -> Tensor:
        if not self._fast_input_grad(x):
            return super().forward(x)
        y = F.conv2d(x.detach(), self.weight, self.bias, 1, self.padding)
        pad = (int(self.padding[0]), int(self.padding[1]))
        out: Tensor = _InputGradByMatmul.apply(y, x, self.weight, pad)
        return out

    def _fast_input_grad(self, x: Tensor) -> bool:
        return (
            x.requires_grad
            and torch.is_grad_enabled()
            and x.device.type == "cpu"
            and self.in_channels == 1
            and self.groups == 1
            and self.stride == (1, 1)
            and self.dilation == (1, 1)
            and self.padding_mode == "zeros"
            and not isinstance(self.padding, str)
            and torch._C._functorch.peek_interpreter_stack() is None
        )


def conv2d(cin: int, cout: int, k: int, padding: int) -> nn.Conv2d:
    """The convolution a model factory builds: :class:`GrayConv2d` for one input channel,
    ``nn.Conv2d`` otherwise."""
    cls = GrayConv2d if cin == 1 else nn.Conv2d
    return cls(cin, cout, k, padding=padding)


__all__ = ["GrayConv2d", "conv2d", "one_channel_input_grad"]
