"""Gradients the tests compare between a fast path and its reference."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn


def penalty_grads(model: nn.Module, x: Tensor, y: Tensor) -> list[Tensor]:
    """d/dθ of an input-gradient penalty ‖∂CE(model(x), y)/∂x‖² (a second derivative through
    every layer), per parameter; the parameters' ``.grad`` are left set."""
    xx = x.clone().requires_grad_(True)
    (gx,) = torch.autograd.grad(F.cross_entropy(model(xx), y), xx, create_graph=True)
    gx.pow(2).sum().backward()
    grads = [p.grad for p in model.parameters()]
    assert all(g is not None for g in grads)
    return [g for g in grads if g is not None]


__all__ = ["penalty_grads"]
