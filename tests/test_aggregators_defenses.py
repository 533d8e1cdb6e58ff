"""DnC, SignGuard, ClippedClustering, RLR and FLAME: worked examples from their papers, and
robust behaviour of every defense of docs/defenses.md under a few simple attacks. (Finiteness on
1e30 / 3e38 rows, NaN rows, dtypes, permutations and degraded row counts: the registry-wide
conformance tests of tests/test_aggregators.py.)"""

from __future__ import annotations

import pytest
import torch

import fedshield.aggregators as agg

NEW_ROBUST = ["mda", "meamed", "monna", "caf", "smea", "dnc", "signguard",
              "clippedclustering", "flame"]  # fmt: skip


def honest_rows(n: int, d: int, seed: int = 0) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(n, d, generator=gen, dtype=torch.float64) * 0.5 + 1.0


def test_dnc_removes_a_planted_outlier_direction() -> None:
    gen = torch.Generator().manual_seed(3)
    h = honest_rows(16, 30_000)
    v = torch.randn(30_000, generator=gen, dtype=torch.float64).sign()
    bad = h.mean(0) + 0.5 * v + 0.01 * torch.randn(4, 30_000, generator=gen, dtype=torch.float64)
    x = torch.cat([bad, h])
    out, diag = agg.build("dnc", f=4, sub_dim=10_000).aggregate(x)
    assert diag["agg/num_selected"] == 16 and diag["agg/fallback"] == 0
    torch.testing.assert_close(out, h.mean(0))
    # the coordinate draw is a function of the rows: the same in any order
    torch.testing.assert_close(agg.build("dnc", f=4, sub_dim=10_000)(x.flip(0)), out)


def test_dnc_with_every_coordinate_is_one_svd_filter() -> None:
    x = torch.tensor([[1.0, 0.0], [1.1, 0.1], [0.9, -0.1], [1.0, 0.1], [9.0, 9.0]])
    out, diag = agg.build("dnc", f=1).aggregate(x)
    torch.testing.assert_close(out, x[:4].mean(0))
    assert diag["agg/num_selected"] == 4


def test_signguard_filters_a_scaled_row_and_sign_flipped_rows() -> None:
    h = honest_rows(16, 2_000)
    x = torch.cat([-h[:3], 20.0 * h[3:4], h])  # 3 sign flipped, 1 scaled ×20
    out, diag = agg.build("signguard").aggregate(x)
    assert diag["agg/norm_filtered"] == 1 and diag["agg/sign_filtered"] == 3
    assert diag["agg/num_selected"] == 16
    m = float(x.norm(dim=1).sort().values[9:11].mean())  # 20 rows: mean of the middle two
    expected = (h * (m / h.norm(dim=1)).clamp(max=1.0)[:, None]).mean(0)
    torch.testing.assert_close(out, expected)


def test_clippedclustering_keeps_the_majority_direction_and_clips_to_the_norm_history() -> None:
    h = honest_rows(14, 500)
    x = torch.cat([-5.0 * h[:6], h])
    rule = agg.build("clippedclustering")
    out, diag = rule.aggregate(x)
    assert diag["agg/num_selected"] == 14
    tau1 = diag["agg/tau"]
    norms1 = x.norm(dim=1)
    assert tau1 == pytest.approx(float(norms1.sort().values[9:11].mean()))
    expected = (h * (tau1 / h.norm(dim=1)).clamp(max=1.0)[:, None]).mean(0)
    torch.testing.assert_close(out, expected)
    # the next round's radius is the median of both rounds' norms (Blades keeps the history)
    out2, diag2 = rule.aggregate(0.1 * h)
    both = torch.cat([norms1, (0.1 * h).norm(dim=1)])
    assert diag2["agg/tau"] == pytest.approx(float(both.sort().values[16:18].mean()))
    assert diag2["agg/clipped"] == 0.0  # 0.1·h is far below the history's median


def test_rlr_flips_the_coordinates_of_low_sign_agreement() -> None:
    x = torch.tensor(
        [[1.0, 1.0, 1.0], [1.0, -1.0, 1.0], [1.0, 1.0, -1.0], [1.0, -1.0, -1.0], [1.0, 1.0, 1.0]]
    )
    out, diag = agg.build("rlr", theta=3).aggregate(x)
    # agreements |Σ sign|: 5, 1, 1 → only the first keeps its sign
    torch.testing.assert_close(out, torch.tensor([1.0, -0.2, -0.2]))
    assert diag["agg/flipped"] == pytest.approx(2 / 3)
    # default θ = ⌈0.4·S⌉ = 2 of 5: still flips agreement 1
    torch.testing.assert_close(agg.build("rlr")(x), torch.tensor([1.0, -0.2, -0.2]))
    # weights: the FedAvg mean, flipped
    w = torch.tensor([1.0, 1.0, 1.0, 1.0, 4.0])
    torch.testing.assert_close(agg.build("rlr", theta=3)(x, w), torch.tensor([1.0, -0.5, -0.5]))


def test_rlr_turns_a_minority_backdoor_push_against_itself() -> None:
    h = honest_rows(8, 50)
    # on the backdoor coordinates the honest clients disagree: 4 push up, 4 down
    h[:, 40:] = 0.1 * torch.tensor([1.0, -1.0] * 4, dtype=torch.float64)[:, None]
    bad = h[:2].clone()
    bad[:, 40:] = 3.0  # the backdoor coordinates, where honest signs disagree
    x = torch.cat([bad, h])
    out = agg.build("rlr", theta=4)(x)
    mean = x.mean(0)
    assert bool((out[40:] < 0).all()) and bool((mean[40:] > 0).all())
    torch.testing.assert_close(out[:40], mean[:40])  # agreed coordinates untouched


