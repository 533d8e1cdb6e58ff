"""The aggregator contract (DRAG paper, Sec. II-A; docs/security.md): a pure rule on a dense
``[S, d]`` matrix of updates.

``aggregate(updates, weights, reference=...) -> (update[d], diagnostics)``. Every rule

* keeps the device and dtype it is given (float32, float64, half) and never modifies its
  inputs; ``__call__`` returns only the tensor, so ``build("krum", f=2)(updates)`` reads
  naturally;
* returns a finite result for finite rows of any magnitude up to the dtype's max
  (geometry in float64, see :mod:`fedshield.aggregators._ops`);
* drops rows holding a NaN/Inf and counts them in the diagnostic ``agg/nonfinite``,
  except BR-DRAG (replaces such a row by r) and FLTrust (trust 0), which document their
  own treatment; a ``ValueError`` is raised when no finite row is left or, for rules with
  a minimum, too few are (:meth:`Aggregator.adapted` gives the rule that can run);
* declares its hyper-parameters as a :class:`~fedshield.core.params.Params` schema
  (``params_schema``): ``Krum(f=2)`` and ``AGGREGATORS.build("krum", f=2)`` both validate
  through it and raise :class:`ConfigError` naming the parameter.
"""

from __future__ import annotations

from typing import Any, ClassVar

import torch
from pydantic import Field, create_model
from torch import Tensor

from fedshield.aggregators._ops import W, all_finite
from fedshield.core.params import NoParams, Params, parse_params
from fedshield.errors import ConfigError
from fedshield.registry import Registry

Diagnostics = dict[str, float]


class Aggregator:
    """Base class. Subclasses set ``params_schema`` and implement :meth:`aggregate`."""

    #: The hyper-parameters (a frozen pydantic model); fields are also instance attributes.
    params_schema: ClassVar[type[Params]] = NoParams
    #: True when the rule needs a reference direction r (DRAG, BR-DRAG, FLTrust): the
    #: server computes one (root data or momentum). Matches the ``needs_reference`` tag.
    needs_reference: ClassVar[bool] = False
    #: True when every row is rescaled to the reference's norm ‖r‖ before it counts (BR-DRAG,
    #: FLTrust): the output is then bounded by ‖r‖ however many rows of a coverage group
    #: are bad, and the round step needs no per-block clip for it. A rule that only selects
    #: rows near r (MoNNA) is not.
    rescales_to_reference: ClassVar[bool] = False
    #: True when non-finite rows may be passed in and the rule gives them a documented
    #: meaning of its own (BR-DRAG: replaced by r, counted in 1/S; FLTrust: trust 0).
    #: Every other rule drops them (a last line of defence: the engine screens first).
    handles_nonfinite: ClassVar[bool] = False

    params: Params

    def __init__(self, **params: Any) -> None:
        self._configure(**params)

    def _configure(self, **raw: Any) -> None:
        """Validate ``raw`` against the schema (ConfigError naming the key) and set fields."""
        # the registry's wording, so that Krum(f=-1) and build("krum", f=-1) read the same
        self.params = parse_params(self.params_schema, raw, f"aggregator {self._name!r}")
        for key, value in self.params.kwargs().items():
            setattr(self, key, value)

    def _param_values(self) -> dict[str, Any]:
        """The hyper-parameters (from the schema's fields for a rule that set them itself)."""
        if hasattr(self, "params"):
            return self.params.kwargs()
        fields = self.params_schema.model_fields
        return {k: getattr(self, k) for k in fields if hasattr(self, k)}

    def __repr__(self) -> str:
        args = ", ".join(f"{k}={v!r}" for k, v in self._param_values().items())
        return f"{type(self).__name__}({args})"

    def replace(self, **changes: Any) -> Aggregator:
        """A copy of the rule with some hyper-parameters changed (validated again)."""
        return type(self)(**{**self._param_values(), **changes})

    def aggregate(
        self, updates: Tensor, weights: Tensor | None = None, *, reference: Tensor | None = None
    ) -> tuple[Tensor, Diagnostics]:
        raise NotImplementedError

    def __call__(
        self, updates: Tensor, weights: Tensor | None = None, *, reference: Tensor | None = None
    ) -> Tensor:
        return self.aggregate(updates, weights, reference=reference)[0]

    def for_round(self, rnd: int) -> Aggregator:
        """The rule for round ``rnd`` (the round step calls it): ``self``, except for a rule
        whose output depends on a random draw (Bucketing in front of it), which draws from
        (the run's seed, ``rnd``) only — never from the rows, which attackers choose."""
        return self

    def validate(self, num_rows: int) -> None:
        """Raise :class:`ConfigError` when the rule cannot work with ``num_rows`` rows (at
        build time, with the configured clients per round)."""
        if num_rows < 1:
            raise ConfigError(f"{self._name}: needs at least one row, got S={num_rows}")

    def adapted(self, num_rows: int) -> Aggregator | None:
        """The rule to run on ``num_rows`` rows: ``self`` when it can; for a rule with a
        Byzantine count f (Krum, Multi-Krum, Trimmed Mean, Bulyan) too large for that many
        rows, a copy with the largest feasible f; ``None`` when nothing can run (the engine
        then keeps θ for the round and logs why)."""
        try:
            self.validate(num_rows)
        except ConfigError:
            return self._reduced(num_rows)
        return self

    def _reduced(self, num_rows: int) -> Aggregator | None:
        """The degraded rule for :meth:`adapted` (default: none)."""
        return None

    @property
    def _name(self) -> str:
        return getattr(type(self), "registry_name", type(self).__name__)


