"""Method hyper-parameters as frozen pydantic models, validated from ``*.params`` tables."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, ValidationError

from fedshield.errors import ConfigError


class Params(BaseModel):
    """Base for method parameters: unknown keys and bad values fail, naming the key."""

    model_config = ConfigDict(extra="forbid", frozen=True)


class NoParams(Params):
    pass


def parse_params(schema: type[Params], raw: dict[str, Any], where: str) -> Params:
    try:
        return schema.model_validate(raw)
    except ValidationError as err:
        parts = []
        for e in err.errors():
            loc = ".".join(str(p) for p in e["loc"])
            msg = "unknown key" if e["type"] == "extra_forbidden" else e["msg"]
            allowed = ", ".join(schema.model_fields) or "none"
            parts.append(f"{where}.{loc}: {msg} (allowed keys: {allowed})")
        raise ConfigError("; ".join(parts)) from None
