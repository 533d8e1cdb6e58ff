"""One checker for every piece of state read back (docs/security.md: state loaded is untrusted).

A resumed checkpoint (:mod:`fedshield.sim.resume`), a SuperNode's saved client state
(:mod:`fedshield.flower.client_app`) and a ``strategy.state`` assigned to a Flower-native
strategy (:class:`fedshield.flower.adapter.FedshieldRule`) all go through these functions:

* :func:`check_tensor` — a dense tensor with data (not on the ``meta`` device), the shape
  and dtype of a reference tensor, finite values, an optional lower bound;
* :func:`check_table` — a named-tensor table against a declared spec (key → reference, or
  None for "any shape, finite"): a key the spec does not declare is refused, so keys a
  server algorithm creates after round 1 (DRAG's ``ref``, FedACG's ``m``) are checked
  against what the algorithm declares (:meth:`ServerAlgorithm.state_spec`), not waved
  through;
* :func:`check_round` — the round counter within ``[1, rounds + 1]`` of the config that
  wrote it (``round = 10^15`` resumed with exit 0 and ran no round);
* :func:`check_norm` — a norm equal to the one recorded when the state was written;
* :func:`check_scale` — a θ-shaped tensor at most :data:`MAX_SCALE` × max(‖θ‖, 1) (a
  FedACG momentum of 1e30 stepped θ by 1.8e31), used where no norm was recorded.

What these checks promise: a file that was corrupted, truncated, mixed up with another
run's, or edited by hand is refused with one message naming the file and the field. They
do not authenticate: someone who can rewrite the run folder can write a consistent state
(see ``docs/security.md``).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from typing import Any

import torch
from torch import Tensor

from fedshield.errors import DataError

#: Relative tolerance of a recorded norm: float64 norms of the same float32 values, the
#: record rounded to JSON's shortest repr; a tampered value is off by orders of magnitude.
NORM_RTOL = 1e-9

#: A θ-shaped server state (momentum, reference, centre, control variate) larger than this
#: × max(‖θ‖, 1) is refused when nothing recorded its norm: it is a sum of the round's
#: steps, and a state a million times the model it steps would move θ a million-fold in one
#: round — no run reaches it, an edit (1e30) does.
MAX_SCALE = 1e6


def check_tensor(
    field: str,
    value: Any,
    like: Tensor | None = None,
    *,
    low: Tensor | None = None,
    error: type[Exception] = DataError,
) -> Tensor:
    """``value`` when it is a dense tensor with data, ``like``'s shape and dtype (when
    given), finite and ≥ ``low`` (when given); else ``error`` naming ``field``."""
    if not isinstance(value, Tensor) or value.layout != torch.strided:
        raise error(f"{field} is not a dense tensor")
    if value.device.type == "meta":
        raise error(f"{field} has no data (a meta-device tensor)")
    if like is not None and (tuple(value.shape) != tuple(like.shape) or value.dtype != like.dtype):
        raise error(
            f"{field} has shape {tuple(value.shape)} and dtype {value.dtype}, this run's is "
            f"{tuple(like.shape)} {like.dtype}"
        )
    if value.is_floating_point() and not bool(torch.isfinite(value).all()):
        raise error(f"{field} holds NaN/Inf values")
    if (
        low is not None
        and value.numel()
        and not bool((value >= low.to(value.device, value.dtype)).all())
    ):
        raise error(f"{field} is out of range (below its lower bound: a negative variance)")
    return value


def check_table(
    field: str,
    table: Any,
    spec: Mapping[str, Tensor | None] | None,
    *,
    required: Iterable[str] = (),
    error: type[Exception] = DataError,
) -> dict[str, Tensor]:
    """``table`` when it maps names to tensors that :func:`check_tensor` accepts against
    ``spec`` (a key → None: any shape), holds every ``required`` key and no key ``spec``
    lacks (``spec`` None: any name, any shape — a loader that checks the rest later)."""
    if not isinstance(table, Mapping):
        raise error(f"{field} is not a table of named tensors")
    for key, value in table.items():
        if not isinstance(key, str) or (spec is not None and key not in spec):
            known = ", ".join(repr(k) for k in sorted(spec or ())) or "none"
            raise error(f"{field} has a key {key!r} this run's state never holds (known: {known})")
        check_tensor(f"{field}[{key!r}]", value, None if spec is None else spec[key], error=error)
    missing = sorted(set(required) - set(table))
    if missing:
        raise error(f"{field} lacks {missing[0]!r}")
    return dict(table)


def check_round(field: str, rnd: Any, rounds: Any, error: type[Exception] = DataError) -> int:
    """A round counter of a run of ``rounds`` rounds: the next round to run, 1 … rounds+1
    (rounds + 1: the run is finished)."""
    if isinstance(rnd, bool) or not isinstance(rnd, int) or rnd < 1:
        raise error(f"{field} is {rnd!r}, expected a round number >= 1")
    if isinstance(rounds, int) and not isinstance(rounds, bool) and rnd > rounds + 1:
        raise error(
            f"{field} is {rnd}, beyond the {rounds} rounds of the run that wrote it (at most "
            f"{rounds + 1}: finished)"
        )
    return rnd


def check_norm(
    field: str, got: float, want: Any, source: str, error: type[Exception] = DataError
) -> None:
    """``got`` (a float64 norm) equals the norm ``want`` that ``source`` recorded."""
    if isinstance(want, bool) or not isinstance(want, int | float):
        return
    if not math.isclose(got, float(want), rel_tol=NORM_RTOL, abs_tol=1e-300):
        raise error(
            f"{field} has norm {got:.6g}, but {source} recorded {float(want):.6g}: the state "
            "is not the one written"
        )


def check_scale(
    field: str, value: Tensor, params: Tensor, error: type[Exception] = DataError
) -> None:
    """A θ-shaped state within :data:`MAX_SCALE` × max(‖θ‖, 1) (float64 norms)."""
    norm = float(value.detach().double().norm())
    limit = MAX_SCALE * max(float(params.detach().double().norm()), 1.0)
    if norm > limit:
        raise error(
            f"{field} has norm {norm:.3g}, more than {MAX_SCALE:.0e} × the model's "
            f"({limit / MAX_SCALE:.3g}): no run reaches such a state"
        )


__all__ = [
    "MAX_SCALE",
    "NORM_RTOL",
    "check_norm",
    "check_round",
    "check_scale",
    "check_table",
    "check_tensor",
]
