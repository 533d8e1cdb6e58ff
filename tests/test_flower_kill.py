"""SuperNodes that die mid-run meet the Flower-native strategies' round step (docs/faults.md,
docs/deployment.md): 10 nodes served by Flower's in-process grid
(:class:`~fedshield.flower.local.LocalGrid`, which answers a raising ClientApp with an error reply
as a SuperNode does); nodes 0 and 1 are Byzantine and always answer with a 1e30-scaled model; from
round 2 on, some honest nodes are killed: their ClientApp raises (a crashed app: an error reply) or
their reply never comes back (a dead SuperNode: the grid times out without it).

Asserted: every round completes, θ stays finite and within 10× the clean run's step, the
strategy's ``sys/f`` is the sampled cohort's in every round, and the metrics count the
missing replies (``sys/failures`` for error replies, ``sys/kept`` for what was kept).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable

import numpy as np
import pytest
import torch

pytest.importorskip("flwr")

from flwr.app import Array, ArrayRecord, Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp

from fedshield.flower import catalogue as C
from fedshield.flower.arrays import ModelLayout
from fedshield.flower.local import LocalGrid
from fedshield.testing import flower_fuzz as ff

NODES, ROUNDS, BYZ = 10, 3, (0, 1)


def app(crashed: set[int]) -> ClientApp:
    """Partition k replies θ + a seeded step of 0.1; Byzantine ones 1e30 everywhere; a
    crashed one raises from round 2 on."""
    a = ClientApp()

    @a.train()
    def _train(msg: Message, context: Context) -> Message:
        k = int(context.node_config["partition-id"])
        rnd = int(msg.content["config"]["server-round"])
        if k in crashed and rnd >= 2:
            raise RuntimeError(f"node {k} crashed")
        start = msg.content["arrays"]
        if k in BYZ:
            arrays = {n: np.full_like(v.numpy(), 1e30) for n, v in start.items()}
        else:
            arrays = ff._moved(start, 1000 * rnd + k, 0.1)
        content = RecordDict({"arrays": ArrayRecord({n: Array(v) for n, v in arrays.items()}),
                              "metrics": MetricRecord({"num-examples": 20})})  # fmt: skip
        return Message(content, reply_to=msg)

    return a


class DeadNodes(LocalGrid):
    """A grid on which the SuperNodes of ``dead`` partitions stop answering from round 2:
    their instructions are sent, no reply comes back before the timeout."""

    def __init__(self, crashed: set[int], dead: set[int]) -> None:
        super().__init__(NODES, app(crashed))
        self.dead = {n for n, c in self.contexts.items() if c.node_config["partition-id"] in dead}
        self.round = 0

    def send_and_receive(
        self, messages: Iterable[Message], *, timeout: float | None = None
    ) -> Iterable[Message]:
        msgs = list(messages)
        replies = list(super().send_and_receive(msgs, timeout=timeout))
        rnd = {int(m.content["config"]["server-round"]) for m in msgs if "config" in m.content}
        if rnd and min(rnd) >= 2:
            replies = [r for r in replies if r.metadata.src_node_id not in self.dead]
        return replies


def _run(make, crashed: set[int], dead: set[int]) -> tuple[list[float], dict[int, dict]]:
    grid = DeadNodes(crashed, dead)
    arrays = ff._initial()
    layout = ModelLayout.of(arrays)
    strategy = make()
    seen: list[torch.Tensor] = [layout.decode(arrays)[0]]
    metrics: dict[int, dict] = {}
    real = strategy.aggregate_train

    def spy(server_round: int, replies: Iterable[Message]):
        new, m = real(server_round, list(replies))
        metrics[server_round] = dict(m or {})
        if new is not None:
            seen.append(layout.decode(new)[0])
        else:
            seen.append(seen[-1])
        return new, m

    strategy.aggregate_train = spy  # type: ignore[method-assign]
    strategy.start(grid, arrays, num_rounds=ROUNDS)
    steps = [float((b.double() - a.double()).norm()) for a, b in zip(seen, seen[1:])]
    assert all(torch.isfinite(t).all() for t in seen)
    return steps, metrics


STRATEGIES = {"Median": C.Median, "Krum": C.Krum, "TrimmedMean": C.TrimmedMean,
              "GeoMed": C.GeoMed, "CenteredClipping": C.CenteredClipping}  # fmt: skip


@pytest.mark.parametrize("name", sorted(STRATEGIES))
def test_killed_supernodes_mid_run(name: str) -> None:
    logging.disable(logging.WARNING)
    try:
        clean, clean_m = _run(STRATEGIES[name], set(), set())
        # 3 honest apps crash and 3 honest SuperNodes die: 6 of 8 honest (75 %) missing
        steps, m = _run(STRATEGIES[name], {2, 3, 4}, {5, 6, 7})
    finally:
        logging.disable(logging.NOTSET)
    assert len(steps) == ROUNDS and sorted(m) == list(range(1, ROUNDS + 1))  # every round ran
    top = max(clean)
    assert max(steps) <= 10 * top, (name, steps, clean)
    for rnd in range(1, ROUNDS + 1):
        assert m[rnd]["sys/f"] == clean_m[rnd]["sys/f"] >= 1  # the sampled cohort's f
    for rnd in (2, 3):
        assert m[rnd]["sys/failures"] == 3.0  # the crashed apps' error replies
        assert m[rnd]["sys/kept"] <= NODES - 6  # 4 answered: 2 attackers, 2 honest
    assert m[1]["sys/failures"] == 0.0 and m[1].get("sys/kept") == clean_m[1].get("sys/kept")
