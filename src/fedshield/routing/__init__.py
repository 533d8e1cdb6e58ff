"""Security-adaptive early-exit routing (early-exit ViT paper): pure functions on exit
probabilities.

* :mod:`~fedshield.routing.signals` — Ĥ_e, C_e, M_e, Q_e, R_e per sample;
* :mod:`~fedshield.routing.profiling` — client difficulty S_k (once, before round 1);
* :mod:`~fedshield.routing.policies` — ``POLICIES`` (Table I), :func:`thresholds`,
  :func:`route`;
* :mod:`~fedshield.routing.metrics` — accuracy, exit histogram, depth saving, accept/defer
  decomposition.
"""

from fedshield.routing.metrics import ExitDecomposition, RoutingMetrics, routing_metrics
from fedshield.routing.policies import (
    POLICIES,
    ExitProbs,
    Policy,
    exit_threshold,
    named_policy,
    resolve_policy,
    route,
    stack_exits,
    thresholds,
)
from fedshield.routing.profiling import (
    ClientProfile,
    client_scores,
    label_entropy,
    minmax_normalize,
    profile_clients,
    shallow_confidence_deficit,
)
from fedshield.routing.signals import (
    ExitSignals,
    RiskWeights,
    confidence,
    margin,
    multiplicative_difficulty,
    normalized_entropy,
    risk,
)

__all__ = [
    "POLICIES",
    "named_policy",
    "ClientProfile",
    "ExitDecomposition",
    "ExitProbs",
    "ExitSignals",
    "Policy",
    "RiskWeights",
    "RoutingMetrics",
    "client_scores",
    "confidence",
    "exit_threshold",
    "label_entropy",
    "margin",
    "minmax_normalize",
    "multiplicative_difficulty",
    "normalized_entropy",
    "profile_clients",
    "resolve_policy",
    "risk",
    "route",
    "routing_metrics",
    "shallow_confidence_deficit",
    "stack_exits",
    "thresholds",
]
