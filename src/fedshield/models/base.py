"""The model interface shared by every registered network, and :func:`build_model`.

A :class:`Classifier` is ``head(forward_features(x))`` with a linear ``head`` over a
``num_features``-dim representation, as timm's ``forward_features``/``forward_head`` split.
Methods that need the feature extractor (FedCART's dual head, prototypes) rely on it.

Every model entry declares its ``model.params`` schema and tags ``family=classifier`` (or
``dual_head``, ``multi_exit``, ...) and ``batchnorm`` when it has BatchNorm statistics.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping
from typing import Any

import torch
from torch import Tensor, nn

from fedshield.core.params import Params
from fedshield.errors import ConfigError
from fedshield.registry import Entry, Registry, tags_of

ModelFactory = Callable[..., nn.Module]
MODELS: Registry[ModelFactory] = Registry("model", context=("input_shape", "num_classes"))


class Classifier(nn.Module):
    num_features: int
    head: nn.Linear

    def forward_features(self, x: Tensor) -> Tensor:
        raise NotImplementedError

    def forward_head(self, z: Tensor) -> Tensor:
        return self.head(z)

    def forward(self, x: Tensor) -> Tensor:
        return self.forward_head(self.forward_features(x))


def flat_dim(trunk: nn.Module, input_shape: tuple[int, int, int]) -> int:
    """Output size of a convolutional trunk for one input, found by a dry run; an input the
    trunk's pooling cannot afford (3 pools on 4×4) is a ConfigError naming the shape."""
    try:
        with torch.no_grad():
            return int(trunk(torch.zeros(1, *input_shape)).flatten(1).shape[1])
    except RuntimeError as err:
        if "too small" not in str(err):
            raise
        raise ConfigError(
            f"model: input shape {tuple(input_shape)} is too small for this network ({err})"
        ) from None


def forwards_kwargs(entry: Entry[ModelFactory]) -> bool:
    """An entry without a declared schema whose factory takes ``**kwargs`` (a user plugin):
    the schema derived from its signature cannot know the forwarded keys."""
    if entry.declared:
        return False
    params = inspect.signature(entry.obj).parameters.values()
    return any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params)


def parse_model_params(
    name: str, params: Mapping[str, Any] | Params | None = None, where: str = "model.params"
) -> Params:
    """The validated ``model.params`` of model ``name``, without building it: the check the
    builder runs before any data is loaded. An unknown name is a RegistryError naming
    ``model.name`` (did-you-mean); a bad key or value a ConfigError naming ``where.key``.
    ``None`` values are dropped, so unset keys take the defaults. Parameters this returned
    (a :class:`Params`) are taken as they are: a run reads its config once."""
    if isinstance(params, Params):
        return params
    entry = MODELS.entry(name, "model.name")
    given = {k: v for k, v in (params or {}).items() if v is not None}
    return entry.parse(given, where)


def model_tags(
    name: str, params: Mapping[str, Any] | Params | None = None, where: str = "model.params"
) -> dict[str, frozenset[str]]:
    """The tags of model ``name`` built with ``params``: the entry's own, refined by the
    factory's ``tags_for(params, tags)`` where the tags depend on the parameters (a wrapper
    such as ``dual_head`` has BatchNorm exactly when its backbone has)."""
    entry = MODELS.entry(name, "model.name")
    tags = dict(entry.tags)
    refine = getattr(entry.obj, "tags_for", None)
    if refine is not None:
        tags = refine(parse_model_params(name, params, where), tags)
    return tags


def check_model(
    name: str,
    input_shape: tuple[int, int, int],
    num_classes: int,
    params: Mapping[str, Any] | None = None,
) -> dict[str, frozenset[str]]:
    """Build model ``name`` on PyTorch's ``meta`` device (no memory, no initialisation cost:
    ViT-S in 0.2 s) to check the whole ``model`` section against the input shape and class
    count before any data is loaded (e.g. from :func:`fedshield.data.dataset_info`); returns
    the model's tags. Also consumes no random numbers of the CPU generator."""
    return tags_of(meta_model(name, input_shape, num_classes, params))


def meta_model(
    name: str,
    input_shape: tuple[int, int, int],
    num_classes: int,
    params: Mapping[str, Any] | Params | None = None,
) -> nn.Module:
    """Model ``name`` built on the meta device (see :func:`check_model`): its structure,
    for checks before data, without memory or random numbers. Pretrained weights are files,
    read when the model is really built: the ``pretrained*`` parameters are left out."""
    with torch.device("meta"):
        if isinstance(params, Params):
            return build_parsed(name, input_shape, num_classes, params, arch_only=True)
        arch = {k: v for k, v in (params or {}).items() if not k.startswith("pretrained")}
        return build_model(name, input_shape, num_classes, **arch)


def build_model(
    name: str, input_shape: tuple[int, int, int], num_classes: int, **params: Any
) -> nn.Module:
    """Model ``name`` for inputs ``input_shape`` (C, H, W) and ``num_classes`` classes, its
    ``params`` validated by the entry's schema first (see :func:`parse_model_params`).

    The instance carries ``registry_name`` and ``registry_tags`` (:func:`model_tags`), so
    ``fedshield.registry.tags_of(model)`` answers "has it BatchNorm?", "which family?"."""
    entry = MODELS.entry(name, "model.name")
    if forwards_kwargs(entry):
        kwargs: dict[str, Any] = {k: v for k, v in params.items() if v is not None}
        return _built(entry, input_shape, num_classes, kwargs, dict(entry.tags))
    return build_parsed(name, input_shape, num_classes, parse_model_params(name, params))


def build_parsed(
    name: str,
    input_shape: tuple[int, int, int],
    num_classes: int,
    params: Params,
    *,
    arch_only: bool = False,
) -> nn.Module:
    """:func:`build_model` from parameters :func:`parse_model_params` returned (the builder
    reads a run's ``model.params`` once); ``arch_only``: the ``pretrained*`` parameters at
    their defaults (no weights file is read)."""
    entry = MODELS.entry(name, "model.name")
    kwargs = params.kwargs()
    if arch_only:
        fields = type(params).model_fields
        kwargs |= {k: fields[k].default for k in kwargs if k.startswith("pretrained")}
    return _built(entry, input_shape, num_classes, kwargs, model_tags(name, params))


def _built(
    entry: Entry[ModelFactory],
    input_shape: tuple[int, int, int],
    num_classes: int,
    kwargs: dict[str, Any],
    tags: dict[str, frozenset[str]],
) -> nn.Module:
    model = entry.obj(input_shape=tuple(input_shape), num_classes=num_classes, **kwargs)
    # plain attributes: nn.Module's __setattr__ is typed for tensors and modules only
    model.registry_name = entry.name  # type: ignore[assignment]
    model.registry_tags = tags  # type: ignore[assignment]
    return model