def test_flame_drops_the_colluding_cluster_clips_and_adds_its_noise() -> None:
    gen = torch.Generator().manual_seed(7)
    h = honest_rows(16, 1_000)
    backdoor = torch.randn(1_000, generator=gen, dtype=torch.float64) * 3.0
    bad = backdoor + 0.05 * torch.randn(4, 1_000, generator=gen, dtype=torch.float64)
    x = torch.cat([bad, h])
    quiet, diag = agg.build("flame", noise=0.0).aggregate(x)
    assert diag["agg/num_selected"] <= 16 and diag["agg/fallback"] == 0
    s_t = float(x.norm(dim=1).sort().values[9:11].mean())
    assert diag["agg/tau"] == pytest.approx(s_t)
    assert float(quiet @ backdoor) / float(quiet.norm() * backdoor.norm()) < 0.1
    noisy, diag = agg.build("flame").aggregate(x)
    assert diag["agg/noise_std"] == pytest.approx(0.001 * s_t)
    spread = float((noisy - quiet).std())
    assert 0.8 * 0.001 * s_t < spread < 1.2 * 0.001 * s_t
    torch.testing.assert_close(agg.build("flame")(x), noisy)  # a function of the input
    other = agg.build("flame")(torch.cat([bad, 1.01 * h]))
    assert not torch.allclose(other - agg.build("flame", noise=0.0)(torch.cat([bad, 1.01 * h])),
                              noisy - quiet)  # fresh noise for other rows  # fmt: skip


def test_foolsgold_gives_sybils_with_identical_updates_weight_zero() -> None:
    gen = torch.Generator().manual_seed(9)
    h = honest_rows(10, 500) - 1.0 + 0.2  # honest clients: their own directions
    sybil = torch.randn(500, generator=gen, dtype=torch.float64) * 2.0
    x = torch.cat([sybil.expand(4, -1), h])
    out, diag = agg.build("foolsgold").aggregate(x)
    assert diag["agg/num_zero_weight"] == 4
    # the honest rows are about equally unlike each other: the logit saturates at 1
    torch.testing.assert_close(out, h.mean(0))
    # pardoning: a client merely similar to one sybil keeps a positive weight
    from fedshield.aggregators._cluster import FiniteRows
    from fedshield.aggregators.foolsgold import foolsgold_weights

    own = honest_rows(1, 500, seed=5)[0] - 0.8
    y = torch.cat([x, (0.2 * sybil + own)[None]])  # cos ≈ 0.6 to the sybils
    alpha = foolsgold_weights(FiniteRows("t", y).cosine_distances())
    assert bool((alpha[:4] == 0).all()) and float(alpha[-1]) > 0
    # every row identical (consensus): every α is 0 (cos = 1), and the mean is returned
    out, diag = agg.build("foolsgold").aggregate(torch.ones(5, 3))
    torch.testing.assert_close(out, torch.ones(3))
    assert diag["agg/fallback"] == 1.0


def _attacked(kind: str, h: torch.Tensor, f: int) -> torch.Tensor:
    if kind == "sign_flip":
        bad = -4.0 * h[:f]
    elif kind == "huge":
        bad = 1e6 * torch.ones(f, h.shape[1], dtype=h.dtype)
    else:  # "collude": f identical rows far along one direction
        bad = (h.mean(0) + 6.0 * h.std(0)).expand(f, -1)
    return torch.cat([bad, h])


@pytest.mark.parametrize("kind", ["sign_flip", "huge", "collude"])
@pytest.mark.parametrize("name", NEW_ROBUST)
def test_new_defenses_stay_near_the_honest_mean_under_simple_attacks(name: str, kind: str) -> None:
    h = honest_rows(15, 200, seed=11)
    x = _attacked(kind, h, 5)
    rule = (
        agg.build(name)
        if name in ("signguard", "clippedclustering", "flame")
        else agg.build(name, f=5)
    )
    ref = h[0] if rule.needs_reference else None
    out = rule(x, reference=ref)
    target = h.mean(0)
    err = float((out - target).norm())
    assert err < 0.5 * float(target.norm()), (name, kind, err)
    assert err < 0.5 * float((x.mean(0) - target).norm()), (name, kind, err)


BALL = ["mda", "monna", "caf", "smea", "dnc", "signguard", "clippedclustering", "flame",
        "foolsgold", "rlr"]  # fmt: skip


@pytest.mark.parametrize("name", BALL)
def test_central_dp_sensitivity_is_the_ball_of_the_clip(name: str) -> None:
    """[privacy.central] clips rows to C: these rules' aggregates stay in the ball of radius
    C (convex combinations of rows, or RLR's mean with coordinates negated), so Δ₂ = 2C."""
    from fedshield.privacy.sensitivity import sensitivity

    c = 2.0
    for seed in range(5):
        x = honest_rows(11, 40, seed) * torch.rand(11, 1, dtype=torch.float64) * 3
        x = x * (c / x.norm(dim=1)).clamp(max=1.0)[:, None]
        rule = agg.build(name, noise=0.0) if name == "flame" else agg.build(name)
        out = rule(x, reference=x[0] if rule.needs_reference else None)
        assert float(out.norm()) <= c * (1 + 1e-9), (name, seed)
    assert sensitivity(agg.build(name), c, 11).value == 2 * c
