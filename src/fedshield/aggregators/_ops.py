"""Shared numerics of the aggregation rules (docs/security.md): blocked geometry, safe in float64.

Every rule sees a dense ``[S, d]`` matrix of finite or non-finite rows in float32 (or
float64, or half). What must never happen is a NaN/Inf or an exploded result from *finite*
rows, however large (up to float32's max, 3.4e38). The rules therefore share these kernels:

* **Geometry that cannot overflow.** Norms, inner products and direct distances of float32
  rows are reduced in float32, then checked: a row whose float32 norm lies in [2^-40, 2^40]
  can neither overflow nor underflow there, and the result is exact to float32's own
  precision (a difference of two float32 values is rounded relative to itself). The other
  rows (huge, tiny, zero, NaN/Inf) are redone in float64, where a float32 value squared (at
  most 1.2e77) never overflows, over column blocks (:func:`column_blocks`): no float64
  copy of a large ``[S, d]`` matrix is ever made. The S×S Gram matrix, whose differences
  cancel, is always accumulated in float64, block by block; every [S] or [S, S] quantity
  (norms, cosines, distances, weights) is float64.
* **Non-finite rows are found on the way** (their float64 squared norm is not finite), so
  no separate ``isfinite`` pass is needed. A float64 row whose squared norm overflows
  float64 (entries beyond ~1e154) counts as non-finite too.
* **Distances without catastrophic cancellation.** The Gram trick ‖x_i − x_j‖² = G_ii +
  G_jj − 2G_ij loses all digits when the rows sit far from the centre relative to their
  spread (16 honest rows next to 12 rows 10^6 σ away). Pairs whose distance is tiny next to
  their norms are recomputed on a Gram matrix re-centred on their own group
  (:func:`pairwise_sq_dists`), and by direct differences when that cannot separate them.
* **Combinations Σ c_m x_m** (:func:`combine_rows`) run as one float32 GEMV when the
  coefficients are in a safe range, else (or if that overflows) as a float64 blocked GEMV;
  results are returned in the input dtype, clamped to its finite range (:func:`to_dtype`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import torch
from torch import Tensor

#: The working precision: accumulators, the Gram matrix, every [S] / [S, S] quantity.
W = torch.float64

#: Column blocks of this many elements on CPU: the float64 copy of a block (2 MiB) stays in
#: a core's L2/L3 cache; measured fastest between 2^16 and 2^21 at S = 40, d = 10^6.
_BLOCK_ELEMS = 1 << 18
#: On accelerators blocks are large (256 MiB in float64): per-kernel overhead dominates there.
_DEVICE_BLOCK_ELEMS = 1 << 25
#: A pair (i, j) whose squared distance is below this fraction of ‖x_i − c‖² + ‖x_j − c‖²
#: has lost more than ~20 of float64's 52 bits to cancellation: it is recomputed.
_CANCEL = 2.0**-20
#: Coefficients of :func:`combine_rows` outside [2^-100, 2^100] (besides 0) take the float64
#: path: in float32 they would underflow to denormals or push partial sums towards overflow.
_COEF_RANGE = (2.0**-100, 2.0**100)


# -- blocks and dtypes -----------------------------------------------------------------------
def column_blocks(x: Tensor) -> list[slice]:
    """Column slices of ``x`` that are promoted to float64 one at a time.

    A loop over a few dozen to a few thousand blocks, each fully vectorised: on CPU the
    float64 block never leaves the cache, and no rule ever holds a float64 copy of a large
    ``[S, d]`` matrix (on any device).
    """
    s, d = x.shape
    elems = _BLOCK_ELEMS if x.device.type == "cpu" else _DEVICE_BLOCK_ELEMS
    step = max(1024, elems // max(s, 1))
    return [slice(i, min(i + step, d)) for i in range(0, d, step)]


def _block(x: Tensor, blk: slice, rows: Tensor | None = None) -> Tensor:
    """``x[rows, blk]`` in float64 (a view for float64 input: never modify it in place)."""
    xb = x[:, blk] if rows is None else x[rows, blk]
    return xb.to(W)


def to_dtype(x: Tensor, dtype: torch.dtype) -> Tensor:
    """``x`` cast to ``dtype`` with its values clamped to the finite range of ``dtype``.

    For the rules' own intermediate results: when no cast is needed, ``x`` is clamped in
    place (one [d] pass, no allocation); otherwise the cast copy is.
    """
    y = x if x.dtype == dtype else x.to(dtype)  # a value beyond the range casts to ±inf
    if dtype.is_floating_point:
        info = torch.finfo(dtype)
        y.clamp_(info.min, info.max)
    return y


def all_finite(x: Tensor) -> bool:
    """True when every entry of ``x`` is finite: a sum is (one fast reduction, no [d] bool
    temporary); it may also overflow for huge finite entries, which callers then treat as
    the slow, safe case."""
    return bool(torch.isfinite(x.sum()))


# -- per-row geometry -------------------------------------------------------------------------
#: A float32 row norm in [2^-40, 2^40] is exact to float32 precision: its partial sums of
#: squares can neither overflow nor lose more than ~d·2^-69 of it to flushed denormals, and
#: its inner product with another such row is bounded by 2^80. Outside this range (huge,
#: tiny or zero rows, NaN/Inf) the row is redone in float64.
_SAFE = (2.0**-40, 2.0**40)


def _safe(n: Tensor) -> Tensor:
    return (n >= _SAFE[0]) & (n <= _SAFE[1])  # False for NaN and Inf as well


def _sq_norms64(x: Tensor, rows: Tensor | None, c64: Tensor | None) -> Tensor:
    """``[k]`` ‖x_i − c‖² over ``x[rows]`` in float64, block by block."""
    sq = torch.zeros(x.shape[0] if rows is None else rows.numel(), dtype=W, device=x.device)
    for blk in column_blocks(x):
        xb = _block(x, blk, rows)
        if c64 is not None:
            xb = xb - c64[blk]
        sq += torch.linalg.vector_norm(xb, dim=1).square()
    return sq


def row_sq_norms(x: Tensor, centre: Tensor | None = None, rows: Tensor | None = None) -> Tensor:
    """``[k]`` float64 ‖x_i − centre‖² over ``x[rows]`` (centre 0 and all rows by default),
    by direct differences.

    float32 input is reduced in float32 (a difference of two float32 values is rounded
    relative to itself, so direct differences lose nothing); rows whose float32 result is
    outside the safe range [2^-40, 2^40] (huge, tiny, zero, NaN/Inf) are redone in float64,
    block by block. Non-finite exactly for the rows holding a NaN/Inf (or, for float64
    input, whose squared norm overflows float64): this is also the rules' test for
    non-finite rows.
    """

    def c64() -> Tensor | None:
        return None if centre is None else centre.to(device=x.device, dtype=W)

    if x.dtype != torch.float32:
        return _sq_norms64(x, rows, c64())
    if centre is None:
        n = torch.linalg.vector_norm(x if rows is None else x[rows], dim=1)
    else:  # the difference needs a temporary: block by block, in the cache
        c32 = centre.to(device=x.device, dtype=torch.float32)
        acc = torch.zeros(x.shape[0] if rows is None else rows.numel(), device=x.device)
        for blk in column_blocks(x):
            xb = x[:, blk] if rows is None else x[rows, blk]
            acc += torch.linalg.vector_norm(xb - c32[blk], dim=1).square()
        n = acc.sqrt()  # any block above 2^40 or non-finite shows in the total
    out = n.to(W).square()
    ok = _safe(n)
    if not bool(ok.all()):
        bad = (~ok).nonzero().squeeze(1)
        out[bad] = _sq_norms64(x, bad if rows is None else rows[bad], c64())
    return out


def row_norms(x: Tensor) -> Tensor:
    """``[S]`` float64 Euclidean norms of the rows (see :func:`row_sq_norms`)."""
    return row_sq_norms(x).sqrt()


def row_dists(x: Tensor, centre: Tensor) -> Tensor:
    """``[S]`` float64 distances ‖x_i − centre‖, computed directly (no Gram cancellation)."""
    return row_sq_norms(x, centre).sqrt()


class RefGeometry(NamedTuple):
    """Geometry of every row g_m against a reference r (DRAG paper, Secs. III–IV; FLTrust), in
    float64."""

    norms: Tensor  #: [S] ‖g_m‖
    ref_norm: Tensor  #: [] ‖r‖
    cos: Tensor  #: [S] cos(g_m, r) clamped to [-1, 1]; 0 where undefined
    defined: Tensor  #: [S] bool: ‖g_m‖ > 0 and ‖r‖ > 0 and both finite
    nonfinite: Tensor  #: [S] bool: the row (or its norm / ⟨g_m, r⟩) is NaN or Inf


def ref_geometry(x: Tensor, r: Tensor) -> RefGeometry:
    """Norms and cosines against ``r``: one norm pass and one GEMV over ``x``.

    float32 input is reduced in float32 and the rows outside the safe range [2^-40, 2^40]
    (where ⟨g_m, r⟩ and ‖g_m‖² could overflow or underflow) are redone in float64, block by
    block; every [S] quantity is float64. A row is flagged non-finite when its norm or its
    inner product with r is not finite: a NaN/Inf entry always shows there (0 · Inf = NaN),
    and finite float32 rows never do.
    """
    r = r.to(device=x.device)
    ref_norm = row_sq_norms(r[None, :])[0].sqrt()
    if x.dtype == torch.float32:
        r32 = r.to(torch.float32)
        n = torch.linalg.vector_norm(x, dim=1)
        sq, dots = n.to(W).square(), (x @ r32).to(W)
        r_ok = bool(_safe(torch.linalg.vector_norm(r32))) or bool(ref_norm == 0)
        ok = _safe(n) if r_ok else torch.zeros_like(n, dtype=torch.bool)
        if not bool(ok.all()):
            r64 = r.to(W)
            bad = (~ok).nonzero().squeeze(1)
            sq_b = torch.zeros(bad.numel(), dtype=W, device=x.device)
            dots_b = torch.zeros_like(sq_b)
            for blk in column_blocks(x):
                xb = x[bad, blk].to(W)
                sq_b += torch.linalg.vector_norm(xb, dim=1).square()
                dots_b += xb @ r64[blk]
            sq[bad], dots[bad] = sq_b, dots_b
    else:
        r64 = r.to(W)
        sq = torch.zeros(x.shape[0], dtype=W, device=x.device)
        dots = torch.zeros_like(sq)
        for blk in column_blocks(x):
            xb = _block(x, blk)
            sq += torch.linalg.vector_norm(xb, dim=1).square()
            dots += xb @ r64[blk]
    norms = sq.sqrt()
    nonfinite = ~(torch.isfinite(norms) & torch.isfinite(dots))
    defined = ~nonfinite & (norms > 0) & (ref_norm > 0) & torch.isfinite(ref_norm)
    denom = torch.where(defined, norms * ref_norm, torch.ones_like(norms))
    cos = torch.where(defined, dots / denom, torch.zeros_like(dots)).clamp(-1.0, 1.0)
    return RefGeometry(norms, ref_norm, cos, defined, nonfinite)


def rho_ratios(geo: RefGeometry) -> tuple[Tensor, Tensor]:
    """ρ_m = ‖r‖/‖g_m‖ (DRAG paper, Assumption 3, Fig. 10) and the mask of rows where it exists."""
    ok = (geo.norms > 0) & ~geo.nonfinite
    return safe_div(geo.ref_norm.expand_as(geo.norms), geo.norms, ok), ok


def rho_diagnostics(geo: RefGeometry) -> dict[str, float]:
    """``agg/rho_min`` and ``agg/rho_max``: the extremes of ρ_m over the rows where it exists."""
    rho, has_norm = rho_ratios(geo)
    return {
        "agg/rho_min": masked_stat(rho, has_norm, "min"),
        "agg/rho_max": masked_stat(rho, has_norm, "max"),
    }


def safe_div(num: Tensor, den: Tensor, mask: Tensor) -> Tensor:
    """``num / den`` where ``mask``, else 0 (no NaN from the masked-out lanes)."""
    return torch.where(mask, num / torch.where(mask, den, torch.ones_like(den)), 0.0)


def masked_stat(values: Tensor, mask: Tensor, how: str) -> float:
    """min / max / mean of ``values[mask]`` as a Python float (NaN when the mask is empty)."""
    if not bool(mask.any()):
        return float("nan")
    sel = values[mask]
    stats: dict[str, Callable[[], Tensor]] = {"min": sel.min, "max": sel.max, "mean": sel.mean}
    return float(stats[how]())


def weighted_median(values: Tensor, weights: Tensor) -> Tensor:
    """The lower weighted median of ``values`` (weights ≥ 0 with a positive sum)."""
    order = values.argsort()
    cum = weights[order].cumsum(0)
    k = int(torch.searchsorted(cum, 0.5 * cum[-1]))
    return values[order[min(k, values.numel() - 1)]]


# -- combinations -----------------------------------------------------------------------------
def _coefficients_safe(coef: Tensor) -> bool:
    a = coef.abs()
    nz = a[a > 0]
    return nz.numel() == 0 or (
        bool(nz.min() >= _COEF_RANGE[0]) and bool(nz.max() <= _COEF_RANGE[1])
    )


def combine_rows(
    coef: Tensor,
    x: Tensor,
    skip: Tensor | None = None,
    *,
    extra: tuple[Tensor | float, Tensor] | None = None,
) -> Tensor:
    """``Σ_m coef_m x_m (+ c · r for extra = (c, r))`` in ``x.dtype``, finite.

    Rows in ``skip`` are left out entirely (not given coefficient 0: 0 · NaN = NaN). The
    fast path is one GEMV in the input dtype (and an in-place ``+ c·r``), taken when nothing
    is skipped and the coefficients are within [2^-100, 2^100]; its result is checked and
    redone in float64, block by block, if it overflowed. The result is clamped to the
    dtype's range.
    """
    coef = coef.to(device=x.device, dtype=W)
    cr = None if extra is None else float(extra[0])
    skipping = skip is not None and bool(skip.any())
    fast = not skipping and x.dtype in (torch.float32, torch.float64)
    if (
        fast
        and _coefficients_safe(coef)
        and (cr is None or _coefficients_safe(coef.new_tensor([cr])))
    ):
        out = coef.to(x.dtype) @ x
        if extra is not None:
            out.add_(extra[1].to(device=x.device, dtype=x.dtype), alpha=cr)
        if x.dtype == W:
            return to_dtype(out, W)
        if all_finite(out):
            return out
    keep = None if not skipping else (~skip).nonzero().squeeze(1)  # type: ignore[operator]
    c = coef if keep is None else coef[keep]
    acc = torch.empty(x.shape[1], dtype=W, device=x.device)
    for blk in column_blocks(x):
        acc[blk] = c @ _block(x, blk, keep)
    if extra is not None:
        acc.add_(extra[1].to(device=x.device, dtype=W), alpha=cr)
    return to_dtype(acc, x.dtype)


# -- pairwise geometry ------------------------------------------------------------------------
def _gram(x: Tensor, rows: Tensor | None, centre: Tensor | None) -> Tensor:
    """G of ``x[rows]`` about ``centre`` (the column means of those rows when None)."""
    k = x.shape[0] if rows is None else rows.numel()
    g = torch.zeros(k, k, dtype=W, device=x.device)
    fresh = x.dtype != W or rows is not None  # _block made a copy we may overwrite
    for blk in column_blocks(x):
        xb = _block(x, blk, rows)
        c = xb.mean(0) if centre is None else centre[blk]
        xc = xb.sub_(c) if fresh else xb - c
        g.addmm_(xc, xc.T)
    # A GEMM kernel may round G_ij and G_ji differently (edge tiles, AVX-512 vs AVX2 paths);
    # the mean of the two is exactly symmetric (float addition commutes), so D_ij = D_ji and
    # Krum's ties between mutual nearest neighbours are exact ties on every CPU.
    return g.add_(g.T.clone()).mul_(0.5)


def centered_gram(
    x: Tensor, rows: Tensor | None = None, centre: Tensor | None = None
) -> tuple[Tensor, Tensor]:
    """``([k, k] float64 Gram matrix, [k] finite mask)`` of the rows ``x[rows]`` (all rows
    by default), centred on ``centre`` (float64 ``[d]``) when given.

    The rows are centred block by block on their column means: centring keeps the Gram
    trick accurate when the rows share a large common offset (models θ_m rather than
    updates g_m), since rounding errors are then relative to the rows' spread. A NaN/Inf
    entry spoils every entry (through the means), which the diagonal shows: only then are
    the non-finite rows found (:func:`row_sq_norms`) and the matrix redone without them,
    so the common case is one pass. Entries of non-finite rows are 0: index ``G[ok][:, ok]``.
    """
    if centre is not None:
        centre = centre.to(device=x.device, dtype=W)
    g = _gram(x, rows, centre)
    ok = torch.isfinite(g.diagonal())
    if bool(ok.all()):
        return g, ok
    ok = torch.isfinite(row_sq_norms(x, rows=rows))
    sel = ok.nonzero().squeeze(1)
    g = torch.zeros_like(g)
    if sel.numel():
        base = torch.arange(x.shape[0], device=x.device) if rows is None else rows
        g[sel[:, None], sel[None, :]] = _gram(x, base[sel], centre)
    return g, ok


def sq_dists_from_gram(g: Tensor) -> Tensor:
    """``D²_ij = G_ii + G_jj − 2 G_ij`` with rounding negatives clamped and an exact 0 diagonal."""
    n = g.diagonal()
    d2 = (n[:, None] + n[None, :] - 2.0 * g).clamp_min(0.0)
    return d2.fill_diagonal_(0.0)


def _components(flag: Tensor) -> list[Tensor]:
    """Connected components (of at least 2 nodes) of the graph with adjacency ``flag``."""
    k = flag.shape[0]
    adj = flag.cpu() | torch.eye(k, dtype=torch.bool)
    lab = torch.arange(k)
    while True:  # min-label propagation: at most k sweeps of an O(k²) step, k is small
        new = torch.where(adj, lab[None, :], k).min(dim=1).values
        if torch.equal(new, lab):
            break
        lab = new
    out = [(lab == v).nonzero().squeeze(1) for v in lab.unique()]
    return [c.to(flag.device) for c in out if c.numel() > 1]


def _direct_sq_dists(x: Tensor, rows: Tensor) -> Tensor:
    """``[k, k]`` squared distances among ``x[rows]`` by direct differences (O(k²·d))."""
    k = rows.numel()
    d2 = torch.zeros(k, k, dtype=W, device=x.device)
    for blk in column_blocks(x):
        xb = _block(x, blk, rows)
        for i in range(k):
            d2[i] += torch.linalg.vector_norm(xb - xb[i], dim=1).square()
    d2 = 0.5 * (d2 + d2.T)  # exactly symmetric, whatever the reduction kernel did per row
    return d2.fill_diagonal_(0.0)


def _refine(x: Tensor, rows: Tensor, g: Tensor, d2: Tensor) -> None:
    """Recompute, in place in ``d2``, the pairs that cancellation may have spoilt."""
    n = g.diagonal()
    flag = d2 < _CANCEL * (n[:, None] + n[None, :])
    flag.fill_diagonal_(False)
    if not bool(flag.any()):
        return
    for comp in _components(flag):
        sub = rows[comp]
        if comp.numel() == rows.numel():  # re-centring on the same rows cannot help
            fixed = _direct_sq_dists(x, sub)
        else:  # re-centre on this group's own mean: its spread is now the scale
            g_sub, _ = centered_gram(x, sub)
            fixed = sq_dists_from_gram(g_sub)
            _refine(x, sub, g_sub, fixed)
        d2[comp[:, None], comp[None, :]] = fixed


def pairwise_sq_dists(x: Tensor) -> tuple[Tensor, Tensor]:
    """``([k, k] float64 squared distances, [k] indices)`` among the finite rows of ``x``.

    One blocked Gram pass (float64, centred); pairs that lost more than ~20 bits to
    cancellation are recomputed on a Gram matrix re-centred on their own group (groups:
    connected components of the spoilt pairs), recursively, and by direct differences if a
    group cannot be split. Near-duplicate rows (ALIE, Mimic) form such small groups.
    """
    g, ok = centered_gram(x)
    keep = ok.nonzero().squeeze(1)
    if keep.numel() < x.shape[0]:
        g = g[keep][:, keep]
    d2 = sq_dists_from_gram(g)
    _refine(x, keep, g, d2)
    return d2, keep


#: Relative round-off of a distance from ``pairwise_sq_dists``: a pair is recomputed unless
#: D² ≥ 2^-20 (G_ii + G_jj), so the Gram pass's error (a few ε·(G_ii + G_jj), ε = 2^-52)
#: is at most ~2^-32 of D²; 2^-26 leaves a factor 64 for the summation over d.
DIST_RTOL = 2.0**-26


def snap_ties(values: Tensor, rtol: float = DIST_RTOL, atol: float = 0.0) -> Tensor:
    """``values`` (≥ 0) with every value within ``rtol`` (relative) + ``atol`` above a
    smaller one replaced by it, in ascending order (each group takes its smallest value;
    groups do not chain past the tolerance of their first value). Scores equal in exact
    arithmetic — distances between duplicated rows, integer grids — then compare equal, so
    the rules' documented tie rule (first index, first subset) decides, not round-off."""
    uniq, inverse = torch.unique(values, return_inverse=True)
    reps = uniq.clone()
    first = float(uniq[0]) if uniq.numel() else 0.0
    for k, v in enumerate(uniq.tolist()):
        if v > first * (1.0 + rtol) + atol:
            first = v
        reps[k] = first
    return reps[inverse]


__all__ = [
    "DIST_RTOL",
    "RefGeometry",
    "W",
    "centered_gram",
    "all_finite",
    "column_blocks",
    "combine_rows",
    "masked_stat",
    "pairwise_sq_dists",
    "ref_geometry",
    "rho_ratios",
    "row_dists",
    "row_norms",
    "row_sq_norms",
    "safe_div",
    "snap_ties",
    "sq_dists_from_gram",
    "to_dtype",
    "weighted_median",
]
