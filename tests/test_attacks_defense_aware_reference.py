"""Defense-aware attacks and pre-aggregators against ByzFL 0.0.11 on seeded inputs.

* ``alie_opt`` / ``ipm_opt`` ↔ ``Optimal_ALittleIsEnough`` / ``Optimal_InnerProductManipulation``
  with the same rule (our rule object, called by ByzFL through a numpy adapter, with and
  without ByzFL's NNM in front), same defaults (evals 20, start 0, δ 10, ratio 0.8);
* ``mimic(target=ε)`` ↔ ``Mimic(epsilon=ε)``;
* ``nnm`` / ``bucketing`` / ``arc`` / ``clip`` ↔ ``NNM`` / ``Bucketing`` / ``ARC`` /
  ``Clipping``, and a composed rule ↔ ByzFL's pre-aggregation list followed by its rule.

ByzFL casts torch input to float32; numpy float64 input keeps full precision, so we feed it
numpy arrays, and place the Byzantine rows last as ByzFL's attacks do (honest vectors, then
the f copies).
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
import torch

import fedshield.aggregators as agg
import fedshield.preaggregators as pre
from fedshield import attacks
from fedshield.attacks import AttackContext
from fedshield.preaggregators.bucketing import bucketing

byzfl = pytest.importorskip("byzfl")

N, F, D = 12, 3, 30


def cohort(seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``[N, D]`` float64 rows: N − F heterogeneous benign rows first, then F attacker rows."""
    g = torch.Generator().manual_seed(seed)
    centres = torch.randn(3, D, generator=g, dtype=torch.float64) * 0.3
    honest = centres[torch.arange(N - F) % 3] + 0.1 * torch.randn(
        N - F, D, generator=g, dtype=torch.float64
    )
    own = torch.randn(F, D, generator=g, dtype=torch.float64)
    mask = torch.zeros(N, dtype=torch.bool)
    mask[N - F :] = True
    return torch.cat([honest, own]), mask


def as_numpy_rule(rule: agg.Aggregator) -> Callable[[Any], np.ndarray]:
    """Our rule as ByzFL calls its ``agg``: numpy rows in, numpy vector out."""
    return lambda v: rule(torch.as_tensor(np.asarray(v))).numpy()


RULES: dict[str, Callable[[], agg.Aggregator]] = {
    "mean": lambda: agg.build("mean"),
    "median": lambda: agg.build("median"),
    "trimmed_mean": lambda: agg.build("trimmed_mean", f=F),
    "krum": lambda: agg.build("krum", f=F),
    "geomed": lambda: agg.build("geomed"),
}


@pytest.mark.parametrize(
    ("name", "rule", "seed"), list(itertools.product(["alie_opt", "ipm_opt"], RULES, range(2)))
)
def test_optimal_attacks_equal_byzfl(name: str, rule: str, seed: int) -> None:
    u, m = cohort(seed)
    ours = RULES[rule]()
    attack = attacks.build(name)
    out = attack(u, m, context=AttackContext(rule=ours))
    cls = (
        byzfl.Optimal_ALittleIsEnough
        if name == "alie_opt"
        else byzfl.Optimal_InnerProductManipulation
    )
    theirs = cls(agg=as_numpy_rule(ours), pre_agg_list=[], f=F)(u[~m].numpy())
    np.testing.assert_allclose(
        out[m].numpy(), np.broadcast_to(theirs, (F, D)), rtol=1e-12, atol=1e-14
    )
    assert torch.equal(out[~m], u[~m])


@pytest.mark.parametrize(
    ("name", "seed"), list(itertools.product(["alie_opt", "ipm_opt"], range(2)))
)
def test_optimal_attacks_through_nnm_equal_byzfl_with_its_pre_aggregator(
    name: str, seed: int
) -> None:
    # Our composed rule (NNM → Trimmed Mean) against ByzFL's pre_agg_list=[NNM] + TrMean.
    u, m = cohort(seed)
    ours = pre.compose(["nnm"], {"nnm": {"f": F}}, agg.build("trimmed_mean", f=F))
    out = attacks.build(name)(u, m, context=AttackContext(rule=ours))
    cls = (
        byzfl.Optimal_ALittleIsEnough
        if name == "alie_opt"
        else byzfl.Optimal_InnerProductManipulation
    )
    theirs = cls(agg=byzfl.TrMean(f=F), pre_agg_list=[byzfl.NNM(f=F)], f=F)(u[~m].numpy())
    np.testing.assert_allclose(
        out[m].numpy(), np.broadcast_to(theirs, (F, D)), rtol=1e-10, atol=1e-12
    )


