"""fedshield.routing against hand computations from the early-exit ViT paper (eq. 12, Table I)."""

from __future__ import annotations

import math

import pytest
import torch

from fedshield.errors import ConfigError
from fedshield.routing import (
    POLICIES,
    RiskWeights,
    client_scores,
    confidence,
    exit_threshold,
    label_entropy,
    margin,
    minmax_normalize,
    multiplicative_difficulty,
    normalized_entropy,
    profile_clients,
    risk,
    route,
    routing_metrics,
    shallow_confidence_deficit,
    thresholds,
)

TABLE_I = {  # (a, b, c, d), early-exit ViT paper
    "fixed": (0.0, 0.0, 0.0, 0.0),
    "global_resource": (0.0, 0.20, 0.0, 0.10),
    "robust": (0.0, 0.20, 0.20, 0.10),
    "client_resource": (0.25, 0.20, 0.0, 0.10),
    "client_robust": (0.25, 0.20, 0.20, 0.10),
}


def spec_tau(p: list[float], e: int, num_exits: int, s: float, coeffs: tuple) -> float:
    """Eq. (12) in plain Python scalars, independent of the tensor code under test."""
    a, b, c, d = coeffs
    h = -sum(q * math.log(q) for q in p if q > 0) / math.log(len(p))
    top = sorted(p, reverse=True)
    conf, marg = top[0], top[0] - top[1]
    q_e = h * (1 - conf)
    r_e = 0.4 * h + 0.4 * (1 - conf) + 0.2 * (1 - marg)
    return min(0.95, max(0.45, 0.6 + a * s + b * q_e + c * r_e - d * e / num_exits))


P_EXAMPLE = [0.7, 0.1, 0.1, 0.1]


def test_signals_worked_example() -> None:
    p = torch.tensor([P_EXAMPLE], dtype=torch.float64)
    h = (0.7 * math.log(1 / 0.7) + 0.3 * math.log(10)) / math.log(4)  # 0.678389...
    assert normalized_entropy(p).item() == pytest.approx(h)
    assert confidence(p).item() == pytest.approx(0.7)
    assert margin(p).item() == pytest.approx(0.6)
    assert multiplicative_difficulty(p).item() == pytest.approx(h * 0.3)
    assert risk(p).item() == pytest.approx(0.4 * h + 0.4 * 0.3 + 0.2 * 0.4)
    w = RiskWeights(entropy=1.0, confidence=0.0, margin=0.0)
    assert risk(p, w).item() == pytest.approx(h)
    # Degenerate distributions: one-hot has no uncertainty, uniform is maximal.
    assert normalized_entropy(torch.tensor([[1.0, 0.0, 0.0]])).item() == 0.0
    assert normalized_entropy(torch.full((1, 5), 0.2)).item() == pytest.approx(1.0)


@pytest.mark.parametrize("policy", sorted(TABLE_I))
def test_policy_thresholds_worked_example(policy: str) -> None:
    # Two exits (L = 2), S_k = 0.5; sample 0 is P_EXAMPLE at both exits, sample 1 uniform.
    uniform = [0.25] * 4
    probs = torch.tensor([[P_EXAMPLE, uniform], [P_EXAMPLE, uniform]], dtype=torch.float64)
    tau = thresholds(probs, policy, client_score=0.5)
    assert tau.shape == (2, 2)
    for e in (1, 2):
        for i, p in enumerate((P_EXAMPLE, uniform)):
            assert tau[e - 1, i].item() == pytest.approx(spec_tau(p, e, 2, 0.5, TABLE_I[policy]))


