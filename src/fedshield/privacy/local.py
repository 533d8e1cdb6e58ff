"""Sample-level local DP-SGD through Opacus (Abadi et al., CCS 2016; docs/privacy.md).

On every client, each mini-batch gradient is replaced by Opacus' DP-SGD gradient

    ĝ = (1/B) [ Σ_{i∈batch} ∇ℓ_i · min(1, C/(‖∇ℓ_i‖ + 10⁻⁶)) + N(0, (zC)²I) ]

— per-sample gradients from :class:`opacus.GradSampleModule`, clipping, noise and the
fixed denominator B (``expected_batch_size``) from :class:`opacus.optimizers.DPOptimizer`'s
own ``pre_step``. fedshield keeps its own seeded mini-batches (``batch_indices``) and its
loop: after ``pre_step`` the client's data-independent gradient terms (FedProx's
μ(θ − θ_start), weight decay inside SGD) are added, then the plain SGD step runs.

Adversarial-training losses work unchanged: their attacks run with the model in eval mode
(``attack_eval_mode``), and the wrapper below switches Opacus' hooks off in eval mode, so
only the training forward passes (one or two: x and x') produce per-sample gradients —
per-sample gradients of ℓ_i(x_i) + ℓ'_i(x'_i), which the tests check against
``torch.func``.

Accounting (per client k): every local step is one sampled Gaussian mechanism with
q_k = min(1, B/n_k) and z; client k's ε(δ) after it has trained in r rounds is that of
r · U_k steps (U_k = local steps, or E·⌈n_k/B⌉). Opacus' accountant assumes Poisson
sampling; the shuffled fixed-size batches used here are accounted the same way, as
Opacus itself does for a DataLoader without Poisson sampling.
"""

from __future__ import annotations

import copy
import warnings
from dataclasses import dataclass
from functools import cache
from typing import Any

import torch
from torch import Tensor, nn

from fedshield.core.context import derive_seed

#: Purpose mixed into each client's noise seed.
NOISE_PURPOSE = 0xD95D

# Opacus' backward hooks fire on the first layer, whose input needs no gradient; torch warns
# about exactly that (once per process), which is expected here.
warnings.filterwarnings(
    "ignore",
    message="Full backward hook is firing when gradients are computed with respect to module",
    category=UserWarning,
)


@cache
def _gsm_class() -> type:
    from opacus import GradSampleModule
    from opacus.grad_sample.conv import compute_conv_grad_sample

    from fedshield.models.gray_conv import GrayConv2d

    def gray_conv_sampler(layer: nn.Module, activations: Any, backprops: Tensor) -> Any:
        # Opacus picks samplers, and its conv sampler its unfolding, by exact type: a
        # GrayConv2d (nn.Conv2d's forward) is read as the nn.Conv2d it is, through a
        # shallow copy that shares its parameters (the keys of the returned gradients)
        as_conv = copy.copy(layer)
        as_conv.__class__ = nn.Conv2d
        return compute_conv_grad_sample(as_conv, activations, backprops)

    # otherwise Opacus would take its slower functorch fallback for an unknown layer
    GradSampleModule.GRAD_SAMPLERS.setdefault(GrayConv2d, gray_conv_sampler)

    class TrainingGradSampleModule(GradSampleModule):
        """Opacus' per-sample gradient hooks, active only in training mode: Opacus skips
        the activations of eval-mode forward passes, and this skips their backward hooks
        too (an attack's input gradient), which would otherwise pop the wrong
        activations."""

        def train(self, mode: bool = True) -> TrainingGradSampleModule:
            super().train(mode)
            self.hooks_enabled = mode
            return self

    return TrainingGradSampleModule


@dataclass
class DPSGDSession:
    """One client's local training under DP-SGD: ``model`` to call, ``zero_grad`` before
    the forward pass, ``privatize`` after ``backward`` (writes p.grad), ``close`` at the end."""

    model: nn.Module
    optimizer: Any  # opacus.optimizers.DPOptimizer around the client's SGD
    _inner: nn.Module
    _inplace: list[nn.Module]

    def zero_grad(self) -> None:
        self.optimizer.zero_grad(set_to_none=True)

    def privatize(self) -> None:
        """Per-sample clipping + Gaussian noise + 1/B scaling into ``p.grad`` (Opacus)."""
        if self.optimizer.pre_step() is False:  # only with Opacus' virtual steps (unused)
            raise RuntimeError("DPOptimizer skipped a step")

    def close(self) -> None:
        """Remove Opacus' hooks and per-sample state from the (shared) model."""
        self.model._close()  # type: ignore[operator]
        for m in self._inplace:
            m.inplace = True  # type: ignore[assignment]
        for m in self._inner.modules():
            for attr in ("activations", "max_batch_len"):
                if attr in m.__dict__:
                    delattr(m, attr)


@dataclass(frozen=True)
class LocalDPSGD:
    """The ``[privacy.local]`` mechanism every client runs (see the module doc)."""

    clip: float
    noise_multiplier: float
    delta: float

    def session(
        self,
        model: nn.Module,
        optimizer: torch.optim.Optimizer,
        num_examples: int,
        batch_size: int,
        generator: torch.Generator,
        device: torch.device,
    ) -> DPSGDSession:
        """Wrap ``model``/``optimizer`` for one local update. The noise generator is seeded
        from the client's batch generator's seed (itself from (seed, round, client)) and a
        purpose constant, so it never shifts the batches."""
        from opacus.optimizers import DPOptimizer

        # Full backward hooks forbid in-place ops on a hooked module's output (ReLU(inplace)):
        # computed out of place while the hooks are on, the same values.
        inplace = [m for m in model.modules() if getattr(m, "inplace", None) is True]
        for m in inplace:
            m.inplace = False  # type: ignore[assignment]
        gsm = _gsm_class()(model, batch_first=True, loss_reduction="mean", strict=True)
        seed = derive_seed(generator.initial_seed(), NOISE_PURPOSE)
        noise_gen = torch.Generator(device=device).manual_seed(seed)
        opt = DPOptimizer(
            optimizer,
            noise_multiplier=self.noise_multiplier,
            max_grad_norm=self.clip,
            expected_batch_size=min(batch_size, num_examples),
            loss_reduction="mean",
            generator=noise_gen,
        )
        return DPSGDSession(gsm, opt, model, inplace)


def sample_rate(batch_size: int, num_examples: int) -> float:
    """q_k = min(1, B/n_k)."""
    return min(1.0, batch_size / max(num_examples, 1))


def model_problems(model: nn.Module) -> list[str]:
    """Why Opacus cannot compute per-sample gradients of ``model`` (empty: it can)."""
    from opacus.validators import ModuleValidator

    was = model.training
    model.train()
    try:
        errors = [str(e) for e in ModuleValidator.validate(model, strict=False)]
    finally:
        model.train(was)
    buffers = [n for n, b in model.named_buffers() if b.numel()]
    if buffers and not errors:
        errors.append(f"the model has buffers ({', '.join(buffers[:3])}), e.g. BatchNorm")
    return errors


__all__ = ["NOISE_PURPOSE", "DPSGDSession", "LocalDPSGD", "model_problems", "sample_rate"]
