"""Routing evaluators (early-exit ViT paper, eqs. 13–17): client-local test sets, top-k, the client
profile on θ^0, declared schemas and clear errors."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from fedshield.core.flat import get_buffers, get_params
from fedshield.data.bundle import DataBundle, TensorData
from fedshield.errors import ConfigError
from fedshield.eval.base import EVALUATORS, EvalInputs
from fedshield.eval.routing_eval import (
    RoutingParams,
    client_profile,
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


def _inputs(model_bundle: DataBundle, clients: list[TensorData], initial=None) -> EvalInputs:
    return EvalInputs(
        bundle=model_bundle,
        clients=clients,
        train=clients[0],
        device=torch.device("cpu"),
        batch_size=64,
        seed=0,
        round=1,
        initial=initial,
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
    with pytest.raises(ConfigError, match="routing_adv.attacks"):
        routing_adv_eval(model.eval(), inputs, attacks=["cw"])
    probs = exit_probs(model.eval(), test.x, 50, torch.device("cpu"))
    assert probs.shape == (2, 120, 4)
    torch.testing.assert_close(probs.sum(-1), torch.ones(2, 120))


def test_evaluator_schemas_catch_typos_and_declare_their_model() -> None:
    for name in ("routing", "routing_adv"):
        entry = EVALUATORS.entry(name)
        assert entry.declared and entry.tag_values("needs_model") == {"multi_exit"}
        assert entry.help.endswith(".")
        assert all(f.description for f in entry.schema.model_fields.values())
    with pytest.raises(ConfigError, match="did you mean 'client_test_size'"):
        EVALUATORS.parse("routing", {"client_tst_size": 5}, "eval.params.routing")
    with pytest.raises(ConfigError, match="eval.params.routing_adv.eps"):
        EVALUATORS.parse("routing_adv", {"eps": ["0.1"]}, "eval.params.routing_adv")
    test = _test_set()
    bundle = DataBundle("t", test, test, 4, (1, 8, 8), ("a", "b", "c", "d"))
    model = build_model("eevit", (1, 8, 8), 4, patch_size=4, embed_dim=16, num_heads=1, depth=2)
    with pytest.raises(ConfigError, match="did you mean 'profile_on'"):
        routing_eval(model.eval(), _inputs(bundle, [test]), profile_of="final")


def test_profile_is_taken_on_the_initial_model_by_default() -> None:
    torch.manual_seed(0)
    test = _test_set(per_class=10)
    bundle = DataBundle("t", test, test, 4, (1, 8, 8), ("a", "b", "c", "d"))
    clients = [test.subset(torch.arange(0, 25)), test.subset(torch.arange(15, 40))]
    model = build_model("eevit", (1, 8, 8), 4, patch_size=4, embed_dim=16, num_heads=1, depth=2)
    model.eval()
    theta0 = (get_params(model).clone(), get_buffers(model).clone())
    inputs = _inputs(bundle, clients, initial=theta0)
    args = {"client_test_size": 8, "policies": ["fixed", "client_robust"]}

    def profile(**kw) -> dict[str, float]:
        out = routing_eval(model, inputs, **args, **kw)
        return {k: v for k, v in out.items() if k.startswith("profile/")}

    before = profile()
    assert set(before) == {
        f"profile/{k}/{t}" for k in (0, 1) for t in ("score", "label_entropy", "confidence_deficit")
    }
    torch.testing.assert_close(
        torch.tensor([before["profile/0/score"], before["profile/1/score"]]),
        client_profile(model, inputs, RoutingParams(**args)).score.float(),
    )
    # "Train" the model: the default profile (θ^0) does not move, the final one does.
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p))
    trained = get_params(model).clone()
    assert profile() == before
    assert torch.equal(get_params(model), trained)  # θ^0 was only borrowed
    final = profile(profile_on="final")
    deficits = [final[f"profile/{k}/confidence_deficit"] for k in (0, 1)]
    assert deficits != [before[f"profile/{k}/confidence_deficit"] for k in (0, 1)]
    with pytest.raises(ConfigError, match="profile_on = 'final'"):
        routing_eval(model, _inputs(bundle, clients), **args)


def test_attacked_routing_reports_every_exit_and_the_risk_decomposition() -> None:
    """Beside a policy's accuracy under attack: each exit's accuracy on the attacked inputs
    and the policy's per-exit deferral gain; the gains add up to routed minus exit-1
    accuracy (the decomposition telescopes: Σ_e Pr(D_e)(𝓔_{e|D_e} − 𝓔_{e+1|D_e}) =
    𝓔_1 − risk)."""
    torch.manual_seed(0)
    test = _test_set(per_class=10)
    bundle = DataBundle("t", test, test, 4, (1, 8, 8), ("a", "b", "c", "d"))
    model = build_model("eevit", (1, 8, 8), 4, patch_size=4, embed_dim=16, num_heads=1, depth=3)
    out = routing_adv_eval(model.eval(), _inputs(bundle, [test]), attacks=["pgd"], eps=[0.05],
                           policies=["fixed", "robust"])  # fmt: skip
    key = "route_adv/pgd/0.05"
    assert {f"{key}/exit/{e}/acc" for e in (1, 2, 3)} <= set(out)
    assert out[f"{key}/exit/3/acc"] == out[f"{key}/full/acc"]
    for policy in ("fixed", "robust"):
        assert {f"{key}/{policy}/exit/{e}/deferral_gain" for e in (1, 2)} <= set(out)
        assert f"{key}/{policy}/exit/3/deferral_gain" not in out  # the last exit accepts all
    # The telescoping identity, on the routed decision itself (fixed policy).
    from fedshield.eval.routing_eval import exit_probs as probs_of
    from fedshield.routing import route, routing_metrics

    p = probs_of(model, test.x, 64, torch.device("cpu"))
    m = routing_metrics(p, test.y, route(p, "fixed")[0])
    n = len(test.y)
    total = sum(d.deferral_gain * d.reached / n for d in m.decomposition)
    exit1 = float((p[0].argmax(-1) == test.y).double().mean())
    assert total == pytest.approx(m.accuracy - exit1)


@pytest.mark.parametrize(
    ("key", "value", "message"),
    [
        ("routing.policies", '["robsut"]', "did you mean 'robust'"),
        ("routing_adv.policies", '["client_robust"]', "client-local"),
    ],
)
def test_a_routing_policy_typo_fails_before_any_work(tmp_path, capsys, key, value, message) -> None:
    """A policy-name typo used to surface after the last round's training."""
    from fedshield.cli import main

    out = tmp_path / "run"
    metric = key.split(".")[0]
    argv = [
        "run", "--preset", "eevit-digits-cpu", "--out", str(out), "-q",
        "--set", f'eval.metrics=["{metric}"]', "--set", f"eval.params.{key}={value}",
    ]  # fmt: skip
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and f"eval.params.{key}" in err[0] and message in err[0]
    assert not out.exists()