def test_policy_thresholds_literal_values() -> None:
    # Hand arithmetic for P_EXAMPLE at exit 1 of 2, S = 0.5:
    # Ĥ = 0.678389, Q = 0.203517, R = 0.471356, depth term e/L = 0.5.
    probs = torch.tensor([[P_EXAMPLE], [P_EXAMPLE]], dtype=torch.float64)
    expected = {
        "fixed": 0.6,
        "global_resource": 0.6 + 0.2 * 0.203517 - 0.05,  # 0.590703
        "robust": 0.6 + 0.2 * 0.203517 + 0.2 * 0.471356 - 0.05,  # 0.684975
        "client_resource": 0.6 + 0.125 + 0.2 * 0.203517 - 0.05,  # 0.715703
        "client_robust": 0.6 + 0.125 + 0.2 * 0.203517 + 0.2 * 0.471356 - 0.05,  # 0.809975
    }
    for name, value in expected.items():
        assert thresholds(probs, name, 0.5)[0, 0].item() == pytest.approx(value, abs=1e-6)


def test_clipping_to_tau_max_and_tau_min() -> None:
    # Uniform p, S = 1, exit 1 of 6: 0.6 + 0.25 + 0.2*0.75 + 0.2*0.9 - 0.1/6 = 1.163 → 0.95.
    uniform = torch.full((6, 1, 4), 0.25, dtype=torch.float64)
    assert thresholds(uniform, "client_robust", 1.0)[0, 0].item() == pytest.approx(0.95)
    # One-hot p at the last exit with tau0 lowered to 0.5: 0.5 + 0 - 0.1 = 0.4 → 0.45.
    one_hot = torch.zeros(6, 1, 4, dtype=torch.float64)
    one_hot[..., 0] = 1.0
    policy = POLICIES.build("global_resource", tau0=0.5)
    tau = thresholds(one_hot, policy)
    assert tau[-1, 0].item() == pytest.approx(0.45)
    assert tau[0, 0].item() == pytest.approx(0.5 - 0.1 / 6)  # inside the bounds: no clip


def test_fixed_policy_is_tau0_everywhere() -> None:
    probs = torch.softmax(torch.randn(4, 50, 10, generator=torch.Generator().manual_seed(0)), -1)
    tau = thresholds(list(probs), "fixed", client_score=0.9)  # list of [N, C] accepted
    assert torch.equal(tau, torch.full((4, 50), 0.6))


def test_exit_threshold_matches_thresholds_row() -> None:
    probs = torch.softmax(torch.randn(3, 20, 5, generator=torch.Generator().manual_seed(1)), -1)
    scores = torch.linspace(0, 1, 20)  # pooled samples from several clients
    tau = thresholds(probs, "client_robust", scores)
    for e in range(3):
        assert torch.allclose(exit_threshold(probs[e], e + 1, 3, "client_robust", scores), tau[e])


def test_route_first_accepting_exit_and_last_exit_fallback() -> None:
    # Fixed policy (τ = 0.6), L = 3, C = 3. Each row: the three exits of one sample.
    probs = torch.tensor(
        [
            [[0.9, 0.05, 0.05], [0.5, 0.3, 0.2], [0.4, 0.3, 0.3]],  # s0: exit 1 accepts
            [[0.5, 0.3, 0.2], [0.1, 0.7, 0.2], [0.1, 0.1, 0.8]],  # s1: exit 2 accepts
            [[0.4, 0.3, 0.3], [0.3, 0.4, 0.3], [0.3, 0.3, 0.4]],  # s2: nobody → exit 3
            [[0.6, 0.3, 0.1], [0.2, 0.61, 0.19], [0.1, 0.1, 0.8]],  # s3: 0.6 is not > 0.6
        ]
    ).transpose(0, 1)  # → [L, N, C]
    exit_idx, pred = route(probs, "fixed")
    assert exit_idx.tolist() == [0, 1, 2, 1]
    assert pred.tolist() == [0, 1, 2, 1]


def test_last_exit_accepts_even_below_threshold() -> None:
    # client_robust with S = 1 puts τ at 0.95 for uncertain samples, yet exit L answers.
    probs = torch.tensor([[[0.5, 0.3, 0.2]], [[0.2, 0.5, 0.3]]])
    tau = thresholds(probs, "client_robust", 1.0)
    assert (probs.amax(-1) < tau).all()
    exit_idx, pred = route(probs, "client_robust", 1.0)
    assert exit_idx.tolist() == [1] and pred.tolist() == [1]


