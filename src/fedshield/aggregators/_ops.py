"""Shared tensor helpers for the aggregation rules (no state, no Python loops over d).

Everything here is O(S·d) or one ``[S, d] × [d, S]`` matmul; the per-client quantities
(norms, cosines, distances) are ``[S]`` or ``[S, S]`` tensors on the updates' device.
"""

from __future__ import annotations

import math
import operator
from typing import NamedTuple

import torch
from torch import Tensor

from fedshield.errors import ConfigError


# -- hyper-parameter checks (raise ConfigError naming the parameter) ------------------------
def check_int(owner: str, name: str, value: object, minimum: int = 0) -> int:
    """``value`` as an int ≥ ``minimum``; bools and floats are refused (``f=1.5`` is a typo)."""
    if isinstance(value, bool):
        raise ConfigError(f"{owner}: {name} must be an integer, got {value!r}")
    try:
        out = operator.index(value)  # accepts int and numpy integers, refuses 2.0
    except TypeError:
        raise ConfigError(f"{owner}: {name} must be an integer, got {value!r}") from None
    if out < minimum:
        raise ConfigError(f"{owner}: {name} must be >= {minimum}, got {out}")
    return out


def check_float(
    owner: str, name: str, value: object, minimum: float = 0.0, strict: bool = False
) -> float:
    """``value`` as a finite float ≥ ``minimum`` (> when ``strict``)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ConfigError(f"{owner}: {name} must be a number, got {value!r}")
    out = float(value)
    bad = out <= minimum if strict else out < minimum
    if not math.isfinite(out) or bad:
        op = ">" if strict else ">="
        raise ConfigError(f"{owner}: {name} must be a finite number {op} {minimum}, got {value!r}")
    return out


def check_reference(owner: str, reference: Tensor | None, updates: Tensor) -> Tensor:
    """The reference direction as a ``[d]`` tensor on the updates' device and dtype."""
    if reference is None:
        raise ValueError(f"{owner} needs a reference direction (reference=...)")
    d = updates.shape[1]
    if reference.shape != (d,):
        raise ValueError(f"{owner}: reference must be [{d}], got shape {tuple(reference.shape)}")
    return reference.to(device=updates.device, dtype=updates.dtype)


# -- per-row geometry -------------------------------------------------------------------------
def row_norms(x: Tensor) -> Tensor:
    """``[S]`` Euclidean norms of the rows (one pass, no ``[S, d]`` temporary)."""
    return torch.linalg.vector_norm(x, dim=1)


class RefGeometry(NamedTuple):
    """Geometry of every row g_m against a reference r (SPEC §2–§3, §5)."""

    norms: Tensor  #: [S] ‖g_m‖
    ref_norm: Tensor  #: [] ‖r‖
    cos: Tensor  #: [S] cos(g_m, r) clamped to [-1, 1]; 0 where undefined
    defined: Tensor  #: [S] bool: ‖g_m‖ > 0 and ‖r‖ > 0 and both finite
    nonfinite: Tensor  #: [S] bool: the row (or its norm / ⟨g_m, r⟩) is NaN or Inf


def ref_geometry(x: Tensor, r: Tensor) -> RefGeometry:
    """Norms and cosines against ``r`` in two passes over ``x`` (a norm and a GEMV).

    A row is flagged non-finite when its norm or its inner product with r is not finite:
    a NaN/Inf entry always shows there, and a finite row whose norm overflows is unusable
    for calibration anyway. This avoids an ``isfinite`` pass over the whole matrix.
    """
    norms = row_norms(x)
    dots = x @ r
    ref_norm = torch.linalg.vector_norm(r)
    nonfinite = ~(torch.isfinite(norms) & torch.isfinite(dots))
    defined = ~nonfinite & (norms > 0) & (ref_norm > 0) & torch.isfinite(ref_norm)
    denom = torch.where(defined, norms * ref_norm, torch.ones_like(norms))
    cos = torch.where(defined, dots / denom, torch.zeros_like(dots)).clamp(-1.0, 1.0)
    return RefGeometry(norms, ref_norm, cos, defined, nonfinite)


