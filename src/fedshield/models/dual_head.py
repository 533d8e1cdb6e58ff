"""FedCART's dual-head model (FedCART paper, the dual classifier): a shared feature extractor r
with a main classifier h (trained by the clients) and an auxiliary classifier h' (re-trained by the
server on balanced virtual features, and the one used at inference).

``model(x)`` is always the inference model h'(r(x)), in train and eval mode alike, so
evaluation, robust evaluation and plain client rules all see r + h'; FedCART's client
reaches h explicitly through :meth:`DualHead.forward_main` / :meth:`DualHead.main_path`.

Parameter layout (relied on by the FedCART server, which only sees the flat vector):
``[r ..., h.weight, h.bias, h'.weight, h'.bias]`` — the two heads are the last four
parameter tensors, each head C·D + C entries.
"""

from __future__ import annotations

import difflib
import functools
from typing import Any, cast

from pydantic import Field, ValidationError, create_model
from pydantic_core import InitErrorDetails, PydanticCustomError
from torch import Tensor, nn

from fedshield.core.params import Params
from fedshield.errors import ConfigError
from fedshield.models.base import MODELS, Classifier


class DualHead(Classifier):
    """r → z ∈ R^D; ``main_head`` = h (training), ``head`` = h' (inference)."""

    def __init__(self, backbone: nn.Module, num_classes: int) -> None:
        super().__init__()
        head = getattr(backbone, "head", None)
        if not (hasattr(backbone, "forward_features") and isinstance(head, nn.Linear)):
            raise ConfigError(
                f"model 'dual_head' needs a backbone with forward_features and a linear head "
                f"(a fedshield Classifier), got {type(backbone).__name__}"
            )
        # The backbone's own head becomes h; an Identity takes its place so its parameters
        # are not registered twice and the trunk's come first in the flat vector.
        backbone.head = nn.Identity()
        # a Classifier by duck typing (checked above), not necessarily by inheritance
        self.backbone = cast(Classifier, backbone)
        self.num_features = int(self.backbone.num_features)
        self.main_head = head
        self.head = nn.Linear(self.num_features, num_classes)

    @property
    def aux_head(self) -> nn.Linear:
        """h' (alias of ``head``: the Classifier interface's inference head)."""
        return self.head

    def forward_features(self, x: Tensor) -> Tensor:
        return self.backbone.forward_features(x)

    def forward_main(self, x: Tensor) -> Tensor:
        """h(r(x)): the training-time model that FedCART's adversarial examples attack."""
        return self.main_head(self.forward_features(x))

    def main_path(self) -> nn.Module:
        """(r, h) as a module, for attack functions that call ``model(x)``.

        The view reports this model's train/eval mode, so code that saves and restores the
        view's mode (eval-mode attacks) restores the model's own."""
        path = _MainPath(self)
        path.training = self.training  # attribute only: nn.Module.train() would recurse
        return path


class _MainPath(nn.Module):
    def __init__(self, model: DualHead) -> None:
        super().__init__()
        self.model = model

    def forward(self, x: Tensor) -> Tensor:
        return self.model.forward_main(x)


class DualHeadParams(Params):
    """``backbone`` plus the backbone's own parameters, side by side in one table
    (``model.params = {backbone = "cnn_small", width = 8}``).

    Validation builds, once per backbone, a schema with ``backbone`` and every field of the
    backbone's schema, so an unknown key gets a did-you-mean over both and a bad value names
    its key (``model.params.hidden``)."""

    backbone: str = Field(
        "cnn_small", description="registered classifier wrapped as r + h (other keys go to it)"
    )

    @classmethod
    def model_validate(cls, obj: Any, **kwargs: Any) -> Any:
        if cls is not DualHeadParams or not isinstance(obj, dict):
            return super().model_validate(obj, **kwargs)
        backbone = obj.get("backbone", cls.model_fields["backbone"].default)
        if not isinstance(backbone, str):  # a table or list: no schema to look up by it
            raise _error("backbone", backbone, "expected the name of a registered classifier")
        try:
            schema = _with_backbone(backbone)
        except _BadBackbone as err:  # an unknown or unsuitable backbone name
            raise _error("backbone", backbone, str(err)) from None
        try:
            return schema.model_validate(obj, **kwargs)
        except ValidationError as err:  # re-phrase unknown keys against the merged fields
            raise _with_hints(err, list(schema.model_fields)) from None


