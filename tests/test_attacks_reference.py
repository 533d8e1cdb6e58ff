"""Attacks against reference implementations on seeded random inputs (DRAG paper, Sec. I-A).

* ByzFL (EPFL, ``byzfl`` 0.0.11): SignFlipping, ALittleIsEnough, InnerProductManipulation
  match exactly after choosing parameters; Gaussian only in distribution (it draws from
  torch's global RNG). ByzFL has no Min-Max/Min-Sum, and its Optimal_IPM / Optimal_ALIE
  tune τ to maximise an aggregator's distortion, a different objective, so they are not
  compared.
* Min-Max / Min-Sum: a line-by-line transcription of the NDSS'21 authors' released loop
  (``min_max``/``min_sum`` with ``lamda``, ``lamda_fail``, ``lamda_succ``), run on the CPU
  in float64, with direct distance evaluation at every step.
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import torch

from fedshield import attacks

byzfl = pytest.importorskip("byzfl")


def _cohort(seed: int, s: int = 10, d: int = 64, f: int = 3):
    g = torch.Generator().manual_seed(seed)
    updates = torch.randn(s, d, generator=g, dtype=torch.float64) * 0.1 + 0.02
    mask = torch.zeros(s, dtype=torch.bool)
    mask[torch.randperm(s, generator=g)[:f]] = True
    return updates, mask


# --- ByzFL ------------------------------------------------------------------------------
# ByzFL casts torch input to float32; numpy float64 input keeps full precision, so we feed
# it numpy arrays.


@pytest.mark.parametrize("seed", range(3))
def test_sign_flip_equals_byzfl_on_own_update(seed: int) -> None:
    # ByzFL negates the mean of the vectors it is given; given only the attacker's own
    # update that is exactly the DRAG paper's sign flip −g (k = 1).
    u, m = _cohort(seed)
    out = attacks.build("sign_flip")(u, m)
    for i in torch.nonzero(m).flatten().tolist():
        ref = byzfl.SignFlipping()(u[i : i + 1].numpy())
        np.testing.assert_array_equal(out[i].numpy(), ref)


@pytest.mark.parametrize("seed", range(3))
def test_ipm_equals_byzfl(seed: int) -> None:
    u, m = _cohort(seed)
    out = attacks.build("ipm", epsilon=0.7)(u, m)
    ref = byzfl.InnerProductManipulation(tau=0.7)(u[~m].numpy())
    np.testing.assert_allclose(out[m].numpy(), np.broadcast_to(ref, out[m].shape), rtol=1e-12)


@pytest.mark.parametrize(("seed", "z"), list(itertools.product(range(3), [None, 1.5, -0.3])))
def test_alie_equals_byzfl(seed: int, z: float | None) -> None:
    # ByzFL: μ + τσ (unbiased σ); ours μ − zσ, so τ = −z. z=None is the paper's z_max.
    u, m = _cohort(seed)
    a = attacks.build("alie", z=z)
    out = a(u, m)
    tau = -(z if z is not None else attacks.alie_z(u.shape[0], int(m.sum())))
    ref = byzfl.ALittleIsEnough(tau=float(tau))(u[~m].numpy())
    np.testing.assert_allclose(out[m].numpy(), np.broadcast_to(ref, out[m].shape), atol=1e-14)


def test_noise_matches_byzfl_gaussian_in_distribution() -> None:
    u = torch.zeros(4, 200_000)
    m = torch.tensor([True, False, False, False])
    ours = attacks.build("noise", sigma=0.5)(u, m, generator=torch.Generator().manual_seed(0))[0]
    torch.manual_seed(0)
    theirs = torch.as_tensor(byzfl.Gaussian(mu=0.0, sigma=0.5)(u[~m]))
    for sample in (ours, theirs):
        assert abs(float(sample.mean())) < 5e-3
        assert float(sample.std()) == pytest.approx(0.5, rel=1e-2)
    qs = torch.tensor([0.1, 0.5, 0.9])
    torch.testing.assert_close(ours.quantile(qs), theirs.float().quantile(qs), atol=1e-2, rtol=0)


# --- NDSS'21 reference loop -------------------------------------------------------------


def _ndss_reference(all_updates, model_re, dev_type, rule, score="max"):
    """The authors' min_max/min_sum, transcribed (float64, CPU; ``score`` picks the Min-Sum
    threshold: the released code uses min, the paper's equation max)."""
    if dev_type == "unit_vec":
        deviation = model_re / torch.norm(model_re)
    elif dev_type == "sign":
        deviation = torch.sign(model_re)
    else:
        deviation = torch.std(all_updates, 0)
    lamda = torch.tensor([10.0], dtype=torch.float64)
    threshold_diff = 1e-5
    lamda_fail = lamda
    lamda_succ = 0
    distances = []
    for update in all_updates:
        distance = torch.norm((all_updates - update), dim=1) ** 2
        distances = (
            distance[None, :] if not len(distances) else torch.cat((distances, distance[None, :]))
        )
    max_distance = torch.max(distances)
    scores = torch.sum(distances, dim=1)
    min_score = torch.max(scores) if score == "max" else torch.min(scores)
    while torch.abs(lamda_succ - lamda) > threshold_diff:
        mal_update = model_re - lamda * deviation
        distance = torch.norm((all_updates - mal_update), dim=1) ** 2
        ok = (
            torch.max(distance) <= max_distance
            if rule == "min_max"
            else torch.sum(distance) <= min_score
        )
        if ok:
            lamda_succ = lamda
            lamda = lamda + lamda_fail / 2
        else:
            lamda = lamda - lamda_fail / 2
        lamda_fail = lamda_fail / 2
    return model_re - lamda_succ * deviation, float(lamda_succ)


CASES = list(itertools.product(["min_max", "min_sum"], ["unit_vec", "std", "sign"], range(4)))


@pytest.mark.parametrize(("rule", "vector", "seed"), CASES)
def test_min_max_min_sum_equal_ndss_reference(rule: str, vector: str, seed: int) -> None:
    u, m = _cohort(seed, s=12, d=40, f=4)
    benign = u[~m]
    a = attacks.build(rule, vector=vector)
    out = a(u, m)
    ref_update, ref_gamma = _ndss_reference(benign, benign.mean(0), vector, rule)
    assert a.last_gamma == pytest.approx(ref_gamma, abs=1e-12)
    torch.testing.assert_close(out[m], ref_update.expand(int(m.sum()), -1))


@pytest.mark.parametrize(
    ("vector", "seed"), list(itertools.product(["unit_vec", "std", "sign"], [0, 1]))
)
def test_min_sum_code_bound_equals_released_code(vector: str, seed: int) -> None:
    u, m = _cohort(seed, s=12, d=40, f=4)
    benign = u[~m]
    a = attacks.build("min_sum", vector=vector, bound="min")
    out = a(u, m)
    ref_update, ref_gamma = _ndss_reference(benign, benign.mean(0), vector, "min_sum", "min")
    assert a.last_gamma == pytest.approx(ref_gamma, abs=1e-12)
    torch.testing.assert_close(out[m][0], ref_update)
