"""Privacy accounting with Opacus' RDP accountant (Mironov 2017; Mironov, Talwar & Zhang 2019).

Every mechanism here is a sampled Gaussian mechanism applied ``steps`` times with noise
multiplier z and sampling rate q: one DP-FedAvg round (q = S/M, docs/privacy.md) or one DP-SGD
step of a client (q = B/n_k). Its RDP at order α composes additively, so

    RDP(α; q, z, steps) = steps · RDP(α; q, z, 1)        (``opacus...rdp.compute_rdp``)
    ε(δ) = min_α [RDP(α) + log((α − 1)/α) − (log δ + log α)/(α − 1)]   (``get_privacy_spent``)

exactly as :class:`opacus.accountants.RDPAccountant` computes it with its default orders;
the one-step RDP vector is cached per (q, z), so reporting ε every round costs one vector
operation instead of re-running the series for every order. z for a target ε is Opacus'
own ``get_noise_multiplier`` (bisection, ε(z) ≤ target). Opacus is imported lazily (extra
``privacy``).
"""

from __future__ import annotations

import math
from functools import lru_cache
from typing import Any

from fedshield.errors import ConfigError


def _opacus(key: str) -> Any:  # the module, imported lazily
    try:
        from opacus.accountants import RDPAccountant
        from opacus.accountants.analysis import rdp
    except ImportError:
        raise ConfigError(
            f"{key} needs Opacus' privacy accountant: pip install 'fedshield[privacy]'"
        ) from None
    return RDPAccountant, rdp


def orders() -> list[float]:
    """The RDP orders α of Opacus' accountant (``RDPAccountant.DEFAULT_ALPHAS``)."""
    return list(_opacus("privacy")[0].DEFAULT_ALPHAS)


@lru_cache(maxsize=4096)
def _rdp_one_step(sample_rate: float, noise_multiplier: float) -> tuple[float, ...]:
    _, rdp = _opacus("privacy")
    one = rdp.compute_rdp(
        q=sample_rate, noise_multiplier=noise_multiplier, steps=1, orders=orders()
    )
    return tuple(float(v) for v in one)


def epsilon_of(history: list[tuple[float, float, int]], delta: float) -> float:
    """ε(δ) of a composition ``[(z, q, steps), ...]`` — ``RDPAccountant.history``'s form —
    as the accountant computes it: Σ over the history of steps · RDP(q, z, 1), then
    ``get_privacy_spent``. 0 without steps; ``inf`` when a step had z = 0 (clipping only)."""
    history = [(z, q, n) for z, q, n in history if n > 0]
    if not history:
        return 0.0
    if any(z == 0 for z, _, _ in history):
        return math.inf
    import numpy as np

    _, rdp = _opacus("privacy")
    total = sum(np.asarray(_rdp_one_step(float(q), float(z))) * n for z, q, n in history)
    eps, _ = rdp.get_privacy_spent(orders=orders(), rdp=total, delta=delta)
    return float(eps)


def epsilon(noise_multiplier: float, sample_rate: float, steps: int, delta: float) -> float:
    """ε(δ) of ``steps`` compositions of the sampled Gaussian mechanism (q, z)."""
    return epsilon_of([(noise_multiplier, sample_rate, steps)], delta)


@lru_cache(maxsize=256)
def noise_multiplier_for(
    target_epsilon: float, delta: float, sample_rate: float, steps: int, key: str = "privacy"
) -> float:
    """The z that Opacus' ``get_noise_multiplier`` finds for (ε, δ) after ``steps`` steps at
    sampling rate q: ε(z) ≤ target (within its tolerance of 0.01 below)."""
    _opacus(key)
    from opacus.accountants.utils import get_noise_multiplier

    try:
        z = get_noise_multiplier(
            target_epsilon=target_epsilon,
            target_delta=delta,
            sample_rate=sample_rate,
            steps=steps,
            accountant="rdp",
        )
    except ValueError as err:  # "The privacy budget is too low."
        raise ConfigError(
            f"{key}.target_epsilon={target_epsilon}: no noise multiplier reaches it with "
            f"delta={delta}, q={sample_rate:.4g} over {steps} steps ({err})"
        ) from None
    return float(z)


__all__ = ["epsilon", "epsilon_of", "noise_multiplier_for", "orders"]
