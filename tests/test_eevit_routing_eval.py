"""Routing evaluators' helpers (SPEC §8 metrics): client-local test sets, top-k, errors."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from fedshield.data.bundle import DataBundle, TensorData
from fedshield.errors import ConfigError
from fedshield.eval.base import EvalInputs
from fedshield.eval.routing_eval import (
    client_test_sets,
    exit_probs,
    routing_adv_eval,
    routing_eval,
    topk_acc,
)
from fedshield.models import build_model


def _test_set(per_class: int = 30, num_classes: int = 4) -> TensorData:
    y = torch.arange(num_classes).repeat_interleave(per_class)
    return TensorData(torch.rand(y.numel(), 1, 8, 8), y)


def test_client_test_sets_follow_client_label_distribution() -> None:
    test = _test_set()
    clients = [
        TensorData(torch.zeros(10, 1, 8, 8), torch.tensor([0] * 7 + [1] * 3)),
        TensorData(torch.zeros(4, 1, 8, 8), torch.tensor([2, 3, 3, 3])),
    ]
    sets = client_test_sets(test, clients, 4, size=40, seed=0)
    assert sets[0].class_counts(4).tolist() == [28, 12, 0, 0]
    assert sets[1].class_counts(4).tolist() == [0, 0, 10, 30]
    # Reproducible, and distinct samples while the class pool suffices (30 per class).
    again = client_test_sets(test, clients, 4, size=40, seed=0)
    assert torch.equal(sets[1].x, again[1].x)
    assert torch.unique(sets[0].x.reshape(40, -1), dim=0).shape[0] == 40
    # A class asked for more than its pool is drawn with replacement.
    big = client_test_sets(test, clients[1:], 4, size=100, seed=0)[0]
    assert big.class_counts(4).tolist() == [0, 0, 25, 75]


def test_topk_accuracy_caps_k_at_the_class_count() -> None:
    probs = torch.tensor([[0.1, 0.2, 0.7], [0.5, 0.3, 0.2]])
    assert topk_acc(probs, torch.tensor([0, 2]), k=1) == 0.0
    assert topk_acc(probs, torch.tensor([1, 1]), k=2) == 1.0
    assert topk_acc(probs, torch.tensor([0, 2]), k=5) == 1.0  # k → C = 3


def _inputs(model_bundle: DataBundle, clients: list[TensorData]) -> EvalInputs:
    return EvalInputs(
        bundle=model_bundle,
        clients=clients,
        train=clients[0],
        device=torch.device("cpu"),
        batch_size=64,
        seed=0,
        round=1,
    )


def test_evaluators_need_a_multi_exit_model_and_global_policies() -> None:
    test = _test_set()
    bundle = DataBundle("t", test, test, 4, (1, 8, 8), ("a", "b", "c", "d"))
    inputs = _inputs(bundle, [test])
    plain = nn.Sequential(nn.Flatten(), nn.Linear(64, 4))
    with pytest.raises(ConfigError, match="multi-exit model"):
        routing_eval(plain, inputs)
    model = build_model("eevit", (1, 8, 8), 4, patch_size=4, embed_dim=16, num_heads=1, depth=2)
    with pytest.raises(ConfigError, match="global policies"):
        routing_adv_eval(model.eval(), inputs, policies=["client_robust"])
    with pytest.raises(ConfigError, match="unknown"):
        routing_adv_eval(model.eval(), inputs, attacks=["cw"])
    probs = exit_probs(model.eval(), test.x, 50, torch.device("cpu"))
    assert probs.shape == (2, 120, 4)
    torch.testing.assert_close(probs.sum(-1), torch.ones(2, 120))
