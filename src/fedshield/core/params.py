"""Component parameters as frozen pydantic models (one schema per registry entry).

Every registered component (aggregator, attack, model, dataset, client/server algorithm,
evaluator, routing policy, evaluation attack, ...) declares a :class:`Params` subclass, the
way timm's ``create_model`` kwargs and pfl's frozen hyper-parameter dataclasses give one
place per component. :func:`parse_params` validates a raw table from a config against it:
unknown keys get a "did you mean", bad values name the full key path, and the error is a
:class:`~fedshield.errors.ConfigError` (one line at the CLI, exit 2).
"""

from __future__ import annotations

import difflib
import inspect
from typing import Any, ClassVar, TypeVar

from pydantic import BaseModel, ConfigDict, ValidationError, create_model

from fedshield.errors import ConfigError


class Params(BaseModel):
    """Base for component parameters: unknown keys and bad values fail, naming the key.

    ``allow_inf_nan=False``: a float parameter of ``inf`` or ``nan`` is refused everywhere
    (``client.lr = inf`` would otherwise run and silently produce a NaN model).
    ``strict=True``: no silent coercion of ``"0.1"`` to a float or ``true`` to an int; a
    field that must accept a TOML array for a tuple opts out with ``Field(strict=False)``."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False, strict=True)

    def kwargs(self) -> dict[str, Any]:
        """The fields as keyword arguments (nested models kept as objects, not dicts), plus
        any extra keys a schema derived from a ``**kwargs`` signature let through."""
        out = {k: getattr(self, k) for k in type(self).model_fields}
        out.update(self.model_extra or {})
        return out


class NoParams(Params):
    """A component without parameters."""


#: A component's own :class:`Params` schema (``parse_params(DragParams, ...)`` is a DragParams).
P = TypeVar("P", bound=Params)


def _describe(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def format_validation_error(err: ValidationError, where: str, fields: list[str]) -> str:
    """One line naming every failing key as ``where.key`` (did-you-mean for unknown keys)."""
    parts = []
    for e in err.errors():
        loc = ".".join(str(p) for p in e["loc"])
        key = f"{where}.{loc}" if loc else where
        if e["type"] == "extra_forbidden":
            top = str(e["loc"][0]) if e["loc"] else ""
            close = difflib.get_close_matches(top, fields, n=1)
            hint = f"did you mean {close[0]!r}? " if close else ""
            parts.append(f"{key}: unknown key ({hint}allowed: {', '.join(fields) or 'none'})")
        elif e["type"] == "missing":
            parts.append(f"{key}: required")
        else:
            got = f" (got {_describe(e['input'])})" if "input" in e and e["loc"] else ""
            msg = e["msg"].removeprefix("Value error, ")  # a schema validator's own wording
            parts.append(f"{key}: {msg}{got}")
    return "; ".join(parts)


def parse_params(schema: type[P], raw: Any, where: str) -> P:
    """``raw`` (a config table) validated against ``schema``; ConfigError naming ``where``."""
    if isinstance(raw, schema):
        return raw
    if raw is None:
        raw = {}
    if not isinstance(raw, dict):
        raise ConfigError(f"{where}: expected a table of parameters, got {_describe(raw)}")
    try:
        return schema.model_validate(raw)
    except ValidationError as err:
        raise ConfigError(format_validation_error(err, where, list(schema.model_fields))) from None


def schema_from_signature(obj: Any, skip: tuple[str, ...] = ()) -> type[Params]:
    """A schema built from a factory's annotated keyword parameters (for user plugins that
    do not declare one). Parameters without a default are required; ``skip`` names the
    ones the caller supplies itself (``input_shape``, ``num_classes``, ...)."""
    try:
        sig = inspect.signature(obj, eval_str=True)
    except (NameError, TypeError):  # an annotation that cannot be resolved: accept anything
        sig = inspect.signature(obj)
    fields: dict[str, Any] = {}
    open_ended = any(p.kind is p.VAR_KEYWORD for p in sig.parameters.values())
    for p in sig.parameters.values():
        if p.name in skip or p.name == "self" or p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD):
            continue
        ann = p.annotation
        if ann is inspect.Parameter.empty or isinstance(ann, str):
            ann = Any
        default = p.default if p.default is not inspect.Parameter.empty else ...
        fields[p.name] = (ann, default)
    name = f"{getattr(obj, '__name__', 'Component')}Params"
    base: type[Params] = _OpenParams if open_ended else Params
    return create_model(name, __base__=base, **fields)


class Configured:
    """A registry component configured by its ``params_schema``: constructed directly or by
    the registry, its parameters are validated the same way (a ConfigError naming the key
    under :meth:`_where`) and each field becomes an attribute of the same name. The base
    of pre-aggregators, round defenses and fault models."""

    params_schema: ClassVar[type[Params]] = NoParams
    params: Params

    def __init__(self, **params: Any) -> None:
        self.params = parse_params(self.params_schema, params, self._where())
        for key, value in self.params.kwargs().items():
            setattr(self, key, value)

    def _where(self) -> str:
        """Where its parameters come from, for error messages (the config key or kind)."""
        return repr(self.name)

    @property
    def name(self) -> str:
        return getattr(type(self), "registry_name", type(self).__name__)

    def __repr__(self) -> str:
        args = ", ".join(f"{k}={v!r}" for k, v in self.params.kwargs().items())
        return f"{self.name}({args})"


class _OpenParams(Params):
    """A derived schema of a factory taking ``**kwargs``: unknown keys pass through to it."""

    model_config = ConfigDict(extra="allow")


__all__ = [
    "Configured",
    "NoParams",
    "Params",
    "format_validation_error",
    "parse_params",
    "schema_from_signature",
]
