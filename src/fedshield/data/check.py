"""Every dataset's inputs checked once, after its loader and transform.

A model sees ``TensorData.batch``'s output: uint8 storage read as ``x / 255`` or floats used
as they are. A loader that hands over anything else trains on the wrong scale and says
nothing (integer pixel lists of a Hugging Face dataset loaded as floats 0–255: round-1
loss 4,389, accuracy 0.10, status ok). :func:`check_inputs` is called by
:func:`fedshield.data.datasets.load_dataset` on every dataset, built-in or a plugin's, and
refuses in one line naming the dataset and split:

* a dtype other than ``uint8`` or floating point (int64 pixels, booleans);
* non-finite values;
* floats outside ``[0, 1]``, or outside the range the dataset states with the registry tag
  ``input_range=LO:HI`` (e.g. ``input_range=-1:1`` for inputs already normalised that way).
"""

from __future__ import annotations

import torch

from fedshield.data.bundle import DataBundle
from fedshield.errors import ConfigError, DataError

#: The range of float inputs when a dataset states none: images in [0, 1].
UNIT = (0.0, 1.0)


def stated_range(values: frozenset[str], name: str) -> tuple[float, float]:
    """The ``input_range=LO:HI`` tag's bounds (:data:`UNIT` without one)."""
    if not values:
        return UNIT
    text = next(iter(values))
    lo, sep, hi = text.partition(":")
    try:
        bounds = (float(lo), float(hi))
    except ValueError:
        bounds = (1.0, 0.0)
    if len(values) != 1 or not sep or not bounds[0] < bounds[1]:
        raise ConfigError(f"dataset {name!r}: tag input_range={text!r}; expected LO:HI, LO < HI")
    return bounds


def check_inputs(bundle: DataBundle, name: str, value_range: tuple[float, float] = UNIT) -> None:
    """Raise a :class:`DataError` naming ``name`` when an input tensor of ``bundle`` is not
    uint8 or finite floats within ``value_range`` (see the module doc)."""
    lo, hi = value_range
    expected = f"expected uint8 images (read as x/255) or floats in [{lo:g}, {hi:g}]"
    for split, data in (("train", bundle.train), ("test", bundle.test)):
        x = data.x
        if x.dtype == torch.uint8 or x.numel() == 0:
            continue
        where = f"dataset {name!r}: the {split} inputs are {str(x.dtype).removeprefix('torch.')}"
        if not x.is_floating_point():
            span = f"{int(x.min())}..{int(x.max())}" if x.dtype != torch.bool else "bool"
            raise DataError(f"{where} ({span}); {expected}")
        finite = torch.isfinite(x)
        if not bool(finite.all()):
            bad = int((~finite).sum())
            raise DataError(f"{where} with {bad} non-finite values; {expected}")
        x_min, x_max = float(x.min()), float(x.max())
        if x_min < lo or x_max > hi:
            raise DataError(f"{where} in [{x_min:g}, {x_max:g}]; {expected}")


__all__ = ["UNIT", "check_inputs", "stated_range"]
