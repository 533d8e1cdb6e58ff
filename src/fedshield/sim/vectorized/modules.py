"""Module forwards swapped in during a batched call, each giving the module's own result:

* ``nn.Dropout`` draws its mask from the batched client's replayed stream (:mod:`.rng`)
  instead of the global RNG, which ``vmap`` cannot split per client;
* ``nn.MaxPool2d`` with a 1×1 window, stride 1 and no padding is the identity (value and
  gradient), and its batched kernel is among the slowest on CPU (``cnn_small`` on 8×8
  inputs uses one), so it returns a copy of its input.

The swap is an instance attribute ``forward``, removed on exit; nothing else changes.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator

from torch import Tensor, nn

from fedshield.sim.vectorized.rng import GroupDraws


def _is_identity_pool(m: nn.Module) -> bool:
    def one(v: object) -> bool:
        return v == 1 or v == (1, 1)

    return (
        type(m) is nn.MaxPool2d
        and one(m.kernel_size)
        and one(m.stride)
        and m.padding in (0, (0, 0))
        and one(m.dilation)
        and not m.return_indices
    )


@contextlib.contextmanager
def batched_forwards(model: nn.Module, draws: Callable[[], GroupDraws]) -> Iterator[None]:
    """Swap the forwards above on every matching submodule of ``model``."""
    swapped: list[nn.Module] = []

    def dropout(mod: nn.Dropout) -> Callable[[Tensor], Tensor]:
        def forward(x: Tensor) -> Tensor:
            return draws().dropout(x, mod.p) if mod.training else x

        return forward

    def identity(x: Tensor) -> Tensor:
        return x.clone()  # a new tensor, as max_pool2d returns (later in-place ops are safe)

    for m in model.modules():
        if type(m) is nn.Dropout:
            m.forward = dropout(m)  # type: ignore[method-assign,assignment]
        elif _is_identity_pool(m):
            m.forward = identity
        else:
            continue
        swapped.append(m)
    try:
        yield
    finally:
        for m in swapped:
            del m.forward


__all__ = ["batched_forwards"]
