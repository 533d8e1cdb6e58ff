"""The ``backdoor`` evaluator: attack success rate (ASR) of a pixel-trigger backdoor.

ASR = the share of test inputs whose true label is not the target that the model assigns
to the target once the trigger is stamped on them (Bagdasaryan et al. 2020, "backdoor
accuracy"; Gu et al. 2017). Inputs already of the target class are left out: for them the
trigger has nothing to change. The trigger is :func:`fedshield.attacks.backdoor.stamp`'s,
so set ``eval.params.backdoor`` to the attack's ``target`` / ``size`` / ``value`` (the
defaults match). Keys: ``backdoor/asr``, ``backdoor/n`` (inputs scored).
"""

from __future__ import annotations

from typing import Any

import torch
from pydantic import Field
from torch import nn

from fedshield.attacks.backdoor import Trigger, stamp
from fedshield.core.params import parse_params
from fedshield.eval.base import EVALUATORS, EvalInputs


class BackdoorEvalParams(Trigger):
    batch_size: int = Field(1000, ge=1, description="batch size of the predictions")


@EVALUATORS.register("backdoor", schema=BackdoorEvalParams)
def backdoor(model: nn.Module, inputs: EvalInputs, **params: Any) -> dict[str, float]:
    """The backdoor evaluator reports the attack success rate of a pixel trigger on the test set.

    ``params`` are validated against :class:`BackdoorEvalParams` (the trigger of the
    ``backdoor`` / ``model_replacement`` attacks and a batch size). A task whose test set
    holds only the target class scores NaN with ``backdoor/n = 0``."""
    p = parse_params(BackdoorEvalParams, params, "eval.params.backdoor")
    assert isinstance(p, BackdoorEvalParams)
    test = inputs.bundle.test
    if p.target >= inputs.bundle.num_classes:
        raise ValueError(
            f"eval.params.backdoor.target={p.target} is not a class of this "
            f"{inputs.bundle.num_classes}-class task"
        )
    keep = (test.y != p.target).nonzero().squeeze(1)
    hits = 0
    with torch.no_grad():
        for start in range(0, keep.numel(), p.batch_size):
            x, _ = test.batch(keep[start : start + p.batch_size], inputs.device)
            pred = model(stamp(x, p.size, p.value)).argmax(1)
            hits += int((pred == p.target).sum())
    n = keep.numel()
    return {"backdoor/asr": hits / n if n else float("nan"), "backdoor/n": float(n)}


__all__ = ["BackdoorEvalParams", "backdoor"]
