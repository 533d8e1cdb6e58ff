"""A 2×2, stride-2 max-pool for channels_last CPU tensors, as a small C++ kernel compiled on
first use; PyTorch's own pooling everywhere else.

Why by hand: PyTorch's CPU max-pool is generic (any window, stride, padding, dilation) and
stores an int64 index per output, which its backward scatters into a zero-filled input
gradient — two passes over the input-sized tensor. The cnn_small family pools after every
convolution, and every PGD step (training, the prototype pass, the robust evaluation) runs
the pool forward and backward, so on CPU the pool is ~18 % of a FedCART run
(``bench/bench_layout.py``: the same run with every pool at no cost takes 0.48 of the
original time against 0.59). For the one case these models use — a 2×2 window, stride 2,
channels_last, float32 — the kernel here reads each window once and writes the maximum and
a one-byte code of the winning tap; its backward writes every input-gradient element once
(the routed gradient or +0), with no separate fill. On cnn_small's [32, 16, 28, 28]
activation, one thread, its forward took 0.43 ms against ``max_pool2d``'s 0.57 in
channels_last, and the FedCART run 0.50 of its original time against 0.59 without it
(docs/results/bench_layout.txt).

The results are PyTorch's bit for bit: the maximum of four floats is exact, ties go to the
first tap in row-major window order and NaN wins, as in ``max_pool2d``; the backward routes
the gradient to the same tap (tests/test_fast_pool.py). A second derivative (``create_graph``)
goes through PyTorch's own backward, given the same indices. Any other case — CUDA, another
dtype or layout, odd sizes, ``torch.func`` transforms — and a machine where the kernel does
not build (no C++ compiler or ninja; the reason is logged once) take ``nn.MaxPool2d``'s path.
``FEDSHIELD_NATIVE_POOL=0`` turns the kernel off. The build is torch's
``torch.utils.cpp_extension.load_inline``, cached under ``TORCH_EXTENSIONS_DIR`` (default
``~/.cache/torch_extensions``): about 25 s once per machine and torch version.
"""

from __future__ import annotations

import functools
import logging
import os
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

log = logging.getLogger("fedshield")

#: The kernel's source; its name carries a digest of the text, so an edit rebuilds it.
SOURCE = r"""
#include <torch/extension.h>
#include <cstring>
#include <vector>

// values [N, C, H/2, W/2] and the winning tap 0..3 (row-major in the window), both
// channels_last, of a channels_last float [N, C, H, W] with even H and W. Ties keep the
// earlier tap, NaN wins: max_pool2d's rule.
std::vector<torch::Tensor> pool_fwd(torch::Tensor x) {
  TORCH_CHECK(x.scalar_type() == torch::kFloat32 && x.dim() == 4, "float32 NCHW expected");
  TORCH_CHECK(x.is_contiguous(at::MemoryFormat::ChannelsLast), "channels_last expected");
  const int64_t N = x.size(0), C = x.size(1), H = x.size(2), W = x.size(3);
  TORCH_CHECK(H % 2 == 0 && W % 2 == 0, "even height and width expected");
  const int64_t OH = H / 2, OW = W / 2;
  auto cl = at::MemoryFormat::ChannelsLast;
  auto out = torch::empty({N, C, OH, OW}, x.options().memory_format(cl));
  auto code = torch::empty({N, C, OH, OW}, x.options().dtype(torch::kUInt8).memory_format(cl));
  const float* in = x.data_ptr<float>();
  float* o = out.data_ptr<float>();
  uint8_t* k = code.data_ptr<uint8_t>();
  at::parallel_for(0, N * OH, 1, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      const int64_t n = r / OH, oh = r % OH;
      const float* row0 = in + ((n * H + 2 * oh) * W) * C;
      const float* row1 = row0 + W * C;
      float* orow = o + ((n * OH + oh) * OW) * C;
      uint8_t* krow = k + ((n * OH + oh) * OW) * C;
      for (int64_t ow = 0; ow < OW; ++ow) {
        const float* __restrict__ t0 = row0 + 2 * ow * C;
        const float* __restrict__ t1 = t0 + C;
        const float* __restrict__ t2 = row1 + 2 * ow * C;
        const float* __restrict__ t3 = t2 + C;
        float* __restrict__ op = orow + ow * C;
        uint8_t* __restrict__ kp = krow + ow * C;
        for (int64_t c = 0; c < C; ++c) {
          float m = t0[c];
          uint8_t t = 0;
          const float v1 = t1[c], v2 = t2[c], v3 = t3[c];
          const bool b1 = (v1 > m) | (v1 != v1); m = b1 ? v1 : m; t = b1 ? 1 : t;
          const bool b2 = (v2 > m) | (v2 != v2); m = b2 ? v2 : m; t = b2 ? 2 : t;
          const bool b3 = (v3 > m) | (v3 != v3); m = b3 ? v3 : m; t = b3 ? 3 : t;
          op[c] = m;
          kp[c] = t;
        }
      }
    }
  });
  return {out, code};
}

// d loss / d x from the output gradient g and the taps: each element written once, the
// routed gradient where its tap won and +0 elsewhere (bit masks: no branch per element).
torch::Tensor pool_bwd(torch::Tensor g, torch::Tensor code) {
  TORCH_CHECK(g.scalar_type() == torch::kFloat32 && g.dim() == 4, "float32 NCHW expected");
  TORCH_CHECK(g.is_contiguous(at::MemoryFormat::ChannelsLast), "channels_last expected");
  TORCH_CHECK(code.sizes() == g.sizes(), "the taps and the gradient differ in shape");
  const int64_t N = g.size(0), C = g.size(1), OH = g.size(2), OW = g.size(3);
  const int64_t H = 2 * OH, W = 2 * OW;
  auto gx = torch::empty({N, C, H, W}, g.options().memory_format(at::MemoryFormat::ChannelsLast));
  const uint32_t* gp = reinterpret_cast<const uint32_t*>(g.data_ptr<float>());
  const uint8_t* k = code.data_ptr<uint8_t>();
  uint32_t* out = reinterpret_cast<uint32_t*>(gx.data_ptr<float>());
  at::parallel_for(0, N * OH, 1, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      const int64_t n = r / OH, oh = r % OH;
      uint32_t* row0 = out + ((n * H + 2 * oh) * W) * C;
      uint32_t* row1 = row0 + W * C;
      const uint32_t* grow = gp + ((n * OH + oh) * OW) * C;
      const uint8_t* krow = k + ((n * OH + oh) * OW) * C;
      for (int64_t ow = 0; ow < OW; ++ow) {
        uint32_t* taps[4] = {row0 + 2 * ow * C, row0 + (2 * ow + 1) * C,
                             row1 + 2 * ow * C, row1 + (2 * ow + 1) * C};
        const uint32_t* __restrict__ gg = grow + ow * C;
        const uint8_t* __restrict__ kk = krow + ow * C;
        for (int t = 0; t < 4; ++t) {
          uint32_t* __restrict__ dst = taps[t];
          for (int64_t c = 0; c < C; ++c) {
            dst[c] = gg[c] & (0u - static_cast<uint32_t>(kk[c] == t));
          }
        }
      }
    }
  });
  return gx;
}
"""