def test_policy_registry_and_validation() -> None:
    assert POLICIES.names() == sorted(TABLE_I)
    for name, coeffs in TABLE_I.items():
        policy = POLICIES.build(name)
        assert (policy.a, policy.b, policy.c, policy.d) == coeffs
        assert (policy.tau0, policy.tau_min, policy.tau_max) == (0.6, 0.45, 0.95)
        assert policy.client_aware == name.startswith("client")
        entry = POLICIES.entry(name)  # a declared schema, a one-sentence help, described keys
        assert entry.declared and entry.help[0].isupper() and entry.help.endswith(".")
        assert all(f.description for f in entry.schema.model_fields.values())
    with pytest.raises(ConfigError, match="tau_min"):
        POLICIES.build("fixed", tau_min=0.9, tau_max=0.5)
    with pytest.raises(ConfigError, match=r"\.b: Input should be greater than or equal to 0"):
        POLICIES.build("robust", b=-0.1)
    with pytest.raises(ConfigError, match="tau_0"):
        POLICIES.build("fixed", tau_0=0.7)
    with pytest.raises(KeyError, match="robust"):
        POLICIES.get("robustness")
    # Risk weights from a config table (dict) become RiskWeights.
    custom = POLICIES.build("robust", risk_weights={"entropy": 1.0, "confidence": 0, "margin": 0})
    assert custom.risk_weights == RiskWeights(1.0, 0.0, 0.0)


def test_label_entropy() -> None:
    counts = torch.tensor([[5, 5, 0, 0], [10, 0, 0, 0], [1, 1, 1, 1]])
    assert label_entropy(counts).tolist() == pytest.approx([0.5, 0.0, 1.0], abs=1e-9)
    with pytest.raises(ValueError, match="at least one sample"):
        label_entropy(torch.tensor([[0, 0], [1, 1]]))


def test_minmax_normalisation() -> None:
    assert minmax_normalize(torch.tensor([2.0, 4.0, 3.0])).tolist() == [0.0, 1.0, 0.5]
    assert minmax_normalize(torch.tensor([0.3, 0.3, 0.3])).tolist() == [0.0, 0.0, 0.0]


def test_shallow_confidence_deficit_uses_first_p_exits() -> None:
    # Exit confidences per sample: exit1 (0.9, 0.5), exit2 (0.7, 0.9), exit3 ignored.
    probs = torch.tensor(
        [
            [[0.9, 0.1], [0.5, 0.5]],
            [[0.7, 0.3], [0.1, 0.9]],
            [[0.0, 1.0], [0.0, 1.0]],
        ]
    )
    assert shallow_confidence_deficit(probs).item() == pytest.approx(1 - 0.75)
    assert shallow_confidence_deficit(probs, num_shallow=1).item() == pytest.approx(1 - 0.7)


def test_client_scores_worked_example() -> None:
    # H̃ = (0.5, 0, 1); U = (0.2, 0.4, 0.3) → Ũ = (0, 1, 0.5); S = 0.6 H̃ + 0.4 Ũ.
    h = torch.tensor([0.5, 0.0, 1.0])
    u = torch.tensor([0.2, 0.4, 0.3])
    assert client_scores(h, u).tolist() == pytest.approx([0.3, 0.4, 0.8])
    weights = {"entropy_weight": 1.0, "confidence_weight": 0.0}
    assert client_scores(h, u, **weights).tolist() == pytest.approx([0.5, 0.0, 1.0])
    # All clients equally hard on both statistics → every score is 0.
    assert client_scores(torch.ones(3), torch.ones(3)).tolist() == [0.0, 0.0, 0.0]


