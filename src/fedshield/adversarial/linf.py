"""L∞-ball geometry and the input-gradient primitive shared by every attack (FedCART paper).

All attacks here are white-box, sign-gradient, L∞ attacks. They share three steps, kept in
one place so that FGSM, PGD, CW∞ and TRADES' inner maximisation cannot drift apart:

* :func:`input_grad` — the gradient of a scalar loss w.r.t. the *input only*;
* :class:`Draws` — where the random start comes from: :class:`GeneratorDraws` (an explicit
  generator, or the global RNG) or, in the batched trainer, each client's replayed stream
  (:mod:`fedshield.sim.vectorized.rng`);
* :func:`project` — back into the ε-ball around the clean input and the valid pixel range.

Every step also runs inside ``torch.func.vmap`` (one client's view of a batched cohort), so
PGD and TRADES are written once for the sequential and the vectorised trainer.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

import torch
from torch import Tensor, nn

from fedshield.errors import ConfigError

Clamp = tuple[float, float] | None
"""Valid input range ``(low, high)``; ``None`` when inputs are unbounded (e.g. normalised)."""


def check_budget(eps: float, alpha: float | None = None, steps: int | None = None) -> None:
    """Reject budgets that would silently produce a meaningless attack."""
    if not eps >= 0:  # also rejects NaN
        raise ConfigError(f"attack eps must be >= 0, got {eps!r}")
    if alpha is not None and not alpha >= 0:
        raise ConfigError(f"attack alpha (step size) must be >= 0, got {alpha!r}")
    if steps is not None and steps < 0:
        raise ConfigError(f"attack steps must be >= 0, got {steps!r}")


def _in_transform() -> bool:
    """True inside a ``torch.func`` transform (the batched trainer's ``vmap``), where
    ``torch.autograd.grad`` cannot run."""
    return torch._C._functorch.peek_interpreter_stack() is not None


def input_grad(model: nn.Module, x: Tensor, objective: Callable[[Tensor], Tensor]) -> Tensor:
    """Gradient of ``objective(model(x))`` w.r.t. ``x`` alone.

    ``torch.autograd.grad`` with ``inputs=x`` never writes ``.grad`` on the parameters (and
    skips their weight-gradient kernels), so an attack run inside a training step leaves the
    optimiser's accumulated gradients untouched. ``enable_grad`` lets callers invoke attacks
    from evaluation code that runs under ``torch.no_grad``. Inside ``vmap`` (one client of a
    batched cohort) the same gradient comes from ``torch.func.grad``; outside, autograd is
    kept: it is about twice as fast on small models and works with Opacus' hooks.
    """
    if _in_transform():
        return torch.func.grad(lambda a: objective(model(a)))(x.detach())
    with torch.enable_grad():
        x = x.detach().requires_grad_(True)
        loss = objective(model(x))
        (grad,) = torch.autograd.grad(loss, x)
    return grad


class Draws(Protocol):
    """The random numbers of an attack's start, shaped like an input ``like`` (one
    client's view inside ``vmap``)."""

    def uniform(self, like: Tensor, low: float, high: float) -> Tensor:
        """``U(low, high)`` of ``like``'s shape and dtype, on its device."""
        ...

    def normal(self, like: Tensor) -> Tensor:
        """``N(0, 1)`` of ``like``'s shape and dtype, on its device."""
        ...


class GeneratorDraws:
    """:class:`Draws` from ``generator`` (None: the global RNG, which the engine seeds per
    (seed, round, client)). The noise is drawn on the generator's device and then moved, so
    a CPU generator drives attacks on any accelerator and the same seed gives the same
    start everywhere."""

    def __init__(self, generator: torch.Generator | None = None) -> None:
        self.generator = generator

    def _device(self, like: Tensor) -> torch.device:
        return self.generator.device if self.generator is not None else like.device

    def uniform(self, like: Tensor, low: float, high: float) -> Tensor:
        noise = torch.empty(like.shape, dtype=like.dtype, device=self._device(like))
        return noise.uniform_(low, high, generator=self.generator).to(like.device)

    def normal(self, like: Tensor) -> Tensor:
        noise = torch.randn(
            like.shape, dtype=like.dtype, device=self._device(like), generator=self.generator
        )
        return noise.to(like.device)


def project(x_adv: Tensor, x: Tensor, eps: float, clamp: Clamp) -> Tensor:
    """Project onto {‖x' − x‖∞ ≤ eps} ∩ [low, high]; returns a new detached tensor.

    The operation order (clip the perturbation, add it back, clip the range) is the one
    torchattacks uses, so our PGD reproduces its iterates bit for bit. The clamps are out of
    place: in-place ``clamp_`` has no ``vmap`` batching rule (a slow per-client loop).
    """
    out = x + (x_adv.detach() - x).clamp(-eps, eps)
    return out if clamp is None else out.clamp(clamp[0], clamp[1])


__all__ = ["Clamp", "Draws", "GeneratorDraws", "check_budget", "input_grad", "project"]
