"""The bench grid file (TOML) of ``fedshield bench``, validated like a config.

A bench is defenses × attacks × Byzantine shares × heterogeneity × faults × attack modes ×
seeds on one base config, with hyper-parameter candidates chosen per defense on a
validation split (ByzFL's protocol, Allouah et al. 2023 / González et al. 2024: "the
worst case over the attack set" on held-out data, then test accuracy reported for that
choice) and each attack's placement ``search`` run in full, a cell reporting the
attacker's best placement against that defense (docs/security.md §6b)::

    name = "my-bench"
    base = "brdrag-digits-cpu"          # a preset, or  file = "my.toml"
    set = ["rounds=20"]                 # every run
    plugins = ["my_rules.py"]           # your defense / attack modules, by name below
    seeds = [0, 1, 2]
    shares = [0.2, 0.4]                 # Byzantine share w of each cohort
    attack_modes = ["per_round"]        # and/or "fixed"
    val_size = 200                      # validation split carved from the train split
    eval_every = 1                      # curves: test accuracy / loss / ASR every k rounds
    defenses = ["fedavg", "median", "nnm+krum",
                {name = "norm_clip", set = ["server.aggregator_args.tau=1.0"]}]
    attacks = ["ipm", "alie", {name = "backdoor", params = {target = 0}},
               {name = "stealth", search = {h = [0.25, 0.5, 0.9, 0.99]}}]
    [heterogeneity]                     # label → overrides (default: the base config)
    "dir0.5" = ["data.beta=0.5"]
    "dir0.1" = ["data.beta=0.1"]
    [faults]                            # label → overrides (e.g. the [faults] section)
    none = []
    [tune]                              # candidates, chosen per defense on validation
    "server.lr" = [1.0, 0.5]
    "client.momentum" = [0.0, 0.9]
    declared_f = [0, 1]                 # the rules' f = ⌊wS⌋ + this

Every problem is one :class:`~fedshield.errors.ConfigError` naming the key
(``bench.shares[1]: ...``), raised before any data is loaded.
"""

from __future__ import annotations

import difflib
import itertools
import re
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from fedshield.config import _format_validation_error
from fedshield.errors import ConfigError

#: A label that is also a file name part and a Markdown cell (no path separators).
_LABEL = re.compile(r"^[A-Za-z0-9_.+=\-]+$")
#: The tune key that is not a config key: the rules' declared f relative to ⌊wS⌋.
DECLARED_F = "declared_f"


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


def _label(value: str, what: str) -> str:
    if not _LABEL.match(value):
        raise ValueError(f"{what} {value!r}: use letters, digits and _ . + = - only")
    return value


class DefenseSpec(_Strict):
    """A defense: ``[pre+...+]rule`` — a server algorithm (``fedavg``, ``fltrust``,
    ``brdrag``) or an aggregator run by FedAvg, behind optional pre-aggregators."""

    name: str
    label: str | None = None
    set: list[str] = []

    @property
    def key(self) -> str:
        return self.label or self.name

    @property
    def parts(self) -> tuple[list[str], str]:
        *pre, rule = self.name.split("+")
        return pre, rule


class AttackSpec(_Strict):
    """An attack with its parameters; ``search`` (attack parameter → candidates) is its
    placement grid: every combination runs, and a cell reports the attacker's best — the
    lowest test accuracy — naming the placement that won (docs/security.md §6b)."""

    name: str
    label: str | None = None
    params: dict[str, Any] = {}
    set: list[str] = []
    search: dict[str, list[Any]] = {}

    @property
    def key(self) -> str:
        return self.label or self.name

    @field_validator("search")
    @classmethod
    def _search(cls, v: dict[str, list[Any]]) -> dict[str, list[Any]]:
        return _with_candidates(v, "search.")

    def placements(self) -> list[dict[str, Any]]:
        """Every combination of the ``search`` grid ([{}] without one)."""
        keys, grid = list(self.search), itertools.product(*self.search.values())
        return [dict(zip(keys, vals, strict=True)) for vals in grid]

    def placement_label(self, i: int | None) -> str:
        """``h=0.9`` for placement ``i`` ("" for an attack without a search)."""
        if i is None or not self.search:
            return ""
        return ",".join(f"{k}={v}" for k, v in self.placements()[i].items())


