"""Flatten a model's parameters and floating buffers into single contiguous vectors.

The engine flattens once per client and unflattens once per round; aggregators see one
dense ``[S, d]`` matrix (DRAG paper, Sec. II-A).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor, nn


def float_buffers(model: nn.Module) -> list[Tensor]:
    # Integer buffers (BatchNorm's num_batches_tracked) are not averaged: they are counters.
    return [b for b in model.buffers() if b.is_floating_point()]


def num_params(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


def buffer_lower_bounds(model: nn.Module) -> Tensor | None:
    """Per-entry lower bound of the flat buffer vector: 0 for BatchNorm running variances
    (a negative variance turns every prediction into NaN), -inf elsewhere; None when the
    model has no such buffer."""
    parts, any_var = [], False
    for name, b in model.named_buffers():
        if not b.is_floating_point():
            continue
        is_var = name.endswith("running_var")
        any_var |= is_var
        parts.append(torch.full((b.numel(),), 0.0 if is_var else -torch.inf, dtype=b.dtype))
    return torch.cat(parts) if any_var else None


def stack_rows(rows: list[Tensor]) -> Tensor:
    """``torch.stack(rows)``, without a copy when the rows already are consecutive rows of
    one contiguous ``[S, d]`` tensor (the engine hands servers such views)."""
    first = rows[0]
    if first.dim() == 1 and first.is_contiguous():
        n, step = first.numel(), first.element_size() * first.numel()
        base = first.data_ptr()
        same = all(
            r.dim() == 1
            and r.numel() == n
            and r.dtype == first.dtype
            and r.device == first.device
            and r.untyped_storage().data_ptr() == first.untyped_storage().data_ptr()
            and r.data_ptr() == base + i * step
            for i, r in enumerate(rows)
        )
        if same:
            return first.as_strided((len(rows), n), (n, 1))
    return torch.stack(rows)


@dataclass(frozen=True)
class ModelTensors:
    """A model's parameters (``model.parameters()`` order), floating buffers
    (:func:`float_buffers` order) and whether every module is in train mode."""

    params: list[Tensor]
    float_buffers: list[Tensor]
    training: bool


def model_tensors(model: nn.Module) -> ModelTensors:
    """:class:`ModelTensors` in one walk of the module tree: the order and de-duplication
    of ``named_modules`` / ``named_parameters`` / ``named_buffers`` (pre-order, first
    occurrence), without building their name strings, which on a small model cost more
    than a client's training step (the sequential simulator walks once per client)."""
    params: list[Tensor] = []
    bufs: list[Tensor] = []
    seen: set[int] = set()
    training = True
    stack = [model]
    while stack:
        m = stack.pop()
        if id(m) in seen:
            continue
        seen.add(id(m))
        training = training and m.training
        for p in m._parameters.values():
            if p is not None and id(p) not in seen:
                seen.add(id(p))
                params.append(p)
        for b in m._buffers.values():
            if b is not None and id(b) not in seen:
                seen.add(id(b))
                if b.is_floating_point():
                    bufs.append(b)
        stack.extend(c for c in reversed(m._modules.values()) if c is not None)
    return ModelTensors(params, bufs, training)


def flatten(tensors: list[Tensor], like: Tensor) -> Tensor:
    """The tensors as one flat vector (an empty one of ``like``'s kind when none)."""
    if not tensors:
        return like.new_zeros(0)
    return torch.cat([t.detach().reshape(-1) for t in tensors])


def get_params(model: nn.Module) -> Tensor:
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()])


def get_buffers(model: nn.Module) -> Tensor:
    bufs = float_buffers(model)
    if not bufs:
        p = next(model.parameters())
        return torch.zeros(0, device=p.device, dtype=p.dtype)
    return torch.cat([b.detach().reshape(-1) for b in bufs])


@torch.no_grad()
def copy_into(tensors: list[Tensor], vec: Tensor) -> None:
    n = sum(t.numel() for t in tensors)
    if vec.numel() != n:
        raise ValueError(f"vector has {vec.numel()} entries, model expects {n}")
    offset = 0
    for t in tensors:
        k = t.numel()
        t.copy_(vec[offset : offset + k].view_as(t))
        offset += k


def set_params(model: nn.Module, vec: Tensor) -> None:
    copy_into(list(model.parameters()), vec)


def set_buffers(model: nn.Module, vec: Tensor) -> None:
    copy_into(float_buffers(model), vec)


def param_slices(model: nn.Module) -> dict[str, slice]:
    """Name → slice of the flat parameter vector (for coverage masks and diagnostics)."""
    out, offset = {}, 0
    for name, p in model.named_parameters():
        out[name] = slice(offset, offset + p.numel())
        offset += p.numel()
    return out
