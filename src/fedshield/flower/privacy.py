"""Client-level central DP for fedshield's Flower-native strategies, with each rule's own
sensitivity (docs/privacy.md).

Flower's ``DifferentialPrivacyServerSideFixedClipping`` calibrates the noise as
σ = z·C/n, the sensitivity of a *mean* of n clipped updates. Around a robust rule that is
not the sensitivity: removing one client moves a coordinate-wise median by up to about C
(√2·C·2 in L2 over the ball, docs/privacy.md), so the same z gives a far weaker guarantee
than the one Flower's accountant reports. It is valid only around the plain mean (Flower's
own FedAvg, or ``FedshieldRule(aggregator="mean", weighting="uniform")``); it also does
not clip the root-data reference that BR-DRAG and FLTrust rescale every row to.

:func:`central_dp` instead attaches fedshield's own mechanism
(:class:`fedshield.privacy.central.CentralDP`, the one ``[privacy.central]`` runs in the
simulator) to a :class:`~fedshield.flower.adapter.FedshieldRule`: every decoded update (and
the reference r) clipped to C → the configured rule → Gaussian noise with σ = z·Δ₂(rule),
inside the one server round step; ε(δ) of the subsampled Gaussian with q = the sampled
share of nodes is added to every round's metrics (``privacy/epsilon``)::

    strategy = central_dp(Median(fraction_train=0.5), clip=0.5, target_epsilon=4.0,
                          delta=1e-3, num_rounds=20, num_nodes=40)
"""

from __future__ import annotations

import math
from typing import Any

from fedshield.errors import ConfigError
from fedshield.flower.adapter import FedshieldRule
from fedshield.privacy.accountant import epsilon, noise_multiplier_for
from fedshield.privacy.central import CentralDP


def _positive(name: str, value: Any, upper: float = math.inf) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise ConfigError(f"{name}={value!r}: expected a finite number")
    if not 0 < value <= upper:
        raise ConfigError(f"{name}={value!r}: expected a number in (0, {upper:g}]")
    return float(value)


def central_dp(
    strategy: FedshieldRule,
    *,
    clip: float,
    delta: float,
    num_rounds: int,
    noise_multiplier: float | None = None,
    target_epsilon: float | None = None,
    sample_rate: float | None = None,
    num_nodes: int | None = None,
) -> FedshieldRule:
    """``strategy`` with client-level central DP at its rule's sensitivity (module doc).

    Exactly one of ``noise_multiplier`` (z) and ``target_epsilon`` (z found for it after
    ``num_rounds`` rounds). ``sample_rate``: q = S/M of the accountant; default the
    strategy's ``fraction_train`` (with ``num_nodes``, ⌈fraction·M⌉/M, as Flower samples).
    """
    from fedshield.privacy.checks import central_server_ok
    from fedshield.privacy.sensitivity import bound_fn

    if not isinstance(strategy, FedshieldRule):
        raise ConfigError(
            f"central_dp wraps a fedshield Flower-native strategy, got {type(strategy).__name__}"
        )
    clip = _positive("clip", clip, 1e30)
    delta = _positive("delta", delta, 1.0 - 1e-12)
    if isinstance(num_rounds, bool) or not isinstance(num_rounds, int) or num_rounds < 1:
        raise ConfigError(f"num_rounds={num_rounds!r}: expected an integer >= 1")
    if (noise_multiplier is None) == (target_epsilon is None):
        raise ConfigError("central_dp: set exactly one of noise_multiplier and target_epsilon")
    server, rule = strategy.server, strategy.server.aggregator
    if not central_server_ok(server) or strategy.local_server is not None:
        raise ConfigError(
            f"central_dp: server={strategy.server_name!r} computes more than the noised "
            "aggregate from the uploads; use fedavg, brdrag, fltrust or fedacg"
        )
    if strategy._client_algorithm is not None:
        raise ConfigError(
            f"central_dp: server={strategy.server_name!r} reads client extras the noise "
            "does not cover"
        )
    if bound_fn(rule) is None:
        raise ConfigError(
            f"central_dp: aggregator={strategy.aggregator_name!r} has no known L2 sensitivity "
            "bound; declare one with fedshield.privacy.register_bound"
        )
    if strategy.aggregator_name in ("mean", "drag") and strategy.weighting != "uniform":
        raise ConfigError(
            f"central_dp with aggregator={strategy.aggregator_name!r} needs "
            "weighting='uniform' (DP-FedAvg's fixed denominator S)"
        )
    if sample_rate is None:
        fraction = float(getattr(strategy, "fraction_train", 1.0))
        if num_nodes is not None:
            sample_rate = max(1, math.ceil(fraction * num_nodes)) / num_nodes
        else:
            sample_rate = fraction
    q = _positive("sample_rate", sample_rate, 1.0)
    if noise_multiplier is None:
        z = noise_multiplier_for(
            _positive("target_epsilon", target_epsilon), delta, q, num_rounds, "central_dp"
        )
    else:
        if isinstance(noise_multiplier, bool) or not isinstance(noise_multiplier, int | float):
            raise ConfigError(f"noise_multiplier={noise_multiplier!r}: expected a number >= 0")
        z = float(noise_multiplier)
        if not (math.isfinite(z) and z >= 0):
            raise ConfigError(f"noise_multiplier={noise_multiplier!r}: expected a number >= 0")
    mechanism = CentralDP(rule=rule, clip=clip, noise_multiplier=z, delta=delta, sample_rate=q)
    server.central_dp = mechanism  # type: ignore[attr-defined]
    strategy.privacy_epsilon = lambda rounds: epsilon(z, q, rounds, delta)
    strategy.requires_no_buffers = True
    return strategy


__all__ = ["central_dp"]
