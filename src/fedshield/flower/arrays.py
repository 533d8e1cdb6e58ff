"""A model's ``ArrayRecord`` ↔ fedshield's flat vectors, with every array checked.

Flower's convention is that a ClientApp returns its model's ``state_dict`` as an
:class:`~flwr.app.ArrayRecord`. fedshield's server algorithms work on one flat parameter
vector θ ∈ R^d and one flat vector of floating buffers (DRAG paper, Sec. II-A). A
:class:`ModelLayout`, read from the global model the strategy sends, says which array is what:

* **parameters** — every floating array that is not a buffer, in record order (the order
  of ``model.parameters()`` for a record made from ``model.state_dict()``);
* **buffers** — floating running statistics (by default the arrays whose name ends in
  ``running_mean`` / ``running_var``, BatchNorm's; or the names the caller gives), aggregated
  as values, not deltas, like fedshield's ``ClientUpdate.buffers``;
* **pass-through** — every non-floating array (BatchNorm's ``num_batches_tracked``): its
  shape and dtype are checked, its value is never read; the server keeps its own.

Decoding an untrusted record checks each array's declared shape and dtype *before*
deserialising it (an oversized array is refused without being read), then the shape and
dtype of what was actually deserialised; a failure gives one reason in the vocabulary of
:mod:`fedshield.core.integrity` (``delta_shape``, ``delta_dtype``, ``buffers_shape``,
``buffers_dtype``, ``keys``, ``malformed``). Finiteness and ranges are left to
:func:`fedshield.core.integrity.screen`, which runs next.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass

import numpy as np
import torch
from flwr.app import Array, ArrayRecord
from torch import Tensor

from fedshield.errors import ConfigError

#: name suffixes of floating buffers when the caller names none (torch's *Norm layers)
BUFFER_SUFFIXES = ("running_mean", "running_var")

PARAM, BUFFER, PASS = "param", "buffer", "pass"


class RecordError(ValueError):
    """An array record does not fit the layout; ``reason`` is the rejection reason."""

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(f"{reason}: {detail}")
        self.reason = reason


@dataclass(frozen=True)
class Slot:
    """One array of the model: name, shape, numpy dtype and its role."""

    key: str
    shape: tuple[int, ...]
    dtype: np.dtype
    kind: str

    @property
    def numel(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64))


def _deserialise(key: str, arr: object) -> np.ndarray:
    if not isinstance(arr, Array):
        raise RecordError("malformed", f"{key!r} is not a flwr Array")
    try:
        out = arr.numpy()
    except Exception as err:  # any decoding failure of untrusted bytes is a rejection
        reason = f"{key!r} could not be decoded ({type(err).__name__})"
        raise RecordError("malformed", reason) from None
    return out


class ModelLayout:
    """Which arrays of a model record are parameters, buffers and pass-through arrays."""

    def __init__(self, slots: Iterable[Slot]) -> None:
        self.slots = tuple(slots)
        floats = {s.dtype for s in self.slots if s.kind != PASS}
        if len(floats) != 1:
            raise ConfigError(
                f"the model record needs its floating arrays in one dtype, got "
                f"{sorted(str(d) for d in floats) or 'none'}"
            )
        self.np_dtype: np.dtype = floats.pop()
        self.dtype: torch.dtype = torch.from_numpy(np.zeros(0, self.np_dtype)).dtype
        self.params = tuple(s for s in self.slots if s.kind == PARAM)
        self.buffers = tuple(s for s in self.slots if s.kind == BUFFER)
        if not self.params:
            raise ConfigError("the model record has no floating parameter array")
        self.num_params = sum(s.numel for s in self.params)
        self.num_buffers = sum(s.numel for s in self.buffers)
        self._by_key = {s.key: s for s in self.slots}

    @classmethod
    def of(cls, record: ArrayRecord, buffer_keys: Collection[str] | None = None) -> ModelLayout:
        """The layout of the (trusted) global model ``record``. ``buffer_keys``: the floating
        arrays that are buffers; None: those named ``*running_mean`` / ``*running_var``."""
        slots = []
        for key, arr in record.items():
            a = _deserialise(key, arr)
            if not np.issubdtype(a.dtype, np.number) and a.dtype != np.bool_:
                raise ConfigError(f"model array {key!r} has the non-numeric dtype {a.dtype}")
            if not np.issubdtype(a.dtype, np.floating):
                kind = PASS
            elif buffer_keys is not None:
                kind = BUFFER if key in buffer_keys else PARAM
            else:
                kind = BUFFER if key.endswith(BUFFER_SUFFIXES) else PARAM
            slots.append(Slot(key, tuple(int(n) for n in a.shape), a.dtype, kind))
        if buffer_keys is not None:
            unknown = sorted(set(buffer_keys) - {s.key for s in slots})
            if unknown:
                raise ConfigError(f"buffer_keys: {unknown[:3]} are not arrays of the model")
        return cls(slots)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, ModelLayout) and self.slots == other.slots

    def __hash__(self) -> int:
        return hash(self.slots)

    @property
    def param_keys(self) -> list[str]:
        return [s.key for s in self.params]

    @property
    def buffer_keys(self) -> list[str]:
        return [s.key for s in self.buffers]

    # -- decoding ---------------------------------------------------------------------
    def _read(self, record: Mapping[str, object], slot: Slot, label: str) -> np.ndarray:
        arr = record[slot.key]
        declared = getattr(arr, "shape", None), getattr(arr, "dtype", None)
        # Declared metadata first: a wrong or oversized array is refused unread.
        if declared[0] is None or tuple(declared[0]) != slot.shape:
            raise RecordError(f"{label}_shape", f"{slot.key!r}: shape {declared[0]}")
        if str(declared[1]) != str(slot.dtype):
            raise RecordError(f"{label}_dtype", f"{slot.key!r}: dtype {declared[1]}")
        a = _deserialise(slot.key, arr)
        if tuple(a.shape) != slot.shape:
            raise RecordError(f"{label}_shape", f"{slot.key!r}: decoded shape {a.shape}")
        if a.dtype != slot.dtype:
            raise RecordError(f"{label}_dtype", f"{slot.key!r}: decoded dtype {a.dtype}")
        return a

    def _check_keys(self, record: Mapping[str, object], keys: Iterable[str]) -> None:
        want = list(keys)
        got = set(record.keys())
        if got != set(want):
            missing, extra = sorted(set(want) - got), sorted(got - set(want))
            raise RecordError("keys", f"missing {missing[:3]}, unexpected {extra[:3]}")

    def _flat(self, parts: list[np.ndarray]) -> Tensor:
        if not parts:
            return torch.zeros(0, dtype=self.dtype)
        return torch.from_numpy(np.concatenate([p.reshape(-1) for p in parts]))

    def decode(self, record: Mapping[str, object]) -> tuple[Tensor, Tensor]:
        """``(θ [d], buffers [b])`` of a full model record (every array of the layout, no
        other key). Raises :class:`RecordError` with the rejection reason."""
        self._check_keys(record, (s.key for s in self.slots))
        params = [self._read(record, s, "delta") for s in self.params]
        buffers = [self._read(record, s, "buffers") for s in self.buffers]
        for s in self.slots:
            if s.kind == PASS:
                self._read(record, s, "buffers")
        return self._flat(params), self._flat(buffers)

    def decode_params(self, record: Mapping[str, object], label: str = "delta") -> Tensor:
        """A parameter-shaped vector (control variates, references): exactly the
        parameter keys, each with its parameter's shape and dtype."""
        self._check_keys(record, self.param_keys)
        return self._flat([self._read(record, s, label) for s in self.params])

    def pass_through(self, record: Mapping[str, object]) -> dict[str, np.ndarray]:
        """The non-floating arrays of a (trusted) record, by key."""
        return {s.key: _deserialise(s.key, record[s.key]) for s in self.slots if s.kind == PASS}

    # -- encoding ---------------------------------------------------------------------
    def _split(self, vec: Tensor, slots: tuple[Slot, ...]) -> dict[str, np.ndarray]:
        flat = vec.detach().to("cpu", self.dtype).numpy()
        out, offset = {}, 0
        for s in slots:
            out[s.key] = flat[offset : offset + s.numel].reshape(s.shape).copy()
            offset += s.numel
        return out

    def encode(
        self, params: Tensor, buffers: Tensor, passed: Mapping[str, np.ndarray]
    ) -> ArrayRecord:
        """The model record of ``(θ, buffers)`` with the pass-through arrays ``passed``, in
        the layout's key order."""
        values = self._split(params, self.params) | self._split(buffers, self.buffers)
        values |= dict(passed)
        return ArrayRecord({s.key: Array(np.array(values[s.key], order="C")) for s in self.slots})

    def encode_params(self, vec: Tensor) -> ArrayRecord:
        """A parameter-shaped vector as a record keyed like the model's parameters."""
        return ArrayRecord(
            {k: Array(np.array(v, order="C")) for k, v in self._split(vec, self.params).items()}
        )

    def buffer_lower_bounds(self) -> Tensor | None:
        """0 for running variances, -inf elsewhere (None without such a buffer), as
        :func:`fedshield.core.flat.buffer_lower_bounds` says for a torch model."""
        if not any(s.key.endswith("running_var") for s in self.buffers):
            return None
        parts = [
            torch.full((s.numel,), 0.0 if s.key.endswith("running_var") else -torch.inf)
            for s in self.buffers
        ]
        return torch.cat(parts).to(self.dtype)


