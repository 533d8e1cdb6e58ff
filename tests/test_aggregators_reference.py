"""Our aggregators equal maintained references on seeded random inputs (DRAG paper, Sec. VI-B).

References: ByzFL (EPFL's Byzantine-robust FL library: Krum, Multi-Krum, Median, TrMean,
GeometricMedian, CenteredClipping, Clipping + Average) and Flower's strategy aggregation
functions (Krum, Multi-Krum, Median, trimmed mean, FedAvg, Bulyan). Where their definitions
are parameterised differently we map the parameters (each mapping is stated next to its
test); the rules for which no library exists (DRAG, BR-DRAG, FLTrust) are checked against a
literal per-client loop over the papers' equations.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch

import fedshield.aggregators as agg

SEEDS = [0, 1, 2]
#: S = 30 > 25 also exercises torch.cdist's matmul path inside ByzFL.
SIZES = [(11, 40), (30, 64)]


def rows(seed: int, s: int, d: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(s, d, generator=gen) + torch.randn(d, generator=gen)
    x[: max(1, s // 6)] *= 8.0  # a few far-away (Byzantine-looking) rows
    return x.to(dtype)


def sample_counts(seed: int, s: int) -> torch.Tensor:
    return torch.randint(1, 200, (s,), generator=torch.Generator().manual_seed(seed + 100))


def close(ours: torch.Tensor, theirs: object, tol: float = 1e-5) -> None:
    t = torch.as_tensor(np.asarray(theirs) if not isinstance(theirs, torch.Tensor) else theirs)
    torch.testing.assert_close(ours.to(torch.float64), t.to(torch.float64), rtol=tol, atol=tol)


# -- ByzFL ---------------------------------------------------------------------------------
def byzfl() -> Any:
    """The ByzFL package, or skip the calling test (the Flower and equation tests still run)."""
    return pytest.importorskip("byzfl")


cases = pytest.mark.parametrize(("seed", "size"), [(a, b) for a in SEEDS for b in SIZES])


@cases
def test_krum_matches_byzfl(seed: int, size: tuple[int, int]) -> None:
    bz = byzfl()
    # ByzFL's Krum(f') averages the squared distances to the n − f' − 1 nearest others;
    # Blanchard's score sums over n − f − 2: the same neighbour set when f' = f + 1 (the
    # mean rather than the sum does not change the argmin).
    x = rows(seed, *size)
    for f in (1, 3):
        close(agg.build("krum", f=f)(x), bz.Krum(f=f + 1)(x), tol=0)


@cases
def test_multikrum_matches_byzfl(seed: int, size: tuple[int, int]) -> None:
    bz = byzfl()
    # ByzFL's MultiKrum(f') scores like Krum(f') and averages the n − f' best rows.
    x = rows(seed, *size)
    s = size[0]
    for f in (1, 3):
        close(agg.build("multikrum", f=f, m=s - f - 1)(x), bz.MultiKrum(f=f + 1)(x))


@cases
def test_median_and_trimmed_mean_match_byzfl(seed: int, size: tuple[int, int]) -> None:
    bz = byzfl()
    x = rows(seed, *size)
    close(agg.build("median")(x), bz.Median()(x))  # torch.quantile(q=0.5): interpolated
    close(agg.build("median")(x[:-1]), bz.Median()(x[:-1]))  # odd S as well
    for f in (0, 1, 4):
        close(agg.build("trimmed_mean", f=f)(x), bz.TrMean(f=f)(x))


@cases
def test_geometric_median_matches_byzfl(seed: int, size: tuple[int, int]) -> None:
    bz = byzfl()
    x = rows(seed, *size)
    # ByzFL runs exactly T smoothed-Weiszfeld steps from z = 0: ours with init="zeros",
    # tol=0 (no early stop) and max_iter=T is the same iteration.
    for nu, t in ((0.1, 3), (1e-6, 10)):
        ours = agg.build("raga", nu=nu, max_iter=t, tol=0.0, init="zeros")(x)
        close(ours, bz.GeometricMedian(nu=nu, T=t)(x), tol=1e-4)
    # Run to convergence, both land on the same minimiser whatever the start.
    ours = agg.build("raga", tol=1e-14, max_iter=2000)(x.double())
    close(ours, bz.GeometricMedian(nu=1e-6, T=2000)(x.double()), tol=1e-4)


@cases
def test_centered_clipping_matches_byzfl(seed: int, size: tuple[int, int]) -> None:
    bz = byzfl()
    x = rows(seed, *size)
    for tau, iters in ((10.0, 1), (3.0, 5), (100.0, 2)):
        # A fresh ByzFL instance starts from the centre 0, like ours without a reference.
        theirs = bz.CenteredClipping(tau=tau, L=iters)(x)
        close(agg.build("centered_clipping", tau=tau, iters=iters)(x), theirs)


@cases
def test_centered_clipping_centre_is_the_previous_aggregate_as_in_byzfl(
    seed: int, size: tuple[int, int]
) -> None:
    bz = byzfl()
    # ByzFL's instance carries its last output into its next call as the centre: rounds
    # t − 1 and t through one instance equal ours with reference = our previous output.
    prev, x = rows(seed, *size), rows(seed + 50, *size)
    for tau, iters in ((3.0, 1), (1.0, 3)):
        theirs = bz.CenteredClipping(tau=tau, L=iters)
        rule = agg.build("centered_clipping", tau=tau, iters=iters)
        v1 = rule(prev)
        close(v1, theirs(prev))
        close(rule(x, reference=v1), theirs(x))


@cases
def test_norm_clip_matches_byzfl_clipping_then_average(seed: int, size: tuple[int, int]) -> None:
    bz = byzfl()
    x = rows(seed, *size)
    for tau in (0.5, 5.0, 50.0):
        close(agg.build("norm_clip", tau=tau)(x), bz.Average()(bz.Clipping(c=tau)(x)))


def test_geometric_median_under_far_outliers_matches_byzfl_run_long() -> None:
    bz = byzfl()
    gen = torch.Generator().manual_seed(0)
    mu, sigma = torch.randn(50, generator=gen), torch.rand(50, generator=gen) + 0.5
    x = torch.cat(
        [mu + sigma * torch.randn(16, 50, generator=gen), (mu + 1e6 * sigma).expand(12, 50)]
    )
    # ByzFL iterates in R^d from z = 0 (in float32); 2000 steps reach the minimiser too.
    theirs = bz.GeometricMedian(nu=1e-6, T=2000)(x)
    ours = agg.build("rfa")(x)  # default stopping rules
    assert float((ours - theirs).norm() / sigma.norm()) < 1e-2


@cases
def test_mean_matches_byzfl(seed: int, size: tuple[int, int]) -> None:
    bz = byzfl()
    x = rows(seed, *size)
    close(agg.build("mean")(x), bz.Average()(x))


# -- Flower --------------------------------------------------------------------------------
def flower_results(x: torch.Tensor, counts: torch.Tensor | None = None) -> list:
    n = [1] * x.shape[0] if counts is None else counts.tolist()
    # Split each row into two "layers": Flower flattens and concatenates them.
    return [([row[:5].numpy(), row[5:].numpy()], int(k)) for row, k in zip(x, n)]


def flat(layers: list[np.ndarray]) -> np.ndarray:
    return np.concatenate([a.ravel() for a in layers])


@cases
def test_krum_and_multikrum_match_flower(seed: int, size: tuple[int, int]) -> None:
    fa = pytest.importorskip("flwr.server.strategy.aggregate")
    x = rows(seed, *size, dtype=torch.float64)
    counts = sample_counts(seed, size[0])
    for f in (1, 3):
        close(agg.build("krum", f=f)(x), flat(fa.aggregate_krum(flower_results(x), f, 0)))
        # Flower's Multi-Krum averages the to_keep best rows weighted by sample counts.
        got = fa.aggregate_krum(flower_results(x, counts), f, 4)
        close(agg.build("multikrum", f=f, m=4)(x, counts.double()), flat(got), tol=1e-10)


@cases
def test_median_and_trimmed_mean_match_flower(seed: int, size: tuple[int, int]) -> None:
    fa = pytest.importorskip("flwr.server.strategy.aggregate")
    x = rows(seed, *size, dtype=torch.float64)
    s = size[0]
    close(agg.build("median")(x), flat(fa.aggregate_median(flower_results(x))), tol=1e-12)
    # Flower trims ⌊β S⌋ values per side: β = 0.2 ⇔ f = ⌊0.2 S⌋.
    for beta in (0.0, 0.1, 0.2, 0.45):
        got = fa.aggregate_trimmed_avg(flower_results(x), beta)
        close(agg.build("trimmed_mean", f=int(beta * s))(x), flat(got), tol=1e-12)


@cases
def test_weighted_mean_matches_flower_fedavg(seed: int, size: tuple[int, int]) -> None:
    fa = pytest.importorskip("flwr.server.strategy.aggregate")
    x = rows(seed, *size, dtype=torch.float64)
    counts = sample_counts(seed, size[0])
    got = fa.aggregate(flower_results(x, counts))
    close(agg.build("mean")(x, counts.double()), flat(got), tol=1e-12)


@cases
def test_bulyan_matches_flower(seed: int, size: tuple[int, int]) -> None:
    fa = pytest.importorskip("flwr.server.strategy.aggregate")
    x = rows(seed, *size, dtype=torch.float64)
    s = size[0]
    for f in sorted({0, 1, (s - 3) // 4}):
        # Flower's Bulyan with Krum: aggregate_krum(results, num_malicious=f, to_keep=0) on
        # the shrinking set; it pops from the list it is given, hence a fresh one.
        got = fa.aggregate_bulyan(flower_results(x), f, fa.aggregate_krum, to_keep=0)
        close(agg.build("bulyan", f=f)(x), flat(got), tol=1e-12)


# -- the papers' equations, one client at a time -------------------------------------------
def loop_drag(x: torch.Tensor, r: torch.Tensor, c: float) -> torch.Tensor:
    vs = []
    for g in x:  # DRAG paper, eq. 10–11
        if g.norm() == 0 or r.norm() == 0:
            vs.append(g)
            continue
        lam = c * (1 - torch.dot(g, r) / (g.norm() * r.norm()))
        vs.append((1 - lam) * g + lam * (g.norm() / r.norm()) * r)
    return torch.stack(vs).mean(0)


def loop_brdrag(x: torch.Tensor, r: torch.Tensor, c: float) -> torch.Tensor:
    vs = []
    for g in x:  # DRAG paper, eq. 15
        lam = c * (1 - torch.dot(g, r) / (g.norm() * r.norm()))
        vs.append((1 - lam) * (r.norm() / g.norm()) * g + lam * r)
    return torch.stack(vs).mean(0)


def loop_fltrust(x: torch.Tensor, r: torch.Tensor) -> torch.Tensor:
    num, den = torch.zeros_like(r), 0.0
    for g in x:  # FLTrust, Cao et al. 2021
        ts = max(0.0, float(torch.dot(g, r) / (g.norm() * r.norm())))
        num += ts * (r.norm() / g.norm()) * g
        den += ts
    return num / den if den > 0 else num


@cases
@pytest.mark.parametrize("c", [0.25, 0.5, 1.0])
def test_reference_rules_match_the_equations(seed: int, size: tuple[int, int], c: float) -> None:
    x = rows(seed, *size, dtype=torch.float64)
    x[1] = -x[1]
    r = torch.randn(size[1], generator=torch.Generator().manual_seed(seed), dtype=x.dtype)
    close(agg.build("drag", c=c)(x, reference=r), loop_drag(x, r, c), tol=1e-12)
    close(agg.build("brdrag", c=c)(x, reference=r), loop_brdrag(x, r, c), tol=1e-12)
    close(agg.build("fltrust")(x, reference=r), loop_fltrust(x, r), tol=1e-12)