def _enabled() -> bool:
    return os.environ.get("FEDSHIELD_NATIVE_POOL", "1") != "0"


@functools.cache
def kernel() -> ModuleType | None:
    """The compiled kernel (built on first call, then loaded from torch's extension cache), or
    None where it cannot be built; the reason is logged once."""
    if not _enabled():
        return None
    import hashlib

    name = "fedshield_pool2x2_" + hashlib.sha256(SOURCE.encode()).hexdigest()[:12]
    # torch runs `ninja`: the venv's own (the `ninja` wheel) when the venv is not activated
    bindir = str(Path(sys.executable).parent)
    if bindir not in os.environ.get("PATH", "").split(os.pathsep):
        os.environ["PATH"] = bindir + os.pathsep + os.environ.get("PATH", "")
    try:
        from torch.utils import cpp_extension  # imports setuptools, which may be absent

        module: ModuleType = cpp_extension.load_inline(
            name,
            cpp_sources=[SOURCE],
            functions=["pool_fwd", "pool_bwd"],
            extra_cflags=["-O3"],
            verbose=False,
        )
    except Exception as err:  # no compiler, no ninja, no headers: PyTorch's own pool
        first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        log.warning(
            "the fast 2x2 max-pool kernel did not build (%s); using PyTorch's max_pool2d",
            first[:200],
        )
        return None
    return module


def _indices(code: Tensor, width: int) -> Tensor:
    """max_pool2d's int64 flat indices (into each H × W plane) from the taps."""
    _, _, oh, ow = code.shape
    rows = torch.arange(oh, device=code.device).view(1, 1, oh, 1) * 2
    cols = torch.arange(ow, device=code.device).view(1, 1, 1, ow) * 2
    tap = code.long()
    return (rows + tap // 2) * width + cols + tap % 2


class _Pool2x2(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: Tensor) -> Tensor:
        mod = kernel()
        assert mod is not None
        out, code = mod.pool_fwd(x)
        ctx.save_for_backward(x, code)
        return out

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> Tensor:
        x, code = ctx.saved_tensors
        if torch.is_grad_enabled():  # create_graph: PyTorch's differentiable backward
            return torch.ops.aten.max_pool2d_with_indices_backward(
                grad, x, [2, 2], [2, 2], [0, 0], [1, 1], False, _indices(code, x.shape[3])
            )
        mod = kernel()
        assert mod is not None
        return mod.pool_bwd(grad.contiguous(memory_format=torch.channels_last), code)


def fast_path(x: Tensor) -> bool:
    """Whether :class:`MaxPool2x2` runs the kernel on ``x`` (module docstring)."""
    return (
        torch._C._functorch.peek_interpreter_stack() is None  # first: vmap cannot answer below
        and x.device.type == "cpu"
        and x.dtype == torch.float32
        and x.dim() == 4
        and x.shape[2] % 2 == 0
        and x.shape[3] % 2 == 0
        and x.numel() > 0
        and x.is_contiguous(memory_format=torch.channels_last)
        and kernel() is not None
    )


class MaxPool2x2(nn.MaxPool2d):
    """``nn.MaxPool2d(2)`` (same values, gradients and state dict), on the kernel of the
    module docstring where it applies."""

    def __init__(self) -> None:
        super().__init__(2)

    def forward(self, x: Tensor) -> Tensor:
        if not fast_path(x):
            return F.max_pool2d(x, 2)
        out: Tensor = _Pool2x2.apply(x)
        return out


def max_pool(size: int) -> nn.MaxPool2d:
    """The max-pool a model factory builds: :class:`MaxPool2x2` for a 2×2 window."""
    return MaxPool2x2() if size == 2 else nn.MaxPool2d(size)


__all__ = ["MaxPool2x2", "fast_path", "kernel", "max_pool"]