class BenchSpec(_Strict):
    name: str = Field(min_length=1)
    description: str = ""
    base: str | None = None
    file: str | None = None
    set: list[str] = []
    plugins: list[str] = []
    rounds: int | None = Field(None, ge=1)
    seeds: list[int] = Field([0], min_length=1)
    shares: list[float] = Field(min_length=1)
    attack_modes: list[Literal["fixed", "per_round"]] = Field(["per_round"], min_length=1)
    val_size: int = Field(200, ge=1, description="validation split carved from the train split")
    eval_every: int = Field(
        1,
        ge=1,
        description="test accuracy and loss (and a backdoor's ASR) every k rounds, for each "
        "run's curves (runs/<run>/metrics.csv); the last round always",
    )
    heterogeneity: dict[str, list[str]] = {"base": []}
    faults: dict[str, list[str]] = {"none": []}
    defenses: list[DefenseSpec] = Field(min_length=1)
    attacks: list[AttackSpec] = Field(min_length=1)
    tune: dict[str, list[Any]] = {}
    clean: str | None = Field(
        None,
        description="the attack key (e.g. scaling with k = 1, labelled clean) whose runs "
        "are each setting's clean twin: the steps table divides by their median step",
    )

    @field_validator("defenses", "attacks", mode="before")
    @classmethod
    def _names(cls, v: Any) -> Any:
        if isinstance(v, list):
            return [{"name": x} if isinstance(x, str) else x for x in v]
        return v

    @field_validator("seeds")
    @classmethod
    def _seeds(cls, v: list[int]) -> list[int]:
        if any(s < 0 for s in v) or len(set(v)) != len(v):
            raise ValueError(f"expected distinct seeds >= 0, got {v}")
        return v

    @field_validator("shares")
    @classmethod
    def _shares(cls, v: list[float]) -> list[float]:
        for w in v:
            if not 0.0 < w < 1.0:
                raise ValueError(f"a Byzantine share is in (0, 1), got {w}")
        if len(set(v)) != len(v):
            raise ValueError(f"shares repeat: {v}")
        return v

    @field_validator("heterogeneity", "faults")
    @classmethod
    def _axis(cls, v: dict[str, list[str]]) -> dict[str, list[str]]:
        if not v:
            raise ValueError("needs at least one entry (label = [overrides])")
        for label, sets in v.items():
            _label(label, "label")
            for item in sets:
                if "=" not in item:
                    raise ValueError(f"{label}: {item!r} is not KEY=VALUE")
        return v

    @field_validator("tune")
    @classmethod
    def _tune(cls, v: dict[str, list[Any]]) -> dict[str, list[Any]]:
        for key, values in _with_candidates(v).items():
            if key == DECLARED_F and not all(
                isinstance(x, int) and not isinstance(x, bool) for x in values
            ):
                raise ValueError(f"{DECLARED_F}: offsets to ⌊wS⌋ are integers, got {values}")
        return v


def _with_candidates(v: dict[str, list[Any]], where: str = "") -> dict[str, list[Any]]:
    """``v`` when every key has at least one candidate value (errors name ``where`` + key)."""
    for key, values in v.items():
        if not values:
            raise ValueError(f"{where}{key}: needs at least one candidate")
    return v


def parse_spec(raw: dict[str, Any], source: str = "bench") -> BenchSpec:
    """``raw`` (a bench TOML's table) as a :class:`BenchSpec`; one ConfigError naming the
    key otherwise, with did-you-mean for an unknown top-level key."""
    allowed = sorted(BenchSpec.model_fields)
    for key in raw:
        if key not in BenchSpec.model_fields:
            close = difflib.get_close_matches(key, allowed, n=1)
            hint = f"did you mean {close[0]!r}? " if close else ""
            raise ConfigError(f"{source}.{key}: unknown key ({hint}allowed: {', '.join(allowed)})")
    try:
        spec = BenchSpec.model_validate(raw)
    except ValidationError as err:
        raise ConfigError(
            _format_validation_error(err, source).replace(": invalid config", "")
        ) from None
    if (spec.base is None) == (spec.file is None):
        raise ConfigError(f"{source}: set exactly one of base (a preset) and file (a config file)")
    for axis, items in (("defenses", spec.defenses), ("attacks", spec.attacks)):
        keys = [x.key for x in items]
        for i, k in enumerate(keys):
            try:
                _label(k, "name")
            except ValueError as err:
                raise ConfigError(f"{source}.{axis}[{i}]: {err}") from None
        dup = sorted({k for k in keys if keys.count(k) > 1})
        if dup:
            raise ConfigError(f"{source}.{axis}: {dup[0]!r} appears twice; give one a label")
    if spec.clean is not None and spec.clean not in [a.key for a in spec.attacks]:
        known = ", ".join(a.key for a in spec.attacks)
        raise ConfigError(f"{source}.clean: {spec.clean!r} is not an attack key ({known})")
    return spec


__all__ = ["DECLARED_F", "AttackSpec", "BenchSpec", "DefenseSpec", "parse_spec"]
