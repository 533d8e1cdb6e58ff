"""The evaluator contract: ``fn(model, inputs, **params) -> dict[str, float]``."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

import torch
from torch import nn

from fedshield.core.params import Params
from fedshield.data.bundle import DataBundle, TensorData
from fedshield.registry import Registry


@dataclass(frozen=True)
class EvalInputs:
    """What an evaluator may look at besides the model (set to eval mode by the caller)."""

    bundle: DataBundle
    clients: list[TensorData]
    train: TensorData
    device: torch.device
    batch_size: int
    seed: int
    round: int
    #: θ^0 as (params, buffers): the model before round 1, a pure function of the config
    #: (early-exit ViT paper profiles clients on it). None when the caller has no such model.
    initial: tuple[torch.Tensor, torch.Tensor] | None = None
    #: The run's last round (``rounds``), so an evaluator that runs every k rounds can keep
    #: its expensive part for the last one; None when the caller does not say.
    rounds: int | None = None

    @property
    def final(self) -> bool:
        """True at the run's last round, or when the caller gives no round budget."""
        return self.rounds is None or self.round >= self.rounds


Evaluator = Callable[..., dict[str, float]]
EVALUATORS: Registry[Evaluator] = Registry("evaluator", context=("model", "inputs"))


def check_evaluators(
    names: list[str],
    params: dict[str, dict],
    num_classes: int,
    parsed: Mapping[str, Params] | None = None,
) -> None:
    """Before training: each evaluator's ``check(parsed_params, num_classes)`` where its
    registry entry declares one (an evaluator that cannot run on this data — AutoAttack
    with fewer than 4 classes — was refused only after the whole run had trained).
    ``parsed``: ``{"eval.params.<name>": params}`` already validated (the builder's)."""
    for name in names:
        entry = EVALUATORS.entry(name, "eval.metrics")
        check = getattr(entry.obj, "check", None)
        if check is not None:
            where = f"eval.params.{name}"
            got = (parsed or {}).get(where)
            check(got if got is not None else entry.parse(params.get(name, {}), where),
                  num_classes)  # fmt: skip


def run_evaluators(
    model: nn.Module, inputs: EvalInputs, names: list[str], params: dict[str, dict]
) -> dict[str, float]:
    out: dict[str, float] = {}
    was_training = model.training
    model.eval()
    for name in names:
        out.update(EVALUATORS.get(name)(model, inputs, **params.get(name, {})))
    model.train(was_training)
    return out