AGGREGATORS: Registry[type[Aggregator]] = Registry("aggregator")

#: The schema text of a Byzantine count f left unset (docs/security.md: defaults are part of the
#: defense, so a rule called robust is robust when named without arguments).
F_DERIVED = (
    "unset: derived from the sampled cohort S — in a simulation with an attack, per_round "
    "floor(attack.fraction × S), fixed the attack.f_quantile quantile of the attackers per "
    "cohort, capped at the rule's breakdown on S; else that breakdown (never the rows kept)"
)


def f_field(what: str) -> Any:
    """The schema field ``f: int | None`` of a Byzantine count: ``what`` it is (and the rows
    it needs), then :data:`F_DERIVED`."""
    return Field(None, ge=0, description=f"{what}; {F_DERIVED}")


def f_params(name: str, what: str, module: str) -> type[Params]:
    """The schema of a rule whose one field is its Byzantine count f (:func:`f_field`)."""
    fields: Any = {"f": (int | None, f_field(what))}
    return create_model(name, __base__=Params, __module__=module, **fields)


class ByzantineCountRule(Aggregator):
    """A rule that tolerates ``f`` Byzantine rows (Krum, Multi-Krum, Trimmed Mean, Bulyan).

    ``f = None`` is never a silent 0: the builder sets f from ``attack.fraction`` in a
    simulation, and a rule still without f (a Flower-native strategy, library use) runs
    with the largest f the rows it is given allow (:meth:`f_for`) — the round step first
    keeps θ when those rows are too few for the sampled cohort's f
    (:mod:`fedshield.algorithms.server.cohort`)."""

    f: int | None

    def __init__(self, f: int | None = None) -> None:
        self._configure(f=f)

    @staticmethod
    def largest_f(num_rows: int) -> int | None:
        """The largest f the rule can run with on ``num_rows`` rows (None: no f can)."""
        raise NotImplementedError

    def check_f(self, f: int, num_rows: int, dropped: int = 0) -> None:
        """Raise :class:`ConfigError` when f cannot run on ``num_rows`` rows (``dropped``:
        the non-finite rows dropped before, named in the message)."""
        raise NotImplementedError

    def validate(self, num_rows: int) -> None:
        self.check_f(self.f_for(num_rows), num_rows)

    def f_for(self, num_rows: int) -> int:
        """The f used on ``num_rows`` rows: the configured one, else the largest feasible."""
        if self.f is not None:
            return self.f
        largest = self.largest_f(num_rows)
        return 0 if largest is None else largest

    def checked_f(self, num_rows: int, dropped: int) -> int:
        """The f for a round of ``num_rows`` finite rows (``dropped`` non-finite ones left
        out): refuses a round without finite rows, or an f the rows cannot carry."""
        require_finite_rows(self._name, num_rows, dropped)
        f = self.f_for(num_rows)
        self.check_f(f, num_rows, dropped)
        return f

    def _reduced(self, num_rows: int) -> Aggregator | None:
        largest = self.largest_f(num_rows)
        if largest is None:
            return None
        return self.replace(f=min(largest, self.f_for(num_rows)))


