"""Attacks of the DRAG paper, Sec. I-A: worked examples, the Min-Max/Min-Sum γ search, registry
conformance and parameter validation. Reference-implementation checks live in
test_attacks_reference.py."""

from __future__ import annotations

import itertools

import pytest
import torch

from fedshield import attacks
from fedshield.attacks import ATTACKS, DataAttack, UpdateAttack, find_gamma, halving_search
from fedshield.attacks.minmax import perturbation
from fedshield.errors import ConfigError

UPDATE_ATTACKS = [n for n in ATTACKS.package_names() if ATTACKS.get(n).kind == "update"]


def _cohort(s: int = 7, d: int = 13, f: int = 2, dtype=torch.float64, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    updates = torch.randn(s, d, generator=g, dtype=dtype) + 0.5
    mask = torch.zeros(s, dtype=torch.bool)
    mask[torch.randperm(s, generator=g)[:f]] = True
    return updates, mask


# --- registry / build -----------------------------------------------------------------


def test_registry_lists_every_spec_attack() -> None:
    expected = {"noise", "sign_flip", "scaling", "min_max", "min_sum", "alie", "ipm"}
    assert expected <= set(UPDATE_ATTACKS)
    assert "label_flip" in attacks.names()
    assert isinstance(attacks.build("label_flip"), DataAttack)
    assert all(isinstance(attacks.build(n), UpdateAttack) for n in UPDATE_ATTACKS)


def test_build_drops_none_and_rejects_unknown_kwargs() -> None:
    assert attacks.build("noise", sigma=None).sigma == 1.0
    with pytest.raises(ConfigError, match="attack.params.sgima: unknown key .did you mean 'sigma'"):
        attacks.build("noise", sgima=2.0)
    with pytest.raises(KeyError, match="did you mean 'min_max'"):
        attacks.build("minmax")


# --- worked examples -------------------------------------------------------------------


def test_sign_flip_and_scaling_exact() -> None:
    u = torch.tensor([[1.0, -2.0, 3.0], [4.0, 5.0, -6.0], [0.5, 0.0, 1.0]])
    m = torch.tensor([False, True, True])
    out = attacks.build("sign_flip")(u, m)
    assert torch.equal(out, torch.tensor([[1.0, -2.0, 3.0], [-4.0, -5.0, 6.0], [-0.5, 0.0, -1.0]]))
    out = attacks.build("sign_flip", k=2)(u, m)
    assert torch.equal(out[1], torch.tensor([-8.0, -10.0, 12.0]))
    out = attacks.build("scaling", k=3)(u, m)
    assert torch.equal(out[2], torch.tensor([1.5, 0.0, 3.0])) and torch.equal(out[0], u[0])


def test_ipm_and_alie_worked_example() -> None:
    u = torch.tensor([[1.0, 2.0], [3.0, 6.0], [9.0, 9.0]], dtype=torch.float64)
    m = torch.tensor([False, False, True])  # benign mean (2, 4), unbiased std (√2, 2√2)
    out = attacks.build("ipm", epsilon=0.5)(u, m)
    assert torch.equal(out[2], torch.tensor([-1.0, -2.0], dtype=torch.float64))
    out = attacks.build("alie", z=1.0)(u, m)
    expected = torch.tensor([2 - 2**0.5, 4 - 2 * 2**0.5], dtype=torch.float64)
    torch.testing.assert_close(out[2], expected)


def test_alie_z_formula() -> None:
    # Baruch et al.: s = floor(n/2 + 1) - f, z = Φ⁻¹((n - s)/n).  n=50, f=12 → s=14, Φ⁻¹(0.72).
    assert attacks.alie_z(50, 12) == pytest.approx(0.5828415, abs=1e-6)
    assert attacks.alie_z(2, 1) == pytest.approx(0.0)  # s=1 → Φ⁻¹(1/2)
    # Attacker majority: the paper's s <= 0 gives +inf; we cap s at 1 (finite z).
    assert attacks.alie_z(10, 7) == pytest.approx(attacks.alie_z(10, 5))
    assert attacks.alie_z(1, 1) == 0.0
    a = attacks.build("alie")
    u, m = _cohort(s=10, f=3)
    a(u, m)
    assert a.last_z == pytest.approx(attacks.alie_z(10, 3))


def test_label_flip_maps_l_to_L_minus_l_minus_1() -> None:
    x = torch.randn(5, 3)
    y = torch.tensor([0, 9, 4, 5, 1])
    x2, y2 = attacks.build("label_flip").poison(x, y, 10)
    assert x2 is x and torch.equal(y2, torch.tensor([9, 0, 5, 4, 8]))
    assert torch.equal(y, torch.tensor([0, 9, 4, 5, 1]))  # input untouched
    _, y3 = attacks.build("label_flip").poison(x, torch.tensor([0, 1, 2]), 3)
    assert torch.equal(y3, torch.tensor([2, 1, 0])) and y3.dtype == torch.int64
    with pytest.raises(ValueError, match="labels must lie"):
        attacks.build("label_flip").poison(x, torch.tensor([10]), 10)


def test_noise_is_seeded_and_leaves_benign_rows() -> None:
    u, m = _cohort(s=6, d=4000, f=3, dtype=torch.float32)
    a = attacks.build("noise", sigma=2.0)
    out1 = a(u, m, generator=torch.Generator().manual_seed(7))
    out2 = a(u, m, generator=torch.Generator().manual_seed(7))
    out3 = a(u, m, generator=torch.Generator().manual_seed(8))
    assert torch.equal(out1, out2) and not torch.equal(out1[m], out3[m])
    assert torch.equal(out1[~m], u[~m])
    noise = out1[m]
    assert abs(float(noise.mean())) < 0.05 and float(noise.std()) == pytest.approx(2.0, rel=0.03)
    assert not torch.equal(noise[0], noise[1])  # each attacker draws its own vector


# --- Min-Max / Min-Sum ------------------------------------------------------------------


def _constraint(benign: torch.Tensor, mal: torch.Tensor, rule: str) -> bool:
    """The DRAG paper, Sec. I-A constraint, evaluated directly (no shortcut) in float64."""
    benign, mal = benign.double(), mal.double()
    pair = torch.cdist(benign, benign, compute_mode="donot_use_mm_for_euclid_dist") ** 2
    dist = ((benign - mal) ** 2).sum(dim=1)
    if rule == "min_max":
        return bool(dist.max() <= pair.max())
    return bool(dist.sum() <= pair.sum(dim=1).max())


@pytest.mark.parametrize(
    ("rule", "vector"), list(itertools.product(attacks.minmax.RULES, attacks.minmax.VECTORS))
)
def test_gamma_satisfies_constraint_and_is_maximal(rule: str, vector: str) -> None:
    u, m = _cohort(s=9, d=50, f=3)
    a = attacks.build(rule, vector=vector)
    out = a(u, m)
    benign, gamma, tau = u[~m], a.last_gamma, a.tau
    assert gamma is not None and 0 < gamma < 2 * a.gamma_init
    mal = out[m]
    assert torch.equal(mal, mal[:1].expand_as(mal))  # every attacker uploads the same vector
    assert torch.equal(out[~m], benign)
    p = perturbation(benign, vector)
    torch.testing.assert_close(mal[0], benign.mean(0) + gamma * p)
    assert _constraint(benign, mal[0], rule)
    # Maximal to τ: the search guarantees γ* < γ + 2τ (or it stopped at the ceiling 2γ_init).
    if gamma < 2 * a.gamma_init - 2 * tau:
        assert not _constraint(benign, benign.mean(0) + (gamma + 2 * tau) * p, rule)


def test_gamma_ceiling_and_floor() -> None:
    # Benign cloud far wider than 2γ_init along a unit direction: even γ_init passes, the
    # search climbs towards (never reaches) 2γ_init, as the reference does.
    u, m = _cohort(s=8, d=30, f=2)
    u = u * 1000
    a = attacks.build("min_max", vector="unit_vec")
    a(u, m)
    assert 2 * a.gamma_init - 2 * a.tau < a.last_gamma < 2 * a.gamma_init
    # Identical benign rows: nothing but γ = 0 fits, so the attackers upload ḡ itself.
    row = torch.tensor([1.0, -2.0, 3.0], dtype=torch.float64)
    u = torch.stack([row, row, row, -row])
    m = torch.tensor([False, False, False, True])
    out = a(u, m)
    assert a.last_gamma == 0.0 and torch.equal(out[3], row)


def test_halving_search_matches_spec_loop() -> None:
    target = 3.14159
    gamma = halving_search(lambda g: g <= target, 10.0, 1e-5)
    assert target - 2e-5 < gamma <= target
    assert halving_search(lambda g: False, 10.0, 1e-5) == 0.0


def test_find_gamma_is_pure_and_rejects_bad_rule() -> None:
    u, m = _cohort()
    benign = u[~m]
    before = benign.clone()
    p = perturbation(benign, "std")
    assert find_gamma(benign, p, "min_sum") == find_gamma(benign, p, "min_sum")
    assert torch.equal(benign, before)
    with pytest.raises(ValueError, match="rule"):
        find_gamma(benign, p, "krum")


def test_min_sum_min_bound_is_stricter() -> None:
    u, m = _cohort(s=10, f=3)
    paper, code = attacks.build("min_sum"), attacks.build("min_sum", bound="min")
    paper(u, m)
    code(u, m)
    assert code.last_gamma <= paper.last_gamma


# Conformance over the update-attack registry (benign rows untouched, finite, deterministic,
# edge cohorts, the omniscient tag and needs_own_update) lives in test_conformance.py.


# --- parameter validation -----------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "kwargs", "match"),
    [
        ("noise", {"sigma": 0.0}, r"attack.params.sigma: Input should be greater than 0"),
        ("noise", {"sigma": -1.0}, "sigma"),
        ("noise", {"sigma": float("nan")}, "sigma: Input should be a finite number"),
        ("noise", {"sigma": True}, "sigma: Input should be a valid number"),
        ("noise", {"sigma": "1"}, "sigma: Input should be a valid number"),
        ("sign_flip", {"k": 0}, "k: Input should be greater than 0"),
        ("scaling", {"k": float("inf")}, "k: Input should be a finite number"),
        ("ipm", {"epsilon": -0.1}, "epsilon"),
        ("alie", {"z": float("nan")}, "z: Input should be a finite number"),
        ("min_max", {"vector": "gauss"}, "vector: Input should be 'unit_vec', 'std' or 'sign'"),
        ("min_sum", {"vector": None, "gamma_init": 0}, "gamma_init"),
        ("min_max", {"tau": 0.0}, "tau"),
        ("min_max", {"tau": 20.0}, r"attack.params.tau: must be < gamma_init \(10.0\)"),
        ("min_sum", {"bound": "mean"}, "bound: Input should be 'max' or 'min'"),
        ("label_flip", {"k": 1}, r"attack.params.k: unknown key \(allowed: none\)"),
    ],
)
def test_bad_params_raise_config_error(name: str, kwargs: dict, match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        attacks.build(name, **kwargs)
    with pytest.raises(ConfigError, match=match):  # direct construction checks as strictly
        ATTACKS.get(name)(**{k: v for k, v in kwargs.items() if v is not None})


def test_parse_validates_without_building() -> None:
    p = attacks.parse("min_sum", {"vector": "sign"}, "attack.params")
    assert (p.vector, p.bound, p.gamma_init) == ("sign", "max", 10.0)
    with pytest.raises(ConfigError, match=r"^attack.name: unknown attack 'minmax' \(did you"):
        attacks.parse("minmax", {})
