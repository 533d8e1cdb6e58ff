"""Gradient prototypes of a linear classifier and virtual-feature gradient matching
(FedCART paper, the CART step; after CReFF, Shang et al., IJCAI 2022).

A linear classifier h'(z) = W z + b (W: [C, D], b: [C]) has, for one sample (z, y), the
cross-entropy gradient in closed form:

    ∂CE/∂W = (p − e_y) zᵀ,   ∂CE/∂b = p − e_y,   p = softmax(W z + b)

Gradients are flattened as ``[W.flatten(), b]`` (P = C·D + C entries), the order of
``nn.Linear.parameters()``, so a prototype lines up with the classifier's slice of the flat
parameter vector. The closed form is exact (tests compare it with autograd) and, unlike a
per-sample ``autograd.grad`` loop, costs one matrix product per class.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import torch
import torch.nn.functional as F
from torch import Tensor

Distance = Literal["mse", "cos"]


def _residual(z: Tensor, weight: Tensor, bias: Tensor, y: Tensor) -> Tensor:
    """p − e_y for every sample (the logit gradient of CE); works on [..., D] features."""
    p = F.softmax(z @ weight.T + bias, dim=-1)
    return p - F.one_hot(y, weight.shape[0]).to(p)


def linear_ce_grad_per_sample(z: Tensor, weight: Tensor, bias: Tensor, y: Tensor) -> Tensor:
    """Per-sample ∇_{(W,b)} CE(h'(z_i), y_i), shape [N, C·D + C]."""
    e = _residual(z, weight, bias, y)
    g_w = e[:, :, None] * z[:, None, :]
    return torch.cat([g_w.flatten(1), e], dim=1)


def linear_ce_grad(z: Tensor, weight: Tensor, bias: Tensor, y: Tensor) -> Tensor:
    """∇_{(W,b)} of the batch-mean CE, shape [C·D + C]; differentiable w.r.t. z, W, b."""
    e = _residual(z, weight, bias, y)
    return torch.cat([(e.T @ z).flatten(), e.sum(0)]) / z.shape[0]


def class_mean_grads(z: Tensor, weight: Tensor, bias: Tensor, classes: Tensor) -> Tensor:
    """For K classes with V features each (``z``: [K, V, D], labels ``classes``: [K]), the
    gradient of class k's mean CE, shape [K, P] — the synthetic side of the matching."""
    k, v, _ = z.shape
    e = _residual(z, weight, bias, classes[:, None].expand(k, v))
    g_w = torch.einsum("kvc,kvd->kcd", e, z) / v
    return torch.cat([g_w.flatten(1), e.mean(1)], dim=1)


@torch.no_grad()
def class_gradient_sums(
    z: Tensor, weight: Tensor, bias: Tensor, y: Tensor, num_classes: int
) -> tuple[Tensor, Tensor]:
    """Σ over each class's samples of the per-sample gradient ([C, P]) and the counts ([C]).

    Dividing a row by its count gives the per-class prototype g_{k,c} (the mean per-sample
    gradient); sums are returned so callers can accumulate over mini-batches and views.
    """
    e = _residual(z, weight, bias, y)
    d = z.shape[1]
    sums = z.new_zeros(num_classes, num_classes * d + num_classes)
    counts = torch.bincount(y, minlength=num_classes).to(z.dtype)
    for c in torch.unique(y).tolist():
        m = y == c
        sums[c, : num_classes * d] = (e[m].T @ z[m]).flatten()
        sums[c, num_classes * d :] = e[m].sum(0)
    return sums, counts


def softmax_lastdim(x: Tensor) -> Tensor:
    """Softmax over the last dimension as exp(x − max) / Σ exp(x − max), in four operations.

    The same function as ``F.softmax(x, -1)`` up to float rounding (the sum's order). Why
    by hand: on CPU, PyTorch's AVX-512 softmax kernel is slow for a last dimension shorter
    than its 16 lanes — ten classes, [1000, 10]: 208 µs, against 35 µs for its AVX2 kernel
    and ~40 µs for these four operations under either — and the CART step's matching takes
    hundreds of [K, V, C] softmaxes a round."""
    e = (x - x.amax(-1, keepdim=True)).exp_()
    return e.div_(e.sum(-1, keepdim=True))


def mse_match_and_grad(
    z: Tensor, weight: Tensor, bias: Tensor, classes: Tensor, targets: Tensor
) -> tuple[Tensor, Tensor]:
    """The ``mse`` matching distance Σ_k ‖G_k(z) − ḡ_k‖² of :func:`synthesize_features` and
    its gradient w.r.t. the virtual features ``z`` ([K, V, D]), in closed form.

    With e = p − e_y ([K, V, C]), A = 2(G_W − ḡ_W) ([K, C, D]) and a = 2(G_b − ḡ_b)
    ([K, C]), G_W = eᵀz / V and G_b = mean_v e give

        ∂L/∂z = (e A + (p ⊙ (U − ⟨p, U⟩)) W) / V,   U = z Aᵀ + a,

    the second term the softmax Jacobian's transpose applied to ∂L/∂e. The same numbers as
    autograd through :func:`class_mean_grads` (tests/test_losses.py) at a third of its
    operations: the CART step takes hundreds of these steps a round."""
    k, v, d = z.shape
    c = weight.shape[0]
    p = softmax_lastdim(z @ weight.T + bias)
    e = p - F.one_hot(classes, c).to(p)[:, None, :]
    g_w = torch.einsum("kvc,kvd->kcd", e, z) / v
    diff_w = g_w - targets[:, : c * d].view(k, c, d)
    diff_b = e.mean(1) - targets[:, c * d :]
    loss = diff_w.pow(2).sum() + diff_b.pow(2).sum()
    u = torch.baddbmm(diff_b[:, None, :], z, diff_w.transpose(1, 2))  # half of U: A = 2·diff
    r = p * (u - (p * u).sum(-1, keepdim=True))
    grad = torch.baddbmm(r @ weight, e, diff_w).mul_(2.0 / v)
    return loss, grad


def match_distance(g_syn: Tensor, g_real: Tensor, num_classes: int, kind: Distance) -> Tensor:
    """Σ_c dist(g_syn_c, g_real_c) over the rows of [K, P] gradients.

    ``mse``: Σ ‖g_syn − g_real‖² (FedCART paper, eq. 9). ``cos``: CReFF's layer-wise distance, Σ
    over the rows of the weight gradient of (1 − cos); CReFF ignores the bias there, and so do we.
    """
    if kind == "mse":
        return (g_syn - g_real).pow(2).sum()
    if kind == "cos":
        k = g_syn.shape[0]
        w_syn = g_syn[:, :-num_classes].reshape(k, num_classes, -1)
        w_real = g_real[:, :-num_classes].reshape(k, num_classes, -1)
        dot = (w_syn * w_real).sum(-1)
        # CReFF's 1e-6 guards rows that are exactly zero.
        cos = dot / (w_syn.norm(dim=-1) * w_real.norm(dim=-1) + 1e-6)
        return (1.0 - cos).sum()
    raise ValueError(f"distance must be 'mse' or 'cos', got {kind!r}")


Optimizer = Literal["sgd", "adam"]


def plateaued(history: Sequence[float], window: int, tol: float) -> bool:
    """The stopping rule of both CART phases (ours; docs/results/cart_step.md): True when the loss
    improved by less than the fraction ``tol`` over the last ``window`` entries,

        L[t − window] − L[t] ≤ tol · |L[t − window]|

    (a loss that rose counts as a plateau too). ``window = 0`` disables the rule."""
    if window <= 0 or len(history) <= window:
        return False
    ref = history[-1 - window]
    return ref - history[-1] <= tol * abs(ref)


@dataclass(frozen=True)
class MatchResult:
    """Virtual features after gradient matching, the distance before and after, and the
    number of optimiser steps taken (below the cap when the plateau rule stopped it)."""

    features: Tensor
    start: float
    end: float
    steps: int


def _optimizer(z: Tensor, kind: Optimizer, lr: float, momentum: float) -> torch.optim.Optimizer:
    if kind == "sgd":
        return torch.optim.SGD([z], lr=lr, momentum=momentum)
    if kind == "adam":
        return torch.optim.Adam([z], lr=lr)
    raise ValueError(f"optimizer must be 'sgd' or 'adam', got {kind!r}")


def synthesize_features(
    z_init: Tensor,
    weight: Tensor,
    bias: Tensor,
    classes: Tensor,
    targets: Tensor,
    *,
    iters: int = 100,
    lr: float = 0.1,
    momentum: float = 0.0,
    distance: Distance = "mse",
    optimizer: Optimizer = "sgd",
    window: int = 0,
    tol: float = 0.0,
) -> MatchResult:
    """Gradient matching (FedCART paper, eq. 9): at most ``iters`` optimiser steps on the
    virtual features Z_v ([K, V, D], class ``classes[k]`` in row k) minimising

        Σ_k dist(∇_{h'} CE(h'(Z_{v,k}), c_k), ḡ_{c_k})

    with h' = (weight, bias) held fixed, stopping early when the distance plateaus
    (:func:`plateaued` with ``window`` steps and relative tolerance ``tol``)."""
    w, b = weight.detach(), bias.detach()
    targets = targets.detach()
    c = w.shape[0]
    z = z_init.detach().clone().requires_grad_(True)
    opt = _optimizer(z, optimizer, lr, momentum)

    def objective() -> Tensor:
        return match_distance(class_mean_grads(z, w, b, classes), targets, c, distance)

    def objective_and_grad() -> Tensor:
        """The distance, with ∂/∂z in ``z.grad``: in closed form for ``mse``."""
        if distance != "mse":
            loss = objective()
            loss.backward()
            return loss.detach()
        with torch.no_grad():
            loss, z.grad = mse_match_and_grad(z, w, b, classes, targets)
        return loss

    history: list[float] = []
    steps = 0
    while steps < iters:
        opt.zero_grad(set_to_none=True)
        loss = objective_and_grad()
        history.append(loss.item())
        if plateaued(history, window, tol):
            break
        opt.step()
        steps += 1
    with torch.no_grad():
        end = float(objective())
    start = history[0] if history else end
    return MatchResult(z.detach(), start, end, steps)


__all__ = [
    "Distance",
    "MatchResult",
    "Optimizer",
    "class_gradient_sums",
    "class_mean_grads",
    "linear_ce_grad",
    "linear_ce_grad_per_sample",
    "match_distance",
    "mse_match_and_grad",
    "plateaued",
    "softmax_lastdim",
    "synthesize_features",
]
