"""The upload check chain (docs/security.md): every field a client sends is untrusted.

Every backend runs :func:`screen` on a round's uploads before anything reads them — the
simulator (:mod:`fedshield.sim.engine`), the Flower strategy that wraps it and the
Flower-native strategies. An :class:`UploadSpec` says what a valid upload looks like this
round: the delta's length and dtype (θ's), the buffers' length, dtype and lower bounds
(BatchNorm variances are ≥ 0), the extras the configured client algorithm declares
(:meth:`ClientAlgorithm.upload_spec`), the coverage mask each client must send, and the
range of a self-reported sample count. An upload that fails any check is rejected whole,
with one reason; the reasons are counted into the round's metrics as
``sys/rejected/<reason>``.

Sample counts: when ``trusted_counts`` is given (the simulator knows every partition's size)
they replace the self-reported ``num_examples``; otherwise the reported count must be an
integer in ``[0, max_num_examples]``, and never above :data:`COUNT_CEILING` (2⁵³, the
largest integer float64 weights hold exactly), so a count cannot overflow the weights.

Tensors must be dense (strided) with data (not on the ``meta`` device: reasons
``delta_device``, ``buffers_device``) and are kept detached from any autograd graph; ``extras``
and ``metrics`` must be mappings (a client's metrics are only logged, never trusted).
"""

from __future__ import annotations

import logging
import math
import numbers
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import TypeGuard

import torch
from torch import Tensor

from fedshield.core.context import ClientUpdate

log = logging.getLogger("fedshield")

#: The largest sample count accepted from a client whatever ``max_num_examples`` says.
COUNT_CEILING = 2**53


@dataclass(frozen=True)
class FieldSpec:
    """A valid extra: its exact shape, its dtype (None: θ's dtype), finite values, and
    optionally a range, integrality or an exact expected value (e.g. a head shape the server
    knows from its own model)."""

    shape: tuple[int, ...]
    dtype: torch.dtype | None = None
    min: float | None = None
    max: float | None = None
    integral: bool = False
    equals: Tensor | None = None


@dataclass(frozen=True)
class UploadSpec:
    """What a valid upload of this round looks like (see the module docstring)."""

    num_params: int
    dtype: torch.dtype
    num_buffers: int
    #: per-entry lower bound of the buffers (0 for BatchNorm running variances), or None
    buffer_min: Tensor | None = None
    #: extras the client algorithm may upload; an extra not declared here is rejected
    extras: Mapping[str, FieldSpec] = field(default_factory=dict)
    #: client id → its expected coverage mask (None: full coverage, no mask allowed).
    #: ``None`` for the whole mapping: masks are not expected at all.
    masks: Mapping[int, Tensor | None] | None = None
    max_num_examples: int | None = None
    #: client id → the sample count the server knows (replaces the reported one)
    trusted_counts: Mapping[int, int] | None = None
    #: client id → extras the server knows (per-class counts): replace the reported ones
    trusted_extras: Mapping[int, Mapping[str, Tensor]] | None = None


def _finite(t: Tensor) -> bool:
    return bool(torch.isfinite(t).all()) if t.is_floating_point() else True


def is_dense(t: object) -> TypeGuard[Tensor]:
    """A tensor with the ordinary strided layout (no sparse or other layouts) that holds
    data (not on PyTorch's ``meta`` device, whose values cannot be read)."""
    return isinstance(t, Tensor) and t.layout == torch.strided and not _no_data(t)


def _no_data(t: object) -> bool:
    """A tensor without values (``meta`` device): reading one raises, so it is rejected
    (an in-process client's meta delta aborted the round)."""
    return isinstance(t, Tensor) and t.device.type == "meta"


def _check_field(name: str, t: object, spec: FieldSpec, dtype: torch.dtype) -> str | None:
    if not is_dense(t):
        return f"extra_{name}"
    want = spec.dtype or dtype
    if tuple(t.shape) != spec.shape or t.dtype != want or not _finite(t):
        return f"extra_{name}"
    if spec.min is not None and t.numel() and float(t.min()) < spec.min:
        return f"extra_{name}"
    if spec.max is not None and t.numel() and float(t.max()) > spec.max:
        return f"extra_{name}"
    if spec.integral and t.is_floating_point() and not bool((t == t.round()).all()):
        return f"extra_{name}"
    if spec.equals is not None and not torch.equal(t, spec.equals.to(t.device, t.dtype)):
        return f"extra_{name}"
    return None


def _valid_count(n: object, cap: int | None) -> bool:
    if isinstance(n, bool):
        return False
    if isinstance(n, Tensor):
        if n.numel() != 1 or n.is_floating_point() and not bool(torch.isfinite(n).all()):
            return False
        n = n.item()
    if isinstance(n, float):
        if not math.isfinite(n) or n != int(n):
            return False
        n = int(n)
    if not isinstance(n, int) or n < 0 or n > COUNT_CEILING:
        return False
    return cap is None or n <= cap