class _BadBackbone(ValueError):
    """``model.params.backbone`` names no model that dual_head can wrap."""


def _error(key: str, value: Any, message: str) -> ValidationError:
    detail = InitErrorDetails(
        type=PydanticCustomError("invalid_backbone", "{m}", {"m": message}), loc=(key,), input=value
    )
    return ValidationError.from_exception_data("DualHeadParams", [detail])


def _with_hints(err: ValidationError, fields: list[str]) -> ValidationError:
    details: list[InitErrorDetails] = []
    for e in err.errors():
        if e["type"] != "extra_forbidden":
            kept = InitErrorDetails(type=e["type"], loc=e["loc"], input=e["input"])
            if "ctx" in e:
                kept["ctx"] = e["ctx"]
            details.append(kept)
            continue
        close = difflib.get_close_matches(str(e["loc"][0]), fields, n=1)
        hint = f"did you mean {close[0]!r}? " if close else ""
        msg = f"unknown key ({hint}allowed: {', '.join(fields)})"
        details.append(
            InitErrorDetails(
                type=PydanticCustomError("unknown_key", "{m}", {"m": msg}),
                loc=e["loc"],
                input=e["input"],
            )
        )
    return ValidationError.from_exception_data(err.title, details)


@functools.cache
def _with_backbone(backbone: Any) -> type[Params]:
    if not isinstance(backbone, str):
        raise _BadBackbone("must be the name of a registered model")
    if backbone not in MODELS:
        close = difflib.get_close_matches(backbone, MODELS.names(), n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        raise _BadBackbone(f"unknown model{hint}; known: {', '.join(MODELS.names())}")
    entry = MODELS.entry(backbone)
    family = entry.tag_values("family")
    if backbone == "dual_head" or (family and "classifier" not in family):
        raise _BadBackbone(
            f"must be a classifier (family=classifier), not family={'|'.join(sorted(family))}"
        )
    if "backbone" in entry.schema.model_fields:
        raise _BadBackbone(f"model {backbone!r} has its own 'backbone' parameter")
    return create_model(
        f"DualHead_{backbone}_Params", __base__=(DualHeadParams, entry.schema)
    )


def _tags_for(params: Params, tags: dict[str, frozenset[str]]) -> dict[str, frozenset[str]]:
    """dual_head's own tags plus the backbone's BatchNorm and preferred layout (its family
    stays dual_head)."""
    from fedshield.models.base import model_tags

    kw = params.kwargs()
    name = kw.pop("backbone")
    fields = MODELS.entry(name).schema.model_fields
    own = model_tags(name, {k: v for k, v in kw.items() if k in fields})
    out = dict(tags)
    for key in ("batchnorm", "channels_last"):
        if key in own:
            out[key] = own[key]
    return out


@MODELS.register("dual_head", schema=DualHeadParams, tags=["family=dual_head"])
def dual_head(
    input_shape: tuple[int, int, int],
    num_classes: int,
    *,
    backbone: str,
    **backbone_params: Any,
) -> DualHead:
    """FedCART's dual-head model: shared features r, main head h and inference head h'.

    ``backbone`` is any registered classifier (default ``cnn_small``); the other keys of
    ``model.params`` are the backbone's parameters. BatchNorm comes with the backbone
    (:func:`fedshield.models.model_tags`)."""
    net = MODELS.get(backbone)(input_shape=input_shape, num_classes=num_classes, **backbone_params)
    return DualHead(net, num_classes)


dual_head.tags_for = _tags_for  # type: ignore[attr-defined]
