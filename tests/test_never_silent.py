"""Issue #25 items 7-10: results that were wrong (or refused too late) while everything said
ok — one test per reproducer, each failing on the code before the fix."""

from __future__ import annotations

import copy
import logging
import math

import numpy as np
import pytest
import torch
from torch import nn

from fedshield.core.client_metrics import robust_metric, robust_metrics
from fedshield.testing import fuzz


@pytest.fixture(autouse=True)
def _quiet():
    logging.disable(logging.WARNING)
    yield
    logging.disable(logging.NOTSET)


def _replay(pair: fuzz.Pair, edit) -> dict:
    pair.sim.state = copy.deepcopy(pair.start)
    pair.sim.records = []
    ups = [fuzz._clone(u) for u in pair.honest]
    edit(ups)
    return pair.sim.end_round(pair.plan, ups, apply_update_attack=False)


# -- 7. what clients report is untrusted ---------------------------------------------------
def test_robust_metric_is_the_float64_median_with_non_finite_as_inf():
    assert robust_metric([1.0, 2.0, 1.7e308, 1.7e308, 3.0]) == 3.0
    assert robust_metric([1.0, "x", [1], True, None]) == 1.0
    assert robust_metric(["x"]) is None
    assert math.isnan(robust_metric([1.0, math.nan, math.inf, 2.0]))  # half diverged
    assert robust_metric([1.0, 2.0, math.nan]) == 2.0  # a minority cannot
    assert robust_metric([torch.tensor(4.0), np.float32(2.0)]) == 3.0
    assert robust_metrics([{"a": 1.0, "n": 5}, {"a": 1e308, "n": 7}, {"a": 1e308}], ["n"]) == {
        "a": 1e308
    }


def test_two_clients_reporting_a_huge_finite_loss_do_not_stop_the_run():
    """Issue #25.7: two ``train/loss = 1.7e308`` overflowed the mean to inf and the run
    stopped as "diverged" after round 1."""
    pair = fuzz.make_pair("fedavg", "median")
    honest = sorted(float(u.metrics["train/loss"]) for u in pair.honest[2:])

    def edit(ups):
        ups[0].metrics = {"train/loss": 1.7e308}
        ups[1].metrics = {"train/loss": 1.7e308}

    m = _replay(pair, edit)
    assert math.isfinite(m["train/loss"]) and honest[0] <= m["train/loss"] <= honest[-1]
    assert not pair.sim.diverged(m)


def test_a_majority_of_diverged_reports_is_still_a_divergence():
    pair = fuzz.make_pair("fedavg", "median")

    def edit(ups):
        for u in ups[: len(ups) // 2 + 1]:
            u.metrics = {"train/loss": float("nan")}

    m = _replay(pair, edit)
    assert math.isnan(m["train/loss"])


def _flower_app(loss_of):
    from flwr.app import Array, ArrayRecord, Message, MetricRecord, RecordDict
    from flwr.clientapp import ClientApp

    app = ClientApp()

    @app.train()
    def _train(msg: Message, context) -> Message:
        k = int(context.node_config["partition-id"])
        arrays = {
            n: Array(a.numpy() + np.float32(0.01 * (k + 1)))
            for n, a in msg.content["arrays"].items()
        }
        metrics = {"num-examples": 1000 if k < 2 else 10, "train_loss": loss_of(k)}
        content = RecordDict(
            {"arrays": ArrayRecord(arrays), "metrics": MetricRecord(metrics)}
        )
        return Message(content, reply_to=msg)

    return app


def test_flower_native_strategy_takes_the_median_of_client_metrics():
    """Flower's default weighted mean of ``train_loss``: two clients with 1.7e308 and
    1000 samples each made it inf; the strategies' default is now the median."""
    pytest.importorskip("flwr")
    from flwr.app import ArrayRecord

    from fedshield.flower import strategies as S
    from fedshield.flower.local import LocalGrid

    torch.manual_seed(0)
    start = ArrayRecord(nn.Linear(3, 2).state_dict())
    strategy = S.Median()
    grid = LocalGrid(5, _flower_app(lambda k: 1.7e308 if k < 2 else float(k)))
    result = strategy.start(grid, start, num_rounds=1)
    # the median of (2, 3, 4, 1.7e308, 1.7e308): the largest honest value, not inf
    assert result.train_metrics_clientapp[1]["train_loss"] == 4.0