def normalised_weights(updates: Tensor, weights: Tensor | None) -> Tensor:
    """Validate shapes; return float64 weights on the updates' device summing to 1 (uniform
    when ``weights`` is None). Weights must be finite and non-negative with a positive sum."""
    if updates.dim() != 2:
        raise ValueError(f"updates must be [S, d], got shape {tuple(updates.shape)}")
    if not updates.dtype.is_floating_point:
        raise ValueError(f"updates must be a floating-point tensor, got {updates.dtype}")
    s = updates.shape[0]
    if s == 0:
        raise ValueError("no updates to aggregate")
    if weights is None:
        return torch.full((s,), 1.0 / s, dtype=W, device=updates.device)
    if weights.shape != (s,):
        raise ValueError(f"weights must be [{s}], got shape {tuple(weights.shape)}")
    w = weights.to(device=updates.device, dtype=W)
    if not bool(torch.isfinite(w).all()) or bool((w < 0).any()):
        raise ValueError("weights must be finite and non-negative")
    total = w.sum()
    if not total > 0:
        raise ValueError("weights must have a positive sum")
    return w / total


def check_updates(updates: Tensor, weights: Tensor | None) -> Tensor:
    """Validate shapes and return the weights normalised to sum 1 in the updates' dtype and
    device (uniform when None): the helper for user rules (``w @ updates``). The built-in
    rules use the float64 :func:`normalised_weights`."""
    return normalised_weights(updates, weights).to(updates.dtype)


def check_reference(owner: str, reference: Tensor | None, updates: Tensor) -> Tensor:
    """The reference (or centre): a finite ``[d]`` float tensor on the updates' device (its
    dtype is kept: the kernels promote it where they need float64)."""
    if reference is None:
        raise ValueError(f"{owner} needs a reference direction (reference=...)")
    d = updates.shape[1]
    if reference.shape != (d,):
        raise ValueError(f"{owner}: reference must be [{d}], got shape {tuple(reference.shape)}")
    r = reference.to(device=updates.device)
    if not r.dtype.is_floating_point:
        r = r.to(W)
    if not all_finite(r) and not bool(torch.isfinite(r).all()):  # the sum may overflow
        raise ValueError(f"{owner}: the reference holds NaN/Inf values")
    return r


def kept_weights(owner: str, w: Tensor, keep: Tensor) -> Tensor:
    """``w`` with the rows outside the bool mask ``keep`` set to 0, renormalised to sum 1."""
    if not bool(keep.any()):
        raise ValueError(f"{owner}: every row is non-finite (NaN/Inf); nothing to aggregate")
    wk = torch.where(keep, w, 0.0)
    total = wk.sum()
    if not total > 0:
        raise ValueError(f"{owner}: the finite rows all have weight 0")
    return wk / total


def dropped_note(dropped: int) -> str:
    """The tail of a too-few-rows error raised after non-finite rows were dropped."""
    if not dropped:
        return ""
    return f" (after dropping {dropped} non-finite rows; adapted(S) gives the rule that can run)"


def require_finite_rows(owner: str, kept: int, dropped: int) -> None:
    if kept == 0:
        raise ValueError(
            f"{owner}: every row is non-finite (NaN/Inf, {dropped} rows); nothing to aggregate"
        )


__all__ = [
    "AGGREGATORS",
    "F_DERIVED",
    "Aggregator",
    "ByzantineCountRule",
    "ConfigError",
    "Diagnostics",
    "check_reference",
    "check_updates",
    "f_field",
    "dropped_note",
    "normalised_weights",
    "kept_weights",
    "require_finite_rows",
]
