"""Every rule with a reference equals it on generated hard inputs: integer-valued
rows (exact ties in distances, scores and medians), duplicated and equal rows, anti-aligned
rows, d = 1, and f at the breakdown point. The reproducers of ties and cancellation found in review
come first.

References: ByzFL 0.0.11 (installed), FoolsGold's authors' code and Blades' DnC (not
installable: their tie rules are transcribed below in a few lines, each cited). Where the
reference breaks ties arbitrarily (ByzFL's ``argpartition`` in MeaMed, Multi-Krum, MoNNA;
its Krum scores squared from rounded ``cdist`` square roots) the test accepts every valid
answer and checks fedshield's documented choice: the first row / window / subset. Integer
rows make the exact scores exact in float64, so "valid" is decided without tolerances.
Not covered here: Bucketing (a random permutation), CAF on generated inputs (ByzFL's loop
can run for ever on them; its long legitimate runs are checked below on Gaussian rows).
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
import torch

import fedshield.aggregators as agg
from fedshield.preaggregators.clipping import arc, clip
from fedshield.preaggregators.nnm import nnm


def byzfl() -> Any:
    return pytest.importorskip("byzfl")


def col(*v: float) -> torch.Tensor:
    return torch.tensor(v, dtype=torch.float64)[:, None]


def close(ours: torch.Tensor, theirs: Any, tol: float = 1e-12) -> None:
    t = torch.as_tensor(np.asarray(theirs), dtype=torch.float64)
    torch.testing.assert_close(ours.double(), t, rtol=tol, atol=tol)


# -- reproducers found in review ---------------------------------------------------------------
def test_meamed_and_bulyan_keep_the_values_closest_to_the_median() -> None:
    # Three of [−1, −1, 0, 0, 1] closest to the median 0: both 0s and one of ±1 → ±1/3
    # (the window [−1, −1, 0] has the same largest distance but drops a 0). ByzFL: −1/3.
    x = col(-1, -1, 0, 0, 1)
    out = agg.build("meamed", f=2)(x)
    close(out, [-1 / 3])
    close(out, byzfl().Meamed(f=2)(x.numpy()))
    # Bulyan f = 1: Krum keeps the five small rows, then the same window (β = 3).
    close(agg.build("bulyan", f=1)(col(-1, -1, 0, 0, 1, 100, -100)), [-1 / 3])


def test_mda_breaks_exact_ties_to_the_first_subset_as_byzfl() -> None:
    # Dropping 2 or −1 both leave diameter 2; the first subset {2, 0, 0, 1} has mean 0.75
    # (the Gram pass read 4.000000000000001 against 4.0 and kept the other).
    x = col(2, 0, -1, 0, 1)
    out, diag = agg.build("mda", f=1).aggregate(x)
    close(out, [0.75])
    close(out, byzfl().MDA(f=1)(x.numpy()))
    assert diag["agg/diameter"] == 2.0


def test_smea_first_minimal_subset_and_its_top_eigenvalue() -> None:
    # f = 2: {0, −1, 0} and {0, 0, 1} tie at λ_max(Σ_K) = 2/9; the first one wins.
    out, diag = agg.build("smea", f=2).aggregate(col(2, 0, -1, 0, 1))
    close(out, [-1 / 3])
    assert diag["agg/eigenvalue"] == pytest.approx(2 / 9, rel=1e-12)  # not |K|·λ = 2/3


def test_foolsgold_keeps_the_anti_aligned_row() -> None:
    # The authors' cos − I: rows 0 and 1 resemble each other (cos 0.98) and get weight 0,
    # row 2 points away from both (max cos 0) and keeps weight 1.
    x = torch.tensor([[1.0, 0.0], [1.0, 0.2], [-1.0, 0.1]], dtype=torch.float64)
    out, diag = agg.build("foolsgold").aggregate(x)
    close(out, [-1.0, 0.1])
    assert diag["agg/num_zero_weight"] == 2
    np.testing.assert_allclose(foolsgold_authors(x.numpy()), [0, 0, 1])


@pytest.mark.parametrize("seed", [1, 20])
def test_caf_runs_a_long_legitimate_filter_to_its_end_as_byzfl(seed: int) -> None:
    # 13 Gaussian rows, d = 1, f = 6, no outlier: the filter needs 2,780 (seed 1) and 998
    # (seed 20) steps, beyond the former 50·S = 650. In d = 1 ByzFL's power step is exact.
    x = torch.randn(13, 1, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)
    out, diag = agg.build("caf", f=6).aggregate(x)
    assert diag["agg/stalled"] == 0 and diag["agg/iterations"] > 650
    torch.manual_seed(0)
    close(out, byzfl().CAF(f=6)(x.numpy()), 1e-9)


def test_caf_stops_where_no_weight_can_change() -> None:
    # An outlier at 1e30: after its weight is 0 every other shrinks by (1 − 1e-60) = 1.
    x = torch.randn(9, 3, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    x[0] = 1e30
    out, diag = agg.build("caf", f=2).aggregate(x)
    assert diag["agg/stalled"] == 1 and diag["agg/iterations"] < 10
    close(out, x[1:].mean(0), 1e-9)


def test_dnc_drops_one_copy_of_a_duplicated_row_in_every_draw() -> None:
    # Two copies of the outlying row and f = 1: each draw removes one row; tied scores keep
    # the lower index, so the intersection loses the same copy each time (Blades: one).
    for seed in range(20):
        x = torch.randn(7, 20, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)
        x[3] = x[5] = 3 * x[5]
        out, diag = agg.build("dnc", f=1, sub_dim=10, niters=5).aggregate(x)
        assert diag["agg/num_selected"] >= 5
        assert diag["agg/num_selected"] == 6 or not torch.equal(out, x[[0, 1, 2, 4, 6]].mean(0))


# -- transcriptions of the references without a package ------------------------------------
def foolsgold_authors(x: np.ndarray) -> np.ndarray:
    """FoolsGold's weights as DistributedML/FoolsGold ML/code/model_aggregator.py
    ``foolsgold`` computes them (cs = cosine_similarity − I, pardoning, logit)."""
    n = x.shape[0]
    norms = np.linalg.norm(x, axis=1)
    unit = x / np.where(norms > 0, norms, 1.0)[:, None]
    cs = unit @ unit.T - np.eye(n)
    maxcs = cs.max(axis=1)
    for i, j in itertools.permutations(range(n), 2):
        if maxcs[i] < maxcs[j]:
            cs[i, j] *= maxcs[i] / maxcs[j]
    wv = np.clip(1 - cs.max(axis=1), 0, 1)
    wv = wv / wv.max()
    wv[wv == 1] = 0.99
    with np.errstate(divide="ignore"):
        wv = np.log(wv / (1 - wv)) + 0.5
    return np.clip(np.where(np.isinf(wv) & (wv > 0), 1, wv), 0, 1)


def dnc_blades_kept(x: np.ndarray, removed: int) -> set[frozenset[int]]:
    """Blades' DnC with one iteration over every coordinate (d ≤ sub_dim): the rows of the
    n − removed lowest scores ⟨x_i − μ, v⟩², v the top right singular vector. Blades'
    ``argsort`` orders tied scores arbitrarily: every valid kept set is returned."""
    centred = x - x.mean(axis=0)
    v = np.linalg.svd(centred)[2][0]
    score = np.round((centred @ v) ** 2, 9)  # exact ties stay ties
    cut = np.sort(score)[len(x) - removed - 1]
    sure = [i for i in range(len(x)) if score[i] < cut]
    tied = [i for i in range(len(x)) if score[i] == cut]
    return {
        frozenset(sure) | frozenset(t)
        for t in itertools.combinations(tied, len(x) - removed - len(sure))
    }


# -- the generator ---------------------------------------------------------------------------
KINDS = ("integers", "duplicated", "anti_aligned", "equal")


def hard(seed: int, s: int, d: int) -> torch.Tensor:
    """Integer rows in [−3, 3]^d, with (by seed) half of them copies of others, half of them
    negatives of others, or a majority of equal rows."""
    rng = np.random.default_rng(seed)
    x = rng.integers(-3, 4, size=(s, d)).astype(np.float64)
    kind = KINDS[seed % len(KINDS)]
    half = rng.permutation(s)[: s // 2]
    if kind == "duplicated":
        x[half] = x[rng.integers(0, s, size=half.size)]
    elif kind == "anti_aligned":
        x[half] = -x[rng.integers(0, s, size=half.size)]
    elif kind == "equal":
        x[: s // 2 + 1] = x[0]
    if not np.abs(x).sum():
        x[0, 0] = 1.0
    return torch.from_numpy(x)


def cases(largest_f: Any, count: int = 24) -> Iterator[tuple[torch.Tensor, int]]:
    """(rows, f): S in 5..11, d ∈ {1, 3}, f at the breakdown point and f = 1."""
    for seed in range(count):
        s, d = 5 + seed % 7, (1, 3)[seed % 2]
        x = hard(seed, s, d)
        top = largest_f(s)
        for f in sorted({1, top}):
            if 1 <= f <= top:
                yield x, f


def majority(s: int) -> int:
    return (s - 1) // 2


# -- ByzFL, exactly (its answer is unique on these inputs) -----------------------------------
def test_mean_median_trimmed_mean_mda_equal_byzfl_on_hard_inputs() -> None:
    bz = byzfl()
    for x, f in cases(majority):
        xn = x.numpy()
        close(agg.build("mean")(x), bz.Average()(xn))
        close(agg.build("median")(x), bz.Median()(xn))
        close(agg.build("trimmed_mean", f=f)(x), bz.TrMean(f=f)(xn))
        close(agg.build("mda", f=f)(x), bz.MDA(f=f)(xn))  # ties: the first subset, as ByzFL


def test_centered_clipping_and_geometric_median_equal_byzfl_on_hard_inputs() -> None:
    bz = byzfl()
    for x, _ in cases(majority, 12):
        xn = x.numpy()
        theirs = bz.CenteredClipping(tau=2.0, L=3)(xn)
        close(agg.build("centered_clipping", tau=2.0, iters=3)(x), theirs, 1e-9)
        # ByzFL: T smoothed-Weiszfeld steps from 0 (mapping: test_aggregators_reference)
        ours = agg.build("raga", nu=0.1, max_iter=3, tol=0.0, init="zeros")(x)
        close(ours, bz.GeometricMedian(nu=0.1, T=3)(xn), 1e-9)


def test_preaggregators_equal_byzfl_on_hard_inputs() -> None:
    bz = byzfl()
    for x, f in cases(majority):
        xn = x.numpy()
        close(arc(x, f), bz.ARC(f=f)(xn))
        close(clip(x, 2.0), bz.Clipping(c=2.0)(xn))
        # NNM: ByzFL's argsort may order tied neighbours either way; our rule (distance,
        # index) is test_preaggregators' _nnm_by_definition. Equal where no cut is tied.
        ours, theirs = nnm(x, f), torch.as_tensor(bz.NNM(f=f)(xn))
        for i in range(x.shape[0]):
            d2 = ((x - x[i]) ** 2).sum(1).sort().values
            if d2[x.shape[0] - f - 1] != d2[min(x.shape[0] - f, x.shape[0] - 1)]:
                close(ours[i], theirs[i])


# -- ByzFL's arbitrary ties: any valid answer, and fedshield's documented one ----------------
def valid_window_means(c: np.ndarray, k: int) -> tuple[list[float], float]:
    """Means of every valid choice of the k values of ``c`` closest to its median, and the
    lowest window's (fedshield's choice)."""
    med = float(np.median(c))
    dist = np.abs(c - med)
    r = np.sort(dist)[k - 1]
    sure = c[dist < r]
    lo, hi = int((c == med - r).sum()), int((c == med + r).sum())
    need = k - sure.size
    means = [
        (sure.sum() + p * (med - r) + (need - p) * (med + r)) / k
        for p in range(need + 1)
        if p <= lo and need - p <= hi
    ]
    return means, means[-1]  # the most values below the median: the lowest window


def test_meamed_is_a_valid_byzfl_answer_and_the_lowest_window() -> None:
    bz = byzfl()
    for x, f in cases(majority):
        ours = agg.build("meamed", f=f)(x).numpy()
        theirs = bz.Meamed(f=f)(x.numpy())
        for k in range(x.shape[1]):
            means, lowest = valid_window_means(x[:, k].numpy(), x.shape[0] - f)
            assert min(abs(theirs[k] - m) for m in means) < 1e-12  # the oracle is right
            assert ours[k] == pytest.approx(lowest, abs=1e-12)


def exact_krum_scores(x: np.ndarray, f: int) -> np.ndarray:
    d2 = ((x[:, None] - x[None]) ** 2).sum(-1)  # integers: exact
    return np.sort(d2, axis=1)[:, 1 : x.shape[0] - f - 1].sum(1)


def test_krum_and_multikrum_pick_rows_of_minimal_exact_score() -> None:
    bz = byzfl()
    for x, f in cases(lambda s: (s - 3) // 2):
        xn = x.numpy()
        score = exact_krum_scores(xn, f)
        first = int(np.argmin(score))  # the first row on ties (Flower, documented)
        close(agg.build("krum", f=f)(x), xn[first])
        assert score[np.flatnonzero((xn == bz.Krum(f=f + 1)(xn)).all(1))].min() == score.min()
        m = x.shape[0] - f
        chosen = np.sort(score)[:m]  # any m rows of the m lowest scores are valid
        ours = agg.build("multikrum", f=f, m=m)(x).numpy()
        cut = chosen[-1]
        sure = xn[score < cut].sum(0)
        tied = xn[score == cut]
        need = m - int((score < cut).sum())
        sums = {
            tuple(sure + tied[list(t)].sum(0))
            for t in itertools.combinations(range(len(tied)), need)
        }
        assert min(np.abs(ours - np.array(s) / m).max() for s in sums) < 1e-12


def test_monna_keeps_the_nearest_rows_lower_index_first() -> None:
    for x, f in cases(majority):
        ref = int(x.shape[0] // 2)
        d2 = ((x - x[ref]) ** 2).sum(1).numpy()
        order = sorted(range(x.shape[0]), key=lambda i: (d2[i], i))[: x.shape[0] - f]
        close(agg.build("monna", f=f)(x, reference=x[ref]), x[order].mean(0))


def test_smea_takes_the_first_subset_of_smallest_exact_eigenvalue() -> None:
    for x, f in cases(majority, 16):
        xn = x.numpy()
        m = x.shape[0] - f
        best, first = np.inf, None
        for k in itertools.combinations(range(x.shape[0]), m):
            c = xn[list(k)] - xn[list(k)].mean(0)
            lam = float(np.linalg.eigvalsh(c.T @ c / m)[-1])
            if lam < best - 1e-9:  # a rational of small denominator: distinct ones differ
                best, first = lam, k
        assert first is not None
        out, diag = agg.build("smea", f=f).aggregate(x)
        close(out, xn[list(first)].mean(0))
        assert diag["agg/eigenvalue"] == pytest.approx(best, abs=1e-9)


def test_bulyan_is_krum_selection_then_a_valid_window() -> None:
    # Repeated Krum with ties to the first row (Flower), then per coordinate the lowest
    # window of the β values closest to the median of the θ selected.
    for x, f in cases(lambda s: (s - 3) // 4):
        xn = x.numpy()
        rest, chosen = list(range(x.shape[0])), []
        theta = x.shape[0] - 2 * f
        for _ in range(theta):
            sub = xn[rest]
            d2 = ((sub[:, None] - sub[None]) ** 2).sum(-1)
            k = min(max(1, len(rest) - f - 2), len(rest) - 1)
            score = np.sort(d2, axis=1)[:, 1 : k + 1].sum(1)
            chosen.append(rest.pop(int(np.argmin(score))))
        ours = agg.build("bulyan", f=f)(x).numpy()
        for j in range(x.shape[1]):
            _, lowest = valid_window_means(xn[chosen, j], theta - 2 * f)
            assert ours[j] == pytest.approx(lowest, abs=1e-12)


def test_foolsgold_equals_the_authors_code_on_hard_inputs() -> None:
    for x, _ in cases(majority):
        if not (x.norm(dim=1) > 0).all():
            continue  # a zero row: the authors' cosine is 0/0 (sklearn: 0, diagonal −1)
        w = foolsgold_authors(x.numpy())
        ours, diag = agg.build("foolsgold").aggregate(x)
        if w.sum() > 0:
            close(ours, (w @ x.numpy()) / w.sum(), 1e-9)
        else:
            assert diag["agg/fallback"] == 1


def test_dnc_keeps_a_valid_blades_set_and_the_lower_copy() -> None:
    for x, f in cases(majority):
        kept_sets = dnc_blades_kept(x.numpy(), f)
        out, _ = agg.build("dnc", f=f).aggregate(x)  # d ≤ sub_dim: one draw, Blades' rule
        means = {k: x[sorted(k)].mean(0) for k in kept_sets}
        assert any(torch.allclose(out, m, rtol=0, atol=1e-12) for m in means.values())