def test_profile_clients_end_to_end() -> None:
    counts = [[5, 5, 0, 0], [10, 0, 0, 0], [1, 1, 1, 1]]
    conf = (0.8, 0.6, 0.7)  # constant shallow confidence per client → U = (0.2, 0.4, 0.3)
    exit_probs = [
        torch.tensor([c, 1 - c, 0.0, 0.0]).expand(2, n, 4) for c, n in zip(conf, (3, 5, 2))
    ]
    profile = profile_clients(counts, exit_probs)
    assert profile.confidence_deficit.tolist() == pytest.approx([0.2, 0.4, 0.3])
    assert profile.score.tolist() == pytest.approx([0.3, 0.4, 0.8])


def test_routing_metrics_depth_saving_and_decomposition() -> None:
    # L = 3, N = 4; routed exits (1-based) 1, 2, 3, 2 → ē = 2, saving = 1 − 2/3.
    # Predictions per exit (rows) and labels chosen so every error rate is known by hand.
    preds = torch.tensor([[0, 1, 1, 0], [0, 1, 2, 0], [0, 1, 2, 1]])  # [L, N]
    probs = torch.nn.functional.one_hot(preds, 3).double()
    labels = torch.tensor([0, 1, 2, 1])
    exit_idx = torch.tensor([0, 1, 2, 1])
    m = routing_metrics(probs, labels, exit_idx)
    assert m.avg_depth == pytest.approx(2.0)
    assert m.depth_saving == pytest.approx(1 / 3)
    assert m.exit_counts == [1, 2, 1]
    assert m.accuracy == pytest.approx(0.75)  # sample 3 leaves at exit 2 with a wrong answer
    assert m.exit_accuracy == pytest.approx([0.5, 0.75, 1.0])
    d1, d2 = m.decomposition
    # Exit 1: A = {0} (right), D = {1, 2, 3}; exit 1 wrong on {2, 3}, exit 2 wrong on {3}.
    assert (d1.reached, d1.accepted, d1.deferred) == (4, 1, 3)
    assert d1.err_accepted == 0.0
    assert d1.err_deferred_here == pytest.approx(2 / 3)
    assert d1.err_deferred_next == pytest.approx(1 / 3)
    assert d1.deferral_gain == pytest.approx(3 / 4 * (2 / 3 - 1 / 3))
    # Exit 2: reached {1, 2, 3}; A = {1, 3} (3 wrong), D = {2}: exit 2 right, exit 3 right.
    assert (d2.reached, d2.accepted, d2.deferred) == (3, 2, 1)
    assert d2.err_accepted == pytest.approx(0.5)
    assert (d2.err_deferred_here, d2.err_deferred_next) == (0.0, 0.0)
    flat = m.as_dict()
    assert flat["route/depth_saving"] == pytest.approx(1 / 3)
    assert flat["route/exit/2/frac"] == pytest.approx(0.5)
    assert flat["route/exit/1/err_deferred_next"] == pytest.approx(1 / 3)


def test_routing_metrics_empty_subsets_are_nan() -> None:
    probs = torch.nn.functional.one_hot(torch.tensor([[0, 1], [0, 1]]), 2).double()
    m = routing_metrics(probs, torch.tensor([0, 1]), torch.tensor([0, 0]))
    (d1,) = m.decomposition
    assert d1.deferred == 0 and math.isnan(d1.err_deferred_next)
    assert d1.deferral_gain == 0.0
    assert m.depth_saving == pytest.approx(0.5)
    with pytest.raises(ValueError, match="0-based"):
        routing_metrics(probs, torch.tensor([0, 1]), torch.tensor([0, 2]))


def test_route_then_metrics_full_depth_when_threshold_unreachable() -> None:
    # τ_min = τ_max = 1.0 forbids early exits (C_e > 1 never holds): ē = L, saving 0.
    probs = torch.softmax(torch.randn(4, 30, 10, generator=torch.Generator().manual_seed(2)), -1)
    policy = POLICIES.build("fixed", tau0=1.0, tau_min=1.0, tau_max=1.0)
    exit_idx, pred = route(probs, policy)
    assert (exit_idx == 3).all() and torch.equal(pred, probs[-1].argmax(-1))
    assert routing_metrics(probs, pred, exit_idx).depth_saving == 0.0