def _flat_reason(name: str, t: Tensor, size: int, dtype: torch.dtype) -> str | None:
    """Why the flat field ``name`` (``delta``, ``buffers``) is rejected, or None."""
    if _no_data(t):
        return f"{name}_device"
    if not is_dense(t) or tuple(t.shape) != (size,):
        return f"{name}_shape"
    if t.dtype != dtype:
        return f"{name}_dtype"
    if not _finite(t):
        return f"{name}_nonfinite"
    return None


def check_upload(u: ClientUpdate, spec: UploadSpec) -> str | None:
    """The reason ``u`` must be rejected, or None when every field is valid."""
    reason = _flat_reason("delta", u.delta, spec.num_params, spec.dtype) or _flat_reason(
        "buffers", u.buffers, spec.num_buffers, spec.dtype
    )
    if reason is not None:
        return reason
    b = u.buffers
    if spec.buffer_min is not None and b.numel():
        low = spec.buffer_min.to(b.device, b.dtype)
        if not bool((b >= low).all()):
            return "buffers_range"
    if spec.masks is None:
        if u.mask is not None:
            return "mask"
    else:
        want = spec.masks.get(u.client_id)
        got = u.mask
        if want is None:  # full coverage: no mask, or an all-True one of θ's length
            if got is not None and not (
                is_dense(got)
                and got.dtype == torch.bool
                and tuple(got.shape) == (spec.num_params,)
                and bool(got.all())
            ):
                return "mask"
        elif (
            not is_dense(got)
            or got.dtype != torch.bool
            or tuple(got.shape) != (spec.num_params,)
            or not torch.equal(got, want.to(got.device))
        ):
            return "mask"
    if not isinstance(u.extras, Mapping):
        return "extras"
    if not isinstance(u.metrics, Mapping):
        return "metrics"
    for name, t in u.extras.items():
        fs = spec.extras.get(name)
        if fs is None:
            return "extra_unexpected"
        reason = _check_field(name, t, fs, spec.dtype)
        if reason is not None:
            return reason
    if spec.trusted_counts is None and not _valid_count(u.num_examples, spec.max_num_examples):
        return "num_examples"
    return None


@dataclass
class ScreenResult:
    kept: list[ClientUpdate]
    rejected: Counter[str]

    @property
    def num_rejected(self) -> int:
        return sum(self.rejected.values())

    def metrics(self) -> dict[str, float]:
        out: dict[str, float] = {"sys/rejected": float(self.num_rejected)}
        out.update({f"sys/rejected/{k}": float(v) for k, v in sorted(self.rejected.items())})
        return out


def _detached(u: ClientUpdate) -> ClientUpdate:
    """``u`` with its tensors cut from any autograd graph (a delta that requires grad would
    otherwise make θ require grad); views of the same storage, no copy."""
    if not (
        u.delta.requires_grad
        or u.buffers.requires_grad
        or any(t.requires_grad for t in u.extras.values())
    ):
        return u
    return replace(
        u,
        delta=u.delta.detach(),
        buffers=u.buffers.detach(),
        extras={k: t.detach() for k, t in u.extras.items()},
    )


def finite_metric(u: ClientUpdate, key: str) -> float | None:
    """A client-reported metric as a finite float, or None (they are untrusted, only
    logged: a string, a list or a NaN in them must not abort a round)."""
    metrics = u.metrics if isinstance(u.metrics, Mapping) else {}
    value = metrics.get(key)
    if isinstance(value, bool) or not isinstance(value, (numbers.Real, Tensor)):
        return None
    if isinstance(value, Tensor):
        if value.numel() != 1:
            return None
        value = value.item()
    value = float(value)
    return value if math.isfinite(value) else None


def screen(updates: Sequence[ClientUpdate], spec: UploadSpec) -> ScreenResult:
    """Check every upload (:func:`check_upload`); keep the valid ones, with their sample
    count replaced by the trusted one when the spec has them. Inputs are not modified."""
    kept: list[ClientUpdate] = []
    rejected: Counter[str] = Counter()
    for u in updates:
        reason = check_upload(u, spec)
        if reason is not None:
            rejected[reason] += 1
            log.warning("rejected the upload of client %s (%s)", u.client_id, reason)
            continue
        if spec.trusted_counts is not None:
            n = spec.trusted_counts.get(u.client_id)
            if n is None:
                rejected["unknown_client"] += 1
                log.warning("rejected the upload of unknown client %s", u.client_id)
                continue
            u = replace(u, num_examples=int(n))
            known = (spec.trusted_extras or {}).get(u.client_id, {})
            if any(k in u.extras for k in known):
                extras = {
                    k: known[k].to(t.device, t.dtype) if k in known else t
                    for k, t in u.extras.items()
                }
                u = replace(u, extras=extras)
        else:
            u = replace(u, num_examples=int(u.num_examples))
        kept.append(_detached(u))
    return ScreenResult(kept, rejected)


__all__ = [
    "COUNT_CEILING",
    "FieldSpec",
    "ScreenResult",
    "UploadSpec",
    "check_upload",
    "finite_metric",
    "is_dense",
    "screen",
]
