"""ByzFL's own attacks against every registered defense (bench/bench_byzfl_attacks.py
prints the distances).

For each of ByzFL's Optimal ALIE, Optimal IPM, Mimic, Inf, SignFlipping and Gaussian attacks,
f of n rows are crafted from seeded benign rows (the optimal attacks line-search against the
defense under attack). Every rule must return a finite aggregate, and where ByzFL has the
same rule (parameters mapped as in tests/test_aggregators_reference.py) ours must equal its
output. Under the Inf attack ours drops the Inf rows (documented), so it is compared with
ByzFL's rule on the finite rows, the definitions coinciding there.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch

import fedshield.aggregators as agg

byzfl = pytest.importorskip("byzfl")

N, F, D, TAU, T = 15, 3, 40, 0.5, 10
ATTACKS = ["Optimal_ALIE", "Optimal_IPM", "Mimic", "Inf", "SignFlipping", "Gaussian"]


def benign(seed: int = 0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    mu = torch.randn(D, generator=gen) / D**0.5
    honest = mu + torch.randn(N - F, D, generator=gen) / D**0.5
    ref = mu + torch.randn(D, generator=gen) / D**0.5  # root-data reference
    centre = mu + torch.randn(D, generator=gen) / D**0.5 / 3  # previous aggregate
    return honest, ref, centre


def ours(name: str, n_finite: int) -> agg.Aggregator:
    kwargs: dict[str, Any] = {
        "krum": {"f": F},
        "multikrum": {"f": F, "m": n_finite - F - 1},
        "trimmed_mean": {"f": F},
        "bulyan": {"f": (n_finite - 3) // 4},
        "centered_clipping": {"tau": TAU, "iters": 2},
        "norm_clip": {"tau": TAU},
    }.get(name, {})
    if name in ("geomed", "rfa", "raga"):  # ByzFL's iteration: T steps from z = 0
        kwargs = {"init": "zeros", "tol": 0.0, "max_iter": T}
    return agg.build(name, **kwargs)


def theirs(name: str, centre: torch.Tensor) -> Callable[[torch.Tensor], Any] | None:
    if name == "centered_clipping":

        def cc(x: torch.Tensor) -> Any:
            rule = byzfl.CenteredClipping(tau=TAU, L=2)
            rule.m = centre  # the centre its __call__ reads (its constructor refuses one)
            return rule(x)

        return cc
    return {
        "mean": byzfl.Average(),
        "median": byzfl.Median(),
        "trimmed_mean": byzfl.TrMean(f=F),
        "krum": byzfl.Krum(f=F + 1),  # Blanchard's n − f − 2 neighbours
        "multikrum": byzfl.MultiKrum(f=F + 1),
        "geomed": byzfl.GeometricMedian(nu=1e-6, T=T),
        "rfa": byzfl.GeometricMedian(nu=1e-6, T=T),
        "raga": byzfl.GeometricMedian(nu=1e-6, T=T),
        "norm_clip": lambda x: byzfl.Average()(byzfl.Clipping(c=TAU)(x)),
    }.get(name)


def craft(attack: str, honest: torch.Tensor, target: Callable[[torch.Tensor], Any]) -> Any:
    if attack == "Optimal_ALIE":
        return byzfl.Optimal_ALittleIsEnough(agg=target, pre_agg_list=[], f=F)(honest)
    if attack == "Optimal_IPM":
        return byzfl.Optimal_InnerProductManipulation(agg=target, pre_agg_list=[], f=F)(honest)
    simple = {
        "Mimic": byzfl.Mimic(epsilon=0),
        "Inf": byzfl.Inf(),
        "SignFlipping": byzfl.SignFlipping(),
        "Gaussian": byzfl.Gaussian(mu=0.0, sigma=1.0),
    }
    return simple[attack](honest)


@pytest.mark.parametrize("attack", ATTACKS)
def test_byzfl_attacks_against_every_defense(attack: str) -> None:
    honest, ref, centre = benign()
    n_finite = N - F if attack == "Inf" else N
    compared = 0
    for name in agg.AGGREGATORS.package_names():
        rule = ours(name, n_finite)
        extra = ref if rule.needs_reference else centre if name == "centered_clipping" else None

        def target(x: torch.Tensor, r: agg.Aggregator = rule, e: Any = extra) -> torch.Tensor:
            return r(x, reference=e)

        torch.manual_seed(0)  # ByzFL's Gaussian draws from torch's global generator
        bad = torch.as_tensor(craft(attack, honest, target)).float()
        x = torch.cat([honest, bad.expand(F, D)])
        out, diag = rule.aggregate(x, reference=extra)
        assert torch.isfinite(out).all(), (attack, name, diag)
        if attack == "Inf":
            assert diag["agg/nonfinite"] == F
        reference = theirs(name, centre)
        if reference is None:
            continue
        expected = reference(honest if attack == "Inf" else x)
        torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-5, msg=f"{attack} {name}")
        compared += 1
    assert compared == 10