TENSOR_KEY = "value"  #: the one array of a tensor record (an extra that is not model-shaped)


def encode_tensor(t: Tensor) -> ArrayRecord:
    """A tensor (e.g. FedCART's prototypes) as a record of one array, ``"value"``."""
    return ArrayRecord({TENSOR_KEY: Array(np.array(t.detach().cpu().numpy(), order="C"))})


def decode_tensor(record: Mapping[str, object], shape: tuple[int, ...], label: str) -> Tensor:
    """The float32 tensor of a record made by :func:`encode_tensor`, checked against the
    expected ``shape`` before anything reads it; raises :class:`RecordError` (``label``)."""
    if set(record) != {TENSOR_KEY}:
        raise RecordError(label, f"expected the one key {TENSOR_KEY!r}, got {sorted(record)[:4]}")
    arr = _deserialise(TENSOR_KEY, record[TENSOR_KEY])
    if arr.dtype != np.float32:
        raise RecordError(label, f"dtype {arr.dtype}, expected float32")
    if tuple(arr.shape) != tuple(shape):
        raise RecordError(label, f"shape {tuple(arr.shape)}, expected {tuple(shape)}")
    return torch.from_numpy(np.array(arr))


__all__ = [
    "BUFFER_SUFFIXES",
    "ModelLayout",
    "RecordError",
    "Slot",
    "TENSOR_KEY",
    "decode_tensor",
    "encode_tensor",
]
