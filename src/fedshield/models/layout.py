"""The memory layout a model trains and evaluates in (``run.memory_format``), by a rule.

``auto`` reads the model entry's ``channels_last=DEVICE|...`` tag: a family that declares
the device its run is on (``cnn_small`` and the seeds' CNNs; ``dual_head`` inherits its
backbone's) gets ``torch.channels_last``, every other model the contiguous
(NCHW) layout. The rule reads the model, the device type and the input's shape — never a
timing — so a run's path is reproducible and the run can say why it took it. The tag lists
``cpu`` only where it was measured faster there (``bench/bench_layout.py``,
``docs/results/bench_layout.txt``): PyTorch's CPU max-pool has no fast kernel for
contiguous NCHW tensors (``cnn_small``'s [32, 16, 28, 28] pool ≈ 5-10× slower than in
channels_last), and oneDNN's convolutions prefer channels_last too. CUDA keeps NCHW:
nothing here was measured on a GPU.

The builder converts the model's 4-D weights (:func:`apply_layout`; ``Module.to`` gives
even a one-channel first convolution's [C_out, 1, k, k] weight true channels-last
strides) and leaves the samples as loaded: each convolution writes its output in its
weights' layout, so from the first one on every batch — training, attack steps,
evaluation — runs channels_last. Storing the samples NHWC as well measured no faster
(docs/results/bench_layout.txt, column ``both``). Flat parameter vectors are unaffected:
``core.flat`` reads tensors with ``reshape(-1)`` (logical order) and writes them with
``copy_`` (which keeps the layout). The batched trainer
(:mod:`fedshield.sim.vectorized`) swaps in stacked contiguous tensors and stays NCHW:
``vmap`` cannot query or make a channels_last tensor (``NYI: querying is_contiguous
inside of vmap for memory_format other than torch.contiguous_format``).
"""

from __future__ import annotations

from collections.abc import Mapping

import torch
from torch import nn

#: the layouts a run may end up in (``auto`` resolves to one of them)
LAYOUTS: dict[str, torch.memory_format] = {
    "contiguous": torch.contiguous_format,
    "channels_last": torch.channels_last,
}


def choose_layout(
    setting: str,
    tags: Mapping[str, frozenset[str]],
    input_shape: tuple[int, ...],
    device: torch.device,
) -> tuple[str, str]:
    """The layout (a key of :data:`LAYOUTS`) that ``run.memory_format = setting`` gives a
    model with registry ``tags`` on ``input_shape`` (C, H, W) inputs on ``device``, and
    the reason, in words."""
    if setting != "auto":
        return setting, f"run.memory_format={setting!r}"
    if len(input_shape) != 3:
        return "contiguous", f"inputs of shape {tuple(input_shape)} are not images (C, H, W)"
    declared = tags.get("channels_last", frozenset())
    if device.type in declared:
        return "channels_last", f"the model declares channels_last on {device.type}"
    where = "|".join(sorted(declared)) or "no device"
    return "contiguous", f"the model declares channels_last on {where}, the run is on {device.type}"


def apply_layout(model: nn.Module, layout: str) -> nn.Module:
    """``model`` with its 4-D parameters and buffers in ``layout``, in place; the layout is
    kept on the instance (``model.memory_format``) for the run's summary."""
    if layout != "contiguous":
        model.to(memory_format=LAYOUTS[layout])
    model.memory_format = layout  # type: ignore[assignment]
    return model


def layout_of(model: nn.Module) -> str:
    """The layout :func:`apply_layout` gave ``model`` (``contiguous`` when none)."""
    return str(getattr(model, "memory_format", "contiguous"))


__all__ = ["LAYOUTS", "apply_layout", "choose_layout", "layout_of"]
