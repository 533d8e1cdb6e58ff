"""fedshield.flower.attacker: registered attacks inside a Flower app that is not fedshield's.

A scripted ClientApp (node k returns θ + G_k^t with G seeded by (round, k)) is run in process
(LocalGrid) with the attacker mod on nodes 0 and 1; the final model of the strategy under
attack — Flower's own FedAvg and fedshield's Flower-native Median — is compared with the
aggregate computed directly from the same updates and the attack's rows."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

pytest.importorskip("flwr")

from flwr.app import Array, ArrayRecord, Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp
from flwr.serverapp import strategy as flwr_strategy

import fedshield.aggregators as agg
from fedshield import attacks
from fedshield.attacks import AttackContext
from fedshield.errors import ConfigError
from fedshield.flower import strategies as S
from fedshield.flower.attacker import MARK, AttackedStrategy, attacker_mod
from fedshield.flower.local import LocalGrid

M = 6
ATTACKERS = {0, 1}
COUNTS = [10 + 7 * k for k in range(M)]


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 3)


def initial() -> ArrayRecord:
    torch.manual_seed(0)
    return ArrayRecord(Net().state_dict())


def move(rnd: int, k: int, shape: tuple[int, ...]) -> np.ndarray:
    g = torch.Generator().manual_seed(1000 * rnd + k)
    return (0.1 * (1 + k % 3) * torch.randn(shape, generator=g) + 0.05).numpy()


def app_with(mod) -> ClientApp:
    app = ClientApp(mods=[mod])

    @app.train()
    def _train(msg: Message, context: Context) -> Message:
        k = int(context.node_config["partition-id"])
        rnd = int(msg.content["config"]["server-round"])
        start = msg.content["arrays"]
        arrays = {
            n: Array(a.numpy() + move(rnd, 10 * k + i, a.numpy().shape))
            for i, (n, a) in enumerate(start.items())
        }
        content = RecordDict(
            {"arrays": ArrayRecord(arrays), "metrics": MetricRecord({"num-examples": COUNTS[k]})}
        )
        return Message(content, reply_to=msg)

    return app


def updates(rnd: int, start: ArrayRecord) -> torch.Tensor:
    """``[M, d]`` honest pseudo-gradients of round ``rnd`` (partition order), float64."""
    rows = []
    for k in range(M):
        rows.append(
            np.concatenate(
                [
                    move(rnd, 10 * k + i, a.numpy().shape).reshape(-1).astype(np.float64)
                    for i, (_, a) in enumerate(start.items())
                ]
            )  # fmt: skip
        )
    return torch.from_numpy(np.stack(rows))


def flat_model(record: ArrayRecord) -> torch.Tensor:
    return torch.cat(
        [torch.from_numpy(record[k].numpy()).double().reshape(-1) for k in ("fc.weight", "fc.bias")]
    )


def mask() -> torch.Tensor:
    return torch.tensor([k in ATTACKERS for k in range(M)])


def test_row_local_attack_in_flowers_fedavg_with_the_mod_alone() -> None:
    mod = attacker_mod("sign_flip", ATTACKERS, {"k": 2.0})
    result = flwr_strategy.FedAvg().start(LocalGrid(M, app_with(mod)), initial(), num_rounds=1)
    g = updates(1, initial())
    g[mask()] *= -2.0
    w = torch.tensor(COUNTS, dtype=torch.float64)
    expected = flat_model(initial()) + (w / w.sum()) @ g
    torch.testing.assert_close(flat_model(result.arrays), expected, rtol=1e-5, atol=1e-5)


def test_omniscient_attack_against_fedshield_median_and_flowers_fedavg() -> None:
    mod = attacker_mod("alie", ATTACKERS, rewritten_by_strategy=True)
    g = updates(1, initial())
    forged = attacks.build("alie")(g, mask())
    theta = flat_model(initial())
    median = S.Median()
    wrapped = AttackedStrategy(median, "alie")
    result = wrapped.start(LocalGrid(M, app_with(mod)), initial(), num_rounds=1)
    assert wrapped.last_byzantine == 2
    expected = theta + agg.build("median")(forged)
    torch.testing.assert_close(flat_model(result.arrays), expected, rtol=1e-5, atol=1e-5)
    # The same attack against Flower's own FedAvg (sample-weighted mean).
    result = AttackedStrategy(flwr_strategy.FedAvg(), "alie").start(
        LocalGrid(M, app_with(mod)), initial(), num_rounds=1
    )
    w = torch.tensor(COUNTS, dtype=torch.float64)
    torch.testing.assert_close(
        flat_model(result.arrays), theta + (w / w.sum()) @ forged, rtol=1e-5, atol=1e-5
    )


def test_defense_aware_attack_gets_the_strategys_rule() -> None:
    mod = attacker_mod("alie_opt", ATTACKERS, rewritten_by_strategy=True)
    g = updates(1, initial())
    theta = flat_model(initial())
    rule = agg.build("median")
    forged = attacks.build("alie_opt")(g, mask(), context=AttackContext(rule=rule))
    median = S.Median()
    wrapped = AttackedStrategy(median, "alie_opt")
    assert wrapped._rule() is median.server.aggregator  # fedshield strategies expose theirs
    result = wrapped.start(LocalGrid(M, app_with(mod)), initial(), num_rounds=1)
    torch.testing.assert_close(
        flat_model(result.arrays), theta + rule(forged), rtol=1e-5, atol=1e-5
    )
    # Against Flower's FedAvg the default rule is the sample-weighted mean; rule= overrides.
    fedavg = AttackedStrategy(flwr_strategy.FedAvg(), "alie_opt", rule="median")
    assert fedavg._rule().__class__.__name__ == "Median"


def test_without_the_wrapper_the_mark_reaches_the_strategy_and_marks_are_stripped() -> None:
    mod = attacker_mod("min_max", ATTACKERS, rewritten_by_strategy=True)
    app = app_with(mod)
    grid = LocalGrid(M, app)
    seen = []

    class Spy(flwr_strategy.FedAvg):
        def aggregate_train(self, server_round, replies):
            replies = list(replies)
            seen.extend(MARK in m.content for m in replies)
            return super().aggregate_train(server_round, replies)

    AttackedStrategy(Spy(), "min_max").start(grid, initial(), num_rounds=1)
    assert seen == [False] * M  # the wrapper strips the marks before your strategy


def test_an_attack_the_mod_cannot_apply_alone_is_refused_at_construction() -> None:
    """``attacker_mod("alie")`` without an AttackedStrategy only marked the
    replies, which Flower's strategies ignore: the run was silently unattacked."""
    for name in ("alie", "min_max", "alie_opt", "noise"):
        with pytest.raises(ConfigError, match=f"attacker_mod\\('{name}'\\).*AttackedStrategy"):
            attacker_mod(name, ATTACKERS)
    attacker_mod("sign_flip", ATTACKERS)  # row-local: the mod applies it itself


def test_data_attack_poisons_only_the_chosen_nodes() -> None:
    mod = attacker_mod("label_flip", ATTACKERS)
    x, y = torch.zeros(4, 2), torch.tensor([0, 1, 2, 3])
    attacker = Context(0, 7, {"partition-id": 1}, RecordDict(), {})
    honest = Context(0, 8, {"partition-id": 4}, RecordDict(), {})
    assert torch.equal(mod.poison(attacker, x, y, 4)[1], torch.tensor([3, 2, 1, 0]))
    assert torch.equal(mod.poison(honest, x, y, 4)[1], y)
    with pytest.raises(ValueError, match="data attack"):
        AttackedStrategy(flwr_strategy.FedAvg(), "label_flip")