def test_optimal_search_parameters_reach_byzfl() -> None:
    u, m = cohort(5)
    ours = agg.build("median")
    kw = {"evals": 7, "start": 1.0, "delta": -3.0, "ratio": 0.6}
    out = attacks.build("alie_opt", **kw)(u, m, context=AttackContext(rule=ours))
    theirs = byzfl.Optimal_ALittleIsEnough(agg=as_numpy_rule(ours), pre_agg_list=[], f=F, **kw)
    np.testing.assert_allclose(out[m][0].numpy(), theirs(u[~m].numpy()), rtol=1e-12)


@pytest.mark.parametrize("eps", [0, 4, 8])
def test_mimic_target_equals_byzfl(eps: int) -> None:
    u, m = cohort(1)
    out = attacks.build("mimic", target=eps)(u, m)
    theirs = byzfl.Mimic(epsilon=eps)(u[~m].numpy())
    assert np.array_equal(out[m].numpy(), np.broadcast_to(theirs, (F, D)))


# --- pre-aggregators ----------------------------------------------------------------------


@pytest.mark.parametrize(("f", "seed"), list(itertools.product([0, 2, 5], range(3))))
def test_nnm_equals_byzfl(f: int, seed: int) -> None:
    u, _ = cohort(seed)
    ours, w = pre.build("nnm", f=f)(u, None)
    theirs = byzfl.NNM(f=f)(u.numpy())
    np.testing.assert_allclose(ours.numpy(), theirs, rtol=1e-12, atol=1e-14)
    assert w is None


@pytest.mark.parametrize(("s", "seed"), list(itertools.product([1, 2, 5], range(3))))
def test_bucketing_equals_byzfl_for_the_same_permutation(s: int, seed: int) -> None:
    u, _ = cohort(seed)
    x = u.numpy()
    np.random.seed(seed)
    perm = np.random.permutation(len(x))
    np.random.seed(seed)  # ByzFL shuffles the rows with the same draws
    theirs = byzfl.Bucketing(s=s)(x.copy())
    ours, _ = bucketing(u, s, torch.as_tensor(perm))
    np.testing.assert_allclose(ours.numpy(), theirs, rtol=1e-12, atol=1e-14)
    assert ours.shape[0] == -(-N // s)


@pytest.mark.parametrize(("f", "seed"), list(itertools.product([0, 1, 3, 6], range(3))))
def test_arc_equals_byzfl(f: int, seed: int) -> None:
    u, _ = cohort(seed)
    u = u * torch.linspace(0.5, 3.0, N, dtype=torch.float64)[:, None]  # spread the norms
    ours, _ = pre.build("arc", f=f)(u, None)
    theirs = byzfl.ARC(f=f)(u.numpy().copy())  # ByzFL clips its input in place
    np.testing.assert_allclose(ours.numpy(), theirs, rtol=1e-12, atol=1e-14)


@pytest.mark.parametrize("c", [0.5, 2.0])
def test_static_clip_equals_byzfl(c: float) -> None:
    u, _ = cohort(2)
    ours, _ = pre.build("clip", c=c)(u, None)
    theirs = byzfl.Clipping(c=c)(u.numpy().copy())
    np.testing.assert_allclose(ours.numpy(), theirs, rtol=1e-12, atol=1e-14)


@pytest.mark.parametrize(
    ("chain", "rule", "theirs"),
    [
        (["nnm"], ("trimmed_mean", {"f": F}), lambda: ([byzfl.NNM(f=F)], byzfl.TrMean(f=F))),
        (["nnm"], ("median", {}), lambda: ([byzfl.NNM(f=F)], byzfl.Median())),
        (["arc", "nnm"], ("mean", {}), lambda: ([byzfl.ARC(f=F), byzfl.NNM(f=F)], byzfl.Average())),
        (["clip"], ("krum", {"f": F}), lambda: ([byzfl.Clipping(c=2.0)], byzfl.Krum(f=F + 1))),
    ],
)
def test_composed_rule_equals_byzfl_pipeline(chain, rule, theirs) -> None:
    u, _ = cohort(4)
    u = u * 3  # norms above the clip radius
    # f given where the rule has none (median, mean); from Trimmed Mean's / Krum's own f.
    args = {n: {"f": F} for n in chain if n in ("nnm", "arc") and rule[0] in ("median", "mean")}
    ours = pre.compose(chain, args, agg.build(rule[0], **rule[1]))
    pres, their_rule = theirs()
    x = u.numpy().copy()
    for p in pres:
        x = p(x)
    np.testing.assert_allclose(ours(u).numpy(), their_rule(x), rtol=1e-10, atol=1e-12)