def rho_ratios(geo: RefGeometry) -> tuple[Tensor, Tensor]:
    """ρ_m = ‖r‖/‖g_m‖ (seed 000 Assumption 3, Fig. 10) and the mask of rows where it exists."""
    ok = (geo.norms > 0) & ~geo.nonfinite
    return safe_div(geo.ref_norm.expand_as(geo.norms), geo.norms, ok), ok


def safe_div(num: Tensor, den: Tensor, mask: Tensor) -> Tensor:
    """``num / den`` where ``mask``, else 0 (no NaN from the masked-out lanes)."""
    return torch.where(mask, num / torch.where(mask, den, torch.ones_like(den)), 0.0)


def combine_rows(coef: Tensor, x: Tensor, skip: Tensor | None = None) -> Tensor:
    """``Σ_m coef_m x_m`` as one GEMV; rows in ``skip`` are left out entirely.

    Leaving a row out (rather than giving it coefficient 0) matters when it holds NaN/Inf:
    0 · NaN = NaN. The copy of the kept rows is only made when some row must be skipped.
    """
    if skip is not None and bool(skip.any()):
        keep = ~skip
        return coef[keep] @ x[keep]
    return coef @ x


def masked_stat(values: Tensor, mask: Tensor, how: str) -> float:
    """min / max / mean of ``values[mask]`` as a Python float (NaN when the mask is empty)."""
    if not bool(mask.any()):
        return float("nan")
    sel = values[mask]
    return float({"min": sel.min, "max": sel.max, "mean": sel.mean}[how]())


# -- pairwise geometry ------------------------------------------------------------------------
#: Column blocks of about this many elements (8 MiB of float32) stay in a CPU's last-level
#: cache; larger blocks lose the cache, smaller ones pay more per-op (thread sync) overhead.
_BLOCK_ELEMS = 1 << 21


def column_blocks(x: Tensor) -> list[slice]:
    """Column slices for cache blocking on CPU; one slice covering everything elsewhere.

    Used where a rule needs a temporary of the shape of ``x`` (x − centre): block by block
    it never leaves the cache, which halves the time on CPU at d = 10^6, and saves the
    ``[S, d]`` allocation. A loop over a few dozen blocks, each fully vectorised.
    """
    s, d = x.shape
    if x.device.type != "cpu":
        return [slice(0, d)]
    step = max(1024, _BLOCK_ELEMS // max(s, 1))
    return [slice(i, min(i + step, d)) for i in range(0, d, step)]


def row_dists(x: Tensor, centre: Tensor) -> Tensor:
    """``[S]`` distances ‖x_i − centre‖, computed directly (no Gram-trick cancellation)."""
    sq = x.new_zeros(x.shape[0])
    for blk in column_blocks(x):
        sq += torch.linalg.vector_norm(x[:, blk] - centre[blk], dim=1).square()
    return sq.sqrt()


def centered_gram(x: Tensor) -> Tensor:
    """``[S, S]`` Gram matrix of the mean-centred rows.

    Centring first keeps the Gram trick accurate when the rows share a large common offset
    (e.g. models θ_m rather than updates g_m): the rounding error of ‖x_i − x_j‖² is then
    relative to the spread of the rows, not to ‖x_i‖².
    """
    mean = x.mean(dim=0)
    g = x.new_zeros(x.shape[0], x.shape[0])
    for blk in column_blocks(x):
        xc = x[:, blk] - mean[blk]
        g.addmm_(xc, xc.T)
    return g


def sq_dists_from_gram(g: Tensor) -> Tensor:
    """``D²_ij = G_ii + G_jj − 2 G_ij`` with rounding negatives clamped and an exact 0 diagonal."""
    n = g.diagonal()
    d2 = (n[:, None] + n[None, :] - 2.0 * g).clamp_min(0.0)
    return d2.fill_diagonal_(0.0)


def pairwise_sq_dists(x: Tensor) -> Tensor:
    """``[S, S]`` squared Euclidean distances between the rows of ``x``."""
    return sq_dists_from_gram(centered_gram(x))
