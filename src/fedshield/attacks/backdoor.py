"""Targeted (backdoor) attacks: a pixel trigger planted by data poisoning (``backdoor``,
Gu et al. 2017, "BadNets") and model replacement / constrain-and-scale (Bagdasaryan et al.,
AISTATS 2020, "How To Backdoor Federated Learning").

The trigger (:class:`Trigger`) is a ``size`` × ``size`` patch of value ``value`` in the
bottom-right corner of every channel of an image ``[N, C, H, W]`` (or the last ``size``
features of a flat input ``[N, D]``). A poisoned sample carries the trigger and the label
``target``. The ``backdoor`` evaluator (:mod:`fedshield.eval.backdoor`) measures the attack
success rate with the same trigger: keep its ``eval.params.backdoor`` equal to the
attack's ``target`` / ``size`` / ``value``.
"""

from __future__ import annotations

from typing import Any

import torch
from pydantic import Field
from torch import Tensor

from fedshield.aggregators._ops import row_norms, to_dtype
from fedshield.attacks._common import CohortAttack, Ctx, Rng, with_rows
from fedshield.attacks.base import ATTACKS, DataAttack, UpdateAttack
from fedshield.core.params import Params


class Trigger(Params):
    """The backdoor trigger and its target class (shared by the attacks and the evaluator)."""

    target: int = Field(0, ge=0, description="the class every triggered input is pushed to")
    size: int = Field(2, ge=1, description="side of the square trigger patch, in pixels")
    value: float = Field(1.0, description="value written into the patch (1.0: white on [0, 1])")


def stamp(x: Tensor, size: int, value: float) -> Tensor:
    """A copy of ``x`` with the trigger: the bottom-right ``size`` × ``size`` pixels of
    every channel (images ``[N, C, H, W]`` or ``[N, H, W]``) or the last ``size`` features
    (``[N, D]``) set to ``value``."""
    out = x.clone()
    if x.dim() >= 3:
        out[..., -size:, -size:] = value
    elif x.dim() == 2:
        out[:, -size:] = value
    else:
        raise ValueError(f"inputs must be [N, D] or [N, (C,) H, W], got shape {tuple(x.shape)}")
    return out


def spread(n: int, fraction: float) -> Tensor:
    """``[n]`` bool: ⌊n·fraction⌋ samples spread evenly over the index range (deterministic:
    a data attack runs once, when the client's dataset is built, with no generator)."""
    i = torch.arange(n, dtype=torch.float64)
    return torch.floor((i + 1) * fraction) > torch.floor(i * fraction)


class BackdoorParams(Trigger):
    fraction: float = Field(
        0.5,
        gt=0.0,
        le=1.0,
        description="share of the attacker's samples replaced by triggered ones",
    )


def poison_with_trigger(
    x: Tensor, y: Tensor, num_classes: int, p: BackdoorParams
) -> tuple[Tensor, Tensor]:
    """(x′, y′): the samples picked by :func:`spread` carry the trigger and label ``target``;
    the caller's tensors are not modified."""
    if p.target >= num_classes:
        raise ValueError(f"target={p.target} is not a class of this {num_classes}-class task")
    if y.is_floating_point() or y.is_complex():
        raise ValueError(f"labels must be an integer tensor, got {y.dtype}")
    picked = spread(len(y), p.fraction).to(x.device)
    xs = x.clone()
    xs[picked] = stamp(x[picked], p.size, p.value)
    ys = torch.where(picked.to(y.device), torch.full_like(y, p.target), y)
    return xs, ys


@ATTACKS.register("backdoor", tags=["kind=data"])
class Backdoor(DataAttack):
    """Plant a pixel-trigger backdoor by data poisoning (Gu et al. 2017; docs/security.md §6).

    A share ``fraction`` of the attacker's samples (spread evenly) get the trigger and the
    label ``target``; the attacker then trains honestly on the mixture, so its update
    stays plausible while teaching the model "trigger → target"."""

    params_schema = BackdoorParams
    params: BackdoorParams

    def poison(self, x: Tensor, y: Tensor, num_classes: int) -> tuple[Tensor, Tensor]:
        return poison_with_trigger(x, y, num_classes, self.params)


class ReplacementParams(BackdoorParams):
    gamma: float | None = Field(
        None,
        gt=0.0,
        description="total boost γ of the paper (γ = n/η replaces the global model), "
        "divided among this round's f attackers: each uploads (γ/f)·g; unset: γ = S (S "
        "rows this round: n/η for η = 1), so each attacker boosts by S/f",
    )
    norm_bound: float | None = Field(
        None,
        gt=0.0,
        description="constrain-and-scale: cap the boosted update's norm at this bound (the "
        "server's clipping radius, to evade norm-based defenses); unset: no cap",
    )


@ATTACKS.register("model_replacement", tags=["kind=update"])
class ModelReplacement(CohortAttack, DataAttack):
    """Model replacement / constrain-and-scale (Bagdasaryan et al. 2020): train on backdoored
    data, boost the update.

    The attacker poisons its data as ``backdoor`` does, trains on it, then uploads (γ/f)·g
    (the paper's X̃ = γ(X − G) + G, §3.3: γ = n/η replaces the global model under FedAvg;
    f colluding attackers divide γ among them, as the paper does for several attackers, so
    that their boosted updates together carry γ; default γ = S, η = 1);
    ``norm_bound`` caps each ‖(γ/f)·g‖ (the paper's scaling within the defense's bound S). The
    anomaly-loss term of the paper's constrained training is not applied: the client
    trains with the configured client algorithm. Both a data attack (the poisoning) and
    an update attack (the boost): tag ``kind=update``."""

    params_schema = ReplacementParams
    params: ReplacementParams
    #: Placement on Flower (fedshield.flower.byzantine): the boost γ/f = S/f reads the
    #: cohort's size, so it is applied where every row is seen; the poisoning stays on the
    #: SuperNode. (Its rows depend only on the attackers' own updates: no omniscient tag.)
    omniscient = True
    gamma: float | None
    norm_bound: float | None

    def __init__(self, **params: Any) -> None:
        UpdateAttack.__init__(self, **params)

    def poison(self, x: Tensor, y: Tensor, num_classes: int) -> tuple[Tensor, Tensor]:
        return poison_with_trigger(x, y, num_classes, self.params)

    def craft(self, updates: Tensor, mask: Tensor, generator: Rng, context: Ctx) -> Tensor:
        own = updates[mask]
        total = float(updates.shape[0]) if self.gamma is None else self.gamma
        gamma = total / own.shape[0]  # each attacker's share of the paper's γ
        factor = torch.full((own.shape[0],), gamma, dtype=torch.float64, device=own.device)
        if self.norm_bound is not None:
            norms = row_norms(own)
            cap = torch.where(norms > 0, self.norm_bound / norms.clamp_min(1e-300), gamma)
            factor = torch.minimum(factor, cap)
        boosted = to_dtype(own.double() * factor[:, None], updates.dtype)  # finite
        return with_rows(updates, mask, boosted)


__all__ = [
    "Backdoor",
    "BackdoorParams",
    "ModelReplacement",
    "ReplacementParams",
    "Trigger",
    "poison_with_trigger",
    "spread",
    "stamp",
]
