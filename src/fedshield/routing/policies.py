"""Exit thresholds and routing: the policy family of the early-exit ViT paper (eq. 12, Table I).

τ_{k,e}(x) = clip(τ_0 + a S_k + b Q_e(x) + c R_e(x) − d e/L, τ_min, τ_max), e = 1..L.
A sample leaves at the first exit with C_e(x) > τ_{k,e}(x); exit L always accepts.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from pydantic import Field, create_model
from torch import Tensor

from fedshield.core.params import Params
from fedshield.errors import ConfigError
from fedshield.registry import Registry
from fedshield.routing.signals import ExitSignals, RiskWeights

ExitProbs = Tensor | Sequence[Tensor]
"""Softmax probabilities of every exit: ``[L, N, C]`` or a list of L ``[N, C]``."""


@dataclass(frozen=True)
class Policy:
    """One member of the eq. (12) family. ``client_aware`` policies use S_k, so they need
    the client's identity and are evaluated on client-local data (early-exit ViT paper)."""

    name: str
    a: float = 0.0
    b: float = 0.0
    c: float = 0.0
    d: float = 0.0
    tau0: float = 0.6
    tau_min: float = 0.45
    tau_max: float = 0.95
    risk_weights: RiskWeights = field(default_factory=RiskWeights)

    def __post_init__(self) -> None:
        if isinstance(self.risk_weights, dict):  # as read from a TOML table
            try:
                weights = RiskWeights(**self.risk_weights)
            except TypeError as exc:
                raise ConfigError(f"routing policy {self.name!r}: risk_weights: {exc}") from None
            object.__setattr__(self, "risk_weights", weights)
        for key in ("a", "b", "c", "d"):
            if not getattr(self, key) >= 0:  # the early-exit ViT paper: a, b, c, d >= 0
                raise ConfigError(f"routing policy {self.name!r}: {key} must be >= 0")
        if not self.tau_min <= self.tau_max:
            raise ConfigError(
                f"routing policy {self.name!r}: tau_min ({self.tau_min}) > tau_max ({self.tau_max})"
            )

    @property
    def client_aware(self) -> bool:
        return self.a != 0


POLICIES: Registry[Callable[..., Policy]] = Registry("routing policy")

# Table I of the early-exit ViT paper: (a, b, c, d) and the meaning of each row.
_TABLE: dict[str, tuple[tuple[float, float, float, float], str]] = {
    "fixed": (
        (0.0, 0.0, 0.0, 0.0),
        "Fixed routing: a sample leaves at the first exit whose confidence exceeds τ_0.",
    ),
    "global_resource": (
        (0.0, 0.20, 0.0, 0.10),
        "Global resource-aware routing: the threshold rises with the sample difficulty Q_e "
        "and relaxes with depth.",
    ),
    "robust": (
        (0.0, 0.20, 0.20, 0.10),
        "Robustness-aware routing: the threshold rises with Q_e and the uncertainty risk "
        "R_e and relaxes with depth.",
    ),
    "client_resource": (
        (0.25, 0.20, 0.0, 0.10),
        "Client-aware resource routing: the global resource-aware threshold raised by the "
        "client difficulty S_k.",
    ),
    "client_robust": (
        (0.25, 0.20, 0.20, 0.10),
        "Client-aware robust routing: the robustness-aware threshold raised by the client "
        "difficulty S_k (the fully combined policy).",
    ),
}


class RiskWeightParams(Params):
    entropy: float = Field(0.4, ge=0.0, description="weight of Ĥ_e in R_e")
    confidence: float = Field(0.4, ge=0.0, description="weight of 1 − C_e in R_e")
    margin: float = Field(0.2, ge=0.0, description="weight of 1 − M_e in R_e")


def _policy_schema(coeffs: tuple[float, float, float, float]) -> type[Params]:
    """The parameters of one Table I row: its coefficients as defaults, all overridable, so
    every "our choice" value stays a config parameter."""
    a, b, c, d = coeffs
    return create_model(
        "PolicyParams",
        __base__=Params,
        a=(float, Field(a, ge=0.0, description="weight of the client difficulty S_k")),
        b=(float, Field(b, ge=0.0, description="weight of the sample difficulty Q_e")),
        c=(float, Field(c, ge=0.0, description="weight of the uncertainty risk R_e")),
        d=(float, Field(d, ge=0.0, description="depth relaxation: −d·e/L")),
        tau0=(float, Field(0.6, description="base threshold τ_0")),
        tau_min=(float, Field(0.45, description="lower clip τ_min")),
        tau_max=(float, Field(0.95, description="upper clip τ_max")),
        risk_weights=(
            RiskWeightParams,
            Field(RiskWeightParams(), description="weights of Ĥ_e, 1 − C_e, 1 − M_e in R_e"),
        ),
    )


