"""The ``trajectory`` round defense: uploads judged against the moving average of the
steps applied in earlier rounds (worked examples of eqs. 1 and 2 of its module)."""

from __future__ import annotations

import pytest
import torch

from fedshield.core.context import ClientUpdate, RoundContext
from fedshield.crossround import build
from fedshield.crossround.base import BoundInput
from fedshield.crossround.trajectory import trajectory_cosines

CPU = torch.device("cpu")
D = 16


def ctx(rnd: int, cohort: tuple[int, ...]) -> RoundContext:
    return RoundContext(rnd, cohort, (), 0, 20, CPU)


def upload(cid: int, delta: torch.Tensor) -> ClientUpdate:
    return ClientUpdate(cid, delta.to(torch.float32), 1, torch.zeros(0))


def apply(defense, state: dict, rows: list[ClientUpdate], step: torch.Tensor, rnd: int) -> dict:
    """One round: θ moves from 0 by ``step`` (η_g = 1); returns the merged state and the
    round's metrics under ``"metrics"``."""
    theta = torch.zeros(D)
    after, acted = defense.bound(
        BoundInput(theta, theta + step, rows, 1.0, rows), state, ctx(rnd, ())
    )
    assert torch.equal(after, theta + step)  # it judges; it never changes the step
    return {**state, **acted.state, "metrics": acted.metrics}


def test_cosines_worked_example() -> None:
    rows = torch.tensor([[1.0, 0.0], [0.0, 2.0], [-3.0, 0.0], [0.0, 0.0], [1.0, 1.0]])
    cos = trajectory_cosines(rows, torch.tensor([2.0, 0.0]))
    assert cos.tolist() == pytest.approx([1.0, 0.0, -1.0, 0.0, 2**-0.5])
    assert trajectory_cosines(rows, torch.zeros(2)).tolist() == [0.0] * 5


def test_the_average_is_beta_times_the_last_plus_one_minus_beta_times_the_step() -> None:
    traj = build("trajectory", beta=0.5)
    rows = [upload(k, torch.ones(D)) for k in range(4)]
    s = apply(traj, {}, rows, torch.full((D,), 2.0), 1)
    torch.testing.assert_close(s["trajectory/ema"], torch.full((D,), 2.0))
    s = apply(traj, s, rows, torch.full((D,), 4.0), 2)
    torch.testing.assert_close(s["trajectory/ema"], torch.full((D,), 3.0))  # ½·2 + ½·4
    s = apply(traj, s, rows, torch.zeros(D), 3)  # a round that did not move θ
    torch.testing.assert_close(s["trajectory/ema"], torch.full((D,), 3.0))


def test_sign_flippers_are_suspended_on_their_second_upload_and_honest_clients_are_not() -> None:
    """Honest rows scatter around a common direction (cosine with it 0.3-0.8); flippers
    upload the negation of such a row. The first round only records the
    trajectory; each later upload is judged against it, and two flags in a row (1, then
    1.8 ≥ 1.5) suspend a client."""
    g = torch.Generator().manual_seed(0)
    direction = torch.zeros(D)
    direction[0] = 1.0
    traj = build("trajectory")  # γ = 0.1, β = 0.8, λ = 0.8, threshold 1.5

    def cohort() -> list[ClientUpdate]:
        own = direction + 0.4 * torch.randn(10, D, generator=g)
        own[7:] = -own[7:]  # clients 7, 8, 9 flip their own update
        return [upload(k, own[k]) for k in range(10)]

    state: dict = {}
    for rnd in range(1, 4):
        rows = cohort()
        state = apply(traj, state, rows, direction, rnd)
        if rnd == 1:
            assert "defense/trajectory/flagged" not in state["metrics"]  # no trajectory yet
    left, acted = traj.rows(rows, state, ctx(4, tuple(range(10))))
    assert [u.client_id for u in left] == list(range(7))
    assert acted.metrics["defense/trajectory/suspended"] == 3.0
    assert acted.identified == 0  # suspicion alone does not lower the rule's f


@pytest.mark.parametrize(
    "ema",
    [torch.zeros(D + 1), torch.zeros(D, dtype=torch.float64), torch.full((D,), float("nan"))],
    ids=["shape", "dtype", "non-finite"],
)
def test_malformed_stored_average_starts_over_and_says_so(ema: torch.Tensor) -> None:
    traj = build("trajectory")
    rows = [upload(k, torch.ones(D)) for k in range(4)]
    s = apply(traj, {"trajectory/ema": ema}, rows, torch.ones(D), 2)
    assert s["metrics"]["defense/trajectory/reset"] == 1.0
    torch.testing.assert_close(s["trajectory/ema"], torch.ones(D))  # restarted from this step
