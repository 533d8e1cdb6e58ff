"""Module state and forwards swapped in during a batched call.

:class:`Slots` puts a client's parameter and buffer tensors into the model for one call,
as ``torch.func.functional_call`` does, with the work that does not change between calls
(module lookup, tied-weight aliases) done once per model.

The forwards swapped in each give the module's own result:

* ``nn.Dropout`` draws its mask from the batched client's replayed stream (:mod:`.rng`)
  instead of the global RNG, which ``vmap`` cannot split per client;
* ``nn.MaxPool2d`` with a 1×1 window, stride 1 and no padding is the identity (value and
  gradient), and its batched kernel is among the slowest on CPU (``cnn_small`` on 8×8
  inputs uses one), so it returns a copy of its input.

The swap is an instance attribute ``forward``, removed on exit; nothing else changes.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Sequence

from torch import Tensor, nn

from fedshield.sim.vectorized.rng import GroupDraws


class Slots:
    """Every place in ``model`` that holds a parameter or buffer — the ``_parameters`` or
    ``_buffers`` dict of its module and the key there — with the position of its tensor
    in ``named_parameters()`` + ``named_buffers()`` order (one entry per distinct tensor).

    :meth:`swapped` is ``functional_call(model, {name: tensor})`` without its per-call
    costs (~0.3 ms a call on one CPU core, several per batched step: finding submodules
    by dotted name, grouping tied weights, flattening the dicts): the same assignments,
    aliases included (``tie_weights=True``: a tensor shared by two modules is replaced in
    both), undone on exit."""

    def __init__(self, model: nn.Module) -> None:
        distinct: list[Tensor] = [t for _, t in model.named_parameters()]
        distinct += [t for _, t in model.named_buffers()]
        where = {id(t): i for i, t in enumerate(distinct)}
        self.size = len(distinct)
        self.slots: list[tuple[dict[str, Tensor | None], str, int]] = []
        for m in model.modules():  # a module shared by two parents holds its tensors once
            tables: list[dict[str, Tensor | None]] = [m._parameters, m._buffers]  # type: ignore[list-item]
            for table in tables:
                for key, t in table.items():
                    if t is not None:
                        self.slots.append((table, key, where[id(t)]))

    @contextlib.contextmanager
    def swapped(self, params: Sequence[Tensor], buffers: Sequence[Tensor]) -> Iterator[None]:
        """``params`` then ``buffers`` (in the orders above) in the model for the block."""
        tensors = [*params, *buffers]
        assert len(tensors) == self.size, (len(tensors), self.size)
        saved = [(table, key, table[key]) for table, key, _ in self.slots]
        try:
            for table, key, i in self.slots:
                table[key] = tensors[i]
            yield
        finally:
            for table, key, t in saved:
                table[key] = t


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


__all__ = ["Slots", "batched_forwards"]