def _factory(name: str) -> Callable[..., Policy]:
    def build(**p: Any) -> Policy:
        rw = p.pop("risk_weights", None)
        weights = RiskWeights(**rw.kwargs()) if isinstance(rw, Params) else RiskWeights()
        return Policy(name, risk_weights=weights, **p)

    return build


for _name, (_coeffs, _help) in _TABLE.items():
    POLICIES.register(_name, help=_help, schema=_policy_schema(_coeffs))(_factory(_name))


@functools.cache
def named_policy(name: str) -> Policy:
    """The registered policy ``name`` at its registered coefficients, validated once per
    process (an evaluation routes with it for every client and attack budget)."""
    return POLICIES.build(name)


def resolve_policy(policy: Policy | str) -> Policy:
    return named_policy(policy) if isinstance(policy, str) else policy


def stack_exits(probs: ExitProbs) -> Tensor:
    """``[L, N, C]`` from a tensor or a list of per-exit ``[N, C]`` tensors."""
    out = probs if isinstance(probs, Tensor) else torch.stack(list(probs))
    if out.dim() != 3:
        raise ValueError(f"exit probabilities must be [L, N, C], got shape {tuple(out.shape)}")
    return out


def _threshold(
    p: Tensor, rel_depth: Tensor | float, policy: Policy, score: Tensor | float
) -> Tensor:
    sig = ExitSignals.of(p)
    tau = (
        policy.tau0
        + policy.a * torch.as_tensor(score, dtype=p.dtype, device=p.device)
        + policy.b * sig.difficulty
        + policy.c * sig.risk(policy.risk_weights)
        - policy.d * rel_depth
    )
    return tau.clamp(policy.tau_min, policy.tau_max)


def exit_threshold(
    p: Tensor, e: int, num_exits: int, policy: Policy | str, client_score: Tensor | float = 0.0
) -> Tensor:
    """τ_{k,e} ``[N]`` at exit ``e`` (1-based) from its probabilities ``[N, C]``.

    For inference that stops computing once a sample has exited; :func:`thresholds` is the
    same formula for all exits at once. ``client_score`` is S_k (a float, or ``[N]`` when a
    batch pools several clients' samples).
    """
    if not 1 <= e <= num_exits:
        raise ValueError(f"exit e must be in 1..{num_exits}, got {e}")
    return _threshold(p, e / num_exits, resolve_policy(policy), client_score)


def thresholds(
    probs: ExitProbs, policy: Policy | str, client_score: Tensor | float = 0.0
) -> Tensor:
    """τ ``[L, N]`` for every exit and sample (eq. 12; e/L with e = 1..L)."""
    p = stack_exits(probs)
    num_exits = p.shape[0]
    depth = torch.arange(1, num_exits + 1, dtype=p.dtype, device=p.device)[:, None] / num_exits
    return _threshold(p, depth, resolve_policy(policy), client_score)


def route(
    probs: ExitProbs, policy: Policy | str, client_score: Tensor | float = 0.0
) -> tuple[Tensor, Tensor]:
    """(exit index ``[N]``, 0-based; prediction ``[N]``): first exit with C_e > τ_e, and
    the last exit whenever no earlier one accepts (its threshold is never consulted)."""
    p = stack_exits(probs)
    accept = p.amax(dim=-1) > thresholds(p, policy, client_score)
    accept[-1] = True  # deterministic final fallback (early-exit ViT paper, eq. 12)
    # argmax returns the first maximum, i.e. the first accepting exit.
    exit_idx = accept.to(torch.uint8).argmax(dim=0)
    preds = p.argmax(dim=-1)  # [L, N]
    return exit_idx, preds.gather(0, exit_idx[None]).squeeze(0)


__all__ = [
    "POLICIES",
    "ExitProbs",
    "Policy",
    "exit_threshold",
    "resolve_policy",
    "route",
    "stack_exits",
    "thresholds",
]
