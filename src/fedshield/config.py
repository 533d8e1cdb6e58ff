"""Experiment configuration: TOML → validated pydantic models (config reference: docs/usage.md).

Unknown keys, wrong types and out-of-range values fail before any work starts, with a
message naming the key path. Method-specific parameters (``client.params``,
``server.params``, ``attack.params``, ``server.aggregator_args``) are checked against the
registered component when the experiment is built (:func:`fedshield.sim.builder.build`).
"""

from __future__ import annotations

import math
import tomllib
from collections.abc import Sequence
from importlib import resources
from pathlib import Path
from typing import Any, Literal

import tomli_w
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    StrictBool,
    ValidationError,
    field_validator,
    model_validator,
)

from fedshield.errors import ConfigError

PRESET_PACKAGE = "fedshield.presets"


#: Sanity bound on step sizes and weight decay: larger values overflow float32 models in
#: one step (``client.lr = 1e308`` used to crash inside torch's SGD, ``inf`` to run on NaN).
MAX_RATE = 1e4
#: Ceilings of counts (a config must be able to finish a round, docs/security.md §4): more clients,
#: local steps or epochs than this are a typo, not an experiment, on any machine.
MAX_CLIENTS = 1_000_000
MAX_STEPS = 1_000_000
MAX_EPOCHS = 10_000
MAX_ROUNDS = 1_000_000


class Section(BaseModel):
    """A config table: unknown keys, silent coercions ("0.1" → 0.1, true → 1) and non-finite
    numbers are refused, naming the key path."""

    model_config = ConfigDict(
        extra="forbid", validate_assignment=True, strict=True, allow_inf_nan=False
    )


class LongTailConfig(Section):
    rho: float = Field(1.0, ge=1.0, description="imbalance ratio n_max/n_min; 1 = balanced")


class DataConfig(Section):
    dataset: str = "mnist5k"
    root: str = "~/.fedshield/data"
    download: StrictBool | Literal["auto"] = Field(
        "auto",
        description="auto: download a file-backed dataset when it is missing and its host "
        "answers (a clear error when there is no network); true: always let the loader "
        "download; false: never",
    )
    num_clients: int = Field(20, ge=1, le=MAX_CLIENTS)
    partition: str = "iid"
    beta: float = Field(0.5, gt=0.0, description="Dirichlet concentration")
    shards_per_client: int = Field(2, ge=1)
    min_size: int = Field(1, ge=0, description="Dirichlet re-draw until each client has this many")
    long_tail: LongTailConfig = LongTailConfig()
    root_size: int = Field(0, ge=0, description="server root set (BR-DRAG, FLTrust)")
    val_size: int = Field(0, ge=0)
    # Dataset-specific knobs (synthetic generator size, image size for ImageFolder, ...).
    params: dict[str, Any] = {}


class ModelConfig(Section):
    name: str = "cnn_small"
    params: dict[str, Any] = {}


class ClientConfig(Section):
    algorithm: str = "sgd"
    lr: float = Field(0.05, gt=0.0, le=MAX_RATE)
    momentum: float = Field(0.0, ge=0.0, lt=1.0)
    weight_decay: float = Field(0.0, ge=0.0, le=MAX_RATE)
    batch_size: int = Field(32, ge=1)
    local_steps: int | None = Field(10, ge=1, le=MAX_STEPS, description="U local SGD steps")
    local_epochs: int | None = Field(
        None, ge=1, le=MAX_EPOCHS, description="E local epochs (overrides U)"
    )
    params: dict[str, Any] = {}


class ServerConfig(Section):
    algorithm: str = "fedavg"
    aggregator: str = "mean"
    aggregator_args: dict[str, Any] = {}
    pre_aggregators: list[str] = Field(
        [],
        description="pre-aggregators run on the updates before the rule, in order "
        "(arc, bucketing, clip, nnm; `fedshield list pre-aggregators`)",
    )
    pre_aggregator_args: dict[str, dict[str, Any]] = Field(
        {}, description="parameters per pre-aggregator, e.g. {nnm = {f = 2}}"
    )
    # None when unset: a resolved config without them dumps (and hashes) as before; the
    # builder resolves the default (sim/builder.py, default_round_defenses).
    round_defenses: list[str] | None = Field(
        None,
        description="defenses across rounds, in order (cache, collusion, consistency, fill, "
        "momentum, reputation, step_bound; `fedshield list round-defenses`); unset: the "
        "recommended ones for a robust rule (docs/cross-round.md, Default), else none; [] none",
    )
    round_defense_args: dict[str, dict[str, Any]] | None = Field(
        None, description="parameters per round defense, e.g. {step_bound = {kappa = 3.0}}"
    )
    weighting: Literal["samples", "uniform"] = "samples"
    clients_per_round: int = Field(
        10, ge=1, description="S; equal to num_clients = full participation"
    )
    lr: float = Field(1.0, gt=0.0, le=MAX_RATE, description="server step size eta_g")
    params: dict[str, Any] = {}
    trust_counts: bool | None = Field(
        None,
        description="believe self-reported sample counts; unset: only without an attack and "
        "without a robust rule (the simulator then uses the partition sizes it knows)",
    )
    max_num_examples: int | None = Field(
        None, ge=0, description="reject uploads reporting more samples than this"
    )
    count_cap: float = Field(
        2.0,
        ge=1.0,
        le=1e6,
        description="under a robust rule, a client's sample count (its weight) is capped at "
        "count_cap x the cohort's median count, whatever trust_counts says",
    )
    # None when unset: a resolved config without it dumps (and hashes) as before.
    over_select: float | Literal["auto"] | None = Field(
        None,
        description="invite ceil(over_select x S) clients a round so that enough rows arrive "
        "under [faults]; auto: the least S' whose P(round skipped or outvoted) is within 0.01 "
        "of the best (docs/faults.md, liveness); unset: auto under [faults], else S",
    )

    # None when unset: a resolved config without it dumps (and hashes) as before.
    short_rounds: Literal["pad", "skip"] | None = Field(
        None,
        description="a round that keeps fewer rows than the robust rule needs for the cohort's "
        "f: pad = complete it with zero rows, votes to keep theta (docs/faults.md, liveness); "
        "skip = keep theta; unset: pad",
    )

    @field_validator("over_select")
    @classmethod
    def _over_select(cls, v: float | str | None) -> float | str | None:
        if isinstance(v, float | int) and not 1.0 <= float(v) <= 100.0:
            raise ValueError(f"over_select={v}: a factor in [1, 100], or \"auto\"")
        return v


class AttackConfig(Section):
    name: str = "none"
    params: dict[str, Any] = {}
    fraction: float = Field(0.0, ge=0.0, le=1.0, description="Byzantine share")
    mode: Literal["fixed", "per_round"] = Field(
        "fixed",
        description="fixed: round(fraction*M) Byzantine workers chosen once by seed; "
        "per_round: exactly floor(fraction*S) of each cohort",
    )
    f_quantile: float = Field(
        0.99,
        gt=0.0,
        le=1.0,
        description="fixed mode: the rule's f is this quantile of the hypergeometric count "
        "of attackers per cohort (capped by the rule's breakdown); stated at start",
    )

    @model_validator(mode="after")
    def _params_need_an_attack(self) -> AttackConfig:
        # Parameters of no attack were accepted and the run trained unattacked.
        if self.name == "none" and self.params:
            raise ValueError(
                f"attack.params = {self.params} but attack.name = 'none': name the attack "
                f"they belong to (`fedshield list attacks`) or remove attack.params"
            )
        return self


class EvalConfig(Section):
    every: int = Field(1, ge=1)
    batch_size: int = Field(1000, ge=1)
    per_client: bool = False
    target_acc: float | None = Field(None, gt=0.0, le=1.0, description="report rounds to reach it")
    metrics: list[str] = Field([], description="registered evaluators run at the final round")
    metrics_every: int | None = Field(None, ge=1, description="also run them every k rounds")
    params: dict[str, dict[str, Any]] = Field({}, description="per-evaluator keyword arguments")


class CheckpointConfig(Section):
    every: int = Field(5, ge=1)


class RunConfig(Section):
    device: str = Field(
        "auto", pattern=r"^(auto|cpu|cuda(:\d+)?|mps)$", description="auto, cpu, cuda[:N], mps"
    )
    threads: int | None = Field(
        None,
        ge=1,
        description="torch threads on CPU; unset: 1 (deterministic, and on a busy machine "
        "2 threads measured 6-17x slower per round than 1)",
    )
    amp: bool = False
    progress: bool = True
    on_nonfinite: Literal["stop", "continue"] = Field(
        "stop",
        description="when a round's training loss, test loss or accuracy is NaN/inf: stop "
        "after that round (summary.json status = 'diverged'; `fedshield run` exits with "
        "status 3) or continue to the last round (still marked diverged)",
    )
    vectorize: StrictBool | Literal["auto"] = Field(
        "auto",
        description="train a round's clients as one batched computation (torch.func.vmap): "
        "auto = when the client algorithm and model allow it, else one by one; "
        "true = required (ConfigError otherwise); false = one by one",
    )
    vectorize_chunk: int | None = Field(
        None,
        ge=1,
        description="clients per batched call, bounding memory (a few copies of θ and one "
        "batch of activations per client); unset: from the sizes of θ and of one step's "
        "activations, 16..256 on CPU, up to 1024 on CUDA as memory allows",
    )
    # None when unset (= auto): a resolved config without it dumps (and hashes) as before.
    memory_format: Literal["auto", "channels_last", "contiguous"] | None = Field(
        None,
        description="the model's memory layout: auto (unset) = torch.channels_last where the model "
        "declares it faster on the run's device (tag channels_last=cpu: the CNNs, "
        "dual_head over one), else contiguous (NCHW); the choice is logged and recorded in "
        "summary.json's provenance (fedshield.models.layout)",
    )
    loggers: list[Literal["tensorboard", "mlflow"]] = Field(
        [],
        description="experiment trackers fed the metrics.jsonl records, the resolved config "
        "and the plots (fedshield.sim.tracking; extra 'track'); W&B is not supported",
    )
    mlflow_uri: str | None = Field(
        None,
        min_length=1,
        description="MLflow tracking URI; unset: a SQLite store <run dir>/mlflow.db (no server)",
    )


class DPConfig(Section):
    """A differential-privacy mechanism: clipping norm, and either the noise multiplier z or
    a target ε (with δ) from which z is found for the configured number of rounds."""

    clip: float = Field(1.0, gt=0.0, le=1e30, description="L2 clipping norm C")
    noise_multiplier: float | None = Field(
        None, ge=0.0, le=1e6, description="z: noise std = z · sensitivity (0: clipping only)"
    )
    target_epsilon: float | None = Field(
        None, gt=0.0, le=1e6, description="find z so that ε(δ) after all rounds ≤ this"
    )
    delta: float = Field(1e-5, gt=0.0, lt=1.0, description="δ of the (ε, δ) guarantee")

    @model_validator(mode="after")
    def _one_noise_source(self) -> DPConfig:
        if (self.noise_multiplier is None) == (self.target_epsilon is None):
            raise ValueError(
                "set exactly one of noise_multiplier and target_epsilon "
                f"(got noise_multiplier={self.noise_multiplier}, "
                f"target_epsilon={self.target_epsilon})"
            )
        return self


class CentralDPConfig(DPConfig):
    """Client-level DP-FedAvg (docs/privacy.md): every update clipped to C, Gaussian noise on the
    aggregate, accounted for the subsampled Gaussian with q = S/M."""


class LocalDPConfig(DPConfig):
    """Sample-level DP-SGD on every client (Opacus): per-sample gradients clipped to C,
    Gaussian noise on each mini-batch gradient, accounted per client with q = B/n_k."""


class PrivacyConfig(Section):
    central: CentralDPConfig | None = Field(None, description="client-level DP-FedAvg")
    local: LocalDPConfig | None = Field(None, description="sample-level DP-SGD (Opacus)")


class FaultsConfig(Section):
    """System heterogeneity in the simulator (docs/faults.md): who is online, who drops,
    who misses the deadline; each model is a registry entry (``fedshield list faults``)."""

    models: list[str] = Field(
        [], description='fault models applied in order, e.g. ["diurnal", "dropout", "deadline"]'
    )
    params: dict[str, dict[str, Any]] = Field(
        {}, description="parameters per fault model, e.g. {dropout = {p = 0.1}}"
    )
    attackers_fail: bool = Field(
        False,
        description="Byzantine clients fault like the others; default false: they are "
        "always online and always answer (the worst case)",
    )
    # None when unset: a resolved config without it dumps (and hashes) as before.
    invite: Literal["online", "population"] | None = Field(
        None,
        description="online (unset): the cohort is drawn from the clients online; population: "
        "from all M, an offline invitee being a missing row (the cohort's attacker share "
        "stays the population's; pair with server.round_defenses = [\"fill\"])",
    )


#: Longest run name: it becomes a folder name (most file systems allow 255 bytes).
MAX_NAME = 200


def check_name(name: str, key: str = "name") -> str:
    """A run name is a folder name under ``runs/``: not empty, not ``.`` or ``..``, no path
    separator, no control character, no surrounding spaces (``name = ""`` wrote the run to
    ``./-2`` and ``name = "../x"`` outside ``runs/``). Raises ValueError naming ``key``."""
    why = None
    if not name.strip():
        why = "is empty"
    elif name.strip(".") == "":
        why = "is only dots"
    elif any(sep in name for sep in ("/", "\\")):
        why = "contains a path separator"
    elif any(ord(ch) < 32 or ord(ch) == 127 for ch in name):
        why = "contains a control character"
    elif name != name.strip():
        why = "has leading or trailing spaces"
    elif len(name.encode()) > MAX_NAME:
        why = f"is longer than {MAX_NAME} bytes"
    if why is not None:
        raise ValueError(
            f"{key} {name!r} {why}; a run name becomes a folder under runs/ "
            f"(use letters, digits, '-', '_', '.', '=')"
        )
    return name


class ExperimentConfig(Section):
    name: str = Field(
        "experiment", description="the run's name: its folder runs/<name> (no '/', not empty)"
    )
    description: str = ""
    plugins: list[str] = Field(
        [], description="modules imported before the config is checked (user components)"
    )
    seed: int = Field(
        0, ge=0, lt=2**63, description="0 <= seed < 2**63 (the range of a TOML integer)"
    )
    rounds: int = Field(20, ge=1, le=MAX_ROUNDS)
    data: DataConfig = DataConfig()
    model: ModelConfig = ModelConfig()
    client: ClientConfig = ClientConfig()
    server: ServerConfig = ServerConfig()
    attack: AttackConfig = AttackConfig()
    eval: EvalConfig = EvalConfig()
    checkpoint: CheckpointConfig = CheckpointConfig()
    run: RunConfig = RunConfig()
    privacy: PrivacyConfig | None = Field(
        None, description="differential privacy (docs/privacy.md)"
    )
    faults: FaultsConfig | None = Field(
        None, description="availability, dropout and deadlines in the simulator (docs/faults.md)"
    )

    @field_validator("name")
    @classmethod
    def _name_is_a_folder_name(cls, v: str) -> str:
        return check_name(v)

    @model_validator(mode="after")
    def _cross_checks(self) -> ExperimentConfig:
        if self.server.clients_per_round > self.data.num_clients:
            raise ValueError(
                f"server.clients_per_round={self.server.clients_per_round} exceeds "
                f"data.num_clients={self.data.num_clients}"
            )
        return self


# --------------------------------------------------------------------------------------
# Loading, overrides, presets


def _fields_at(loc: tuple[Any, ...]) -> list[str]:
    """The keys allowed in the section that contains ``loc`` (for did-you-mean)."""
    model: Any = ExperimentConfig
    for part in loc[:-1]:
        field = getattr(model, "model_fields", {}).get(part)
        if field is None or not isinstance(field.annotation, type):
            return []
        model = field.annotation
    return list(getattr(model, "model_fields", {}))


def _format_validation_error(err: ValidationError, source: str) -> str:
    parts = []
    for e in err.errors():
        loc = ".".join(str(p) for p in e["loc"]) or "<root>"
        msg = e["msg"]
        if e["type"] == "extra_forbidden":
            import difflib

            allowed = _fields_at(tuple(e["loc"]))
            close = difflib.get_close_matches(str(e["loc"][-1]), allowed, n=1)
            msg = f"unknown key (did you mean {close[0]!r}?)" if close else "unknown key"
        elif e["type"] == "literal_error":
            msg = f"{msg} (got {e.get('input')!r})"
        elif e["type"] == "value_error":  # a validator's own wording names the value
            msg = msg.removeprefix("Value error, ")
        else:
            msg = f"{msg} (got {e.get('input')!r})" if "input" in e and e["loc"] else msg
        parts.append(f"{loc}: {msg}")
    return f"{source}: invalid config: " + "; ".join(parts)


def nonfinite_keys(node: Any, prefix: str = "") -> list[str]:
    """Dotted paths of the NaN / ±inf numbers anywhere in a raw config (tables and arrays,
    the free-form parameter tables included)."""
    if isinstance(node, dict):
        return [p for k, v in node.items() for p in nonfinite_keys(v, f"{prefix}{k}.")]
    if isinstance(node, list):
        return [p for i, v in enumerate(node) for p in nonfinite_keys(v, f"{prefix[:-1]}[{i}].")]
    if isinstance(node, float) and not math.isfinite(node):
        return [f"{prefix[:-1]}={node}"]
    return []


def validate(raw: dict[str, Any], source: str = "config") -> ExperimentConfig:
    """``raw`` checked against the schema. A NaN or ±inf anywhere, also inside a component's
    parameter table (``server.aggregator_args.c = nan``), is refused first, naming the key:
    no parameter of any method is defined there, and the resolved config could not be
    written back as TOML (JSON mode turns NaN into null)."""
    bad = nonfinite_keys(raw)
    if bad:
        raise ConfigError(
            f"{source}: invalid config: {bad[0]}: Input should be a finite number (no "
            f"parameter takes NaN or infinity)"
        )
    try:
        return ExperimentConfig.model_validate(raw)
    except ValidationError as err:
        raise ConfigError(_format_validation_error(err, source)) from None


def parse_value(text: str) -> Any:
    """Parse an override value as TOML (numbers, booleans, arrays, strings; bare → string)."""
    try:
        return tomllib.loads(f"v = {text}")["v"]
    except tomllib.TOMLDecodeError:
        return text


def apply_overrides(raw: dict[str, Any], overrides: list[str]) -> dict[str, Any]:
    """Apply ``section.key=value`` overrides to a raw config dict (copy)."""
    import copy

    out = copy.deepcopy(raw)
    for item in overrides:
        if "=" not in item:
            raise ConfigError(f"--set {item!r}: expected KEY=VALUE, e.g. server.aggregator=krum")
        key, value = item.split("=", 1)
        path = key.strip().split(".")
        node = out
        for part in path[:-1]:
            child = node.setdefault(part, {})
            if not isinstance(child, dict):
                raise ConfigError(f"--set {key}: {part!r} is not a section")
            node = child
        node[path[-1]] = parse_value(value.strip())
    return out


def read_toml(path: str | Path) -> dict[str, Any]:
    p = Path(path)
    if not p.is_file():
        raise ConfigError(f"{p}: config file not found")
    try:
        text = p.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        raise ConfigError(f"{p}: not a TOML text file (it is not UTF-8 text)") from None
    except OSError as err:
        raise ConfigError(f"{p}: cannot read the config file ({err.strerror})") from None
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as err:
        raise ConfigError(f"{p}: malformed TOML: {err}") from None


def preset_names() -> list[str]:
    files = resources.files(PRESET_PACKAGE).iterdir()
    return sorted(f.name[:-5] for f in files if f.name.endswith(".toml"))


def read_preset(name: str) -> dict[str, Any]:
    res = resources.files(PRESET_PACKAGE).joinpath(f"{name}.toml")
    if not res.is_file():
        import difflib

        names = preset_names()
        close = difflib.get_close_matches(name, names, n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        raise ConfigError(f"unknown preset {name!r}{hint}; see `fedshield list presets`")
    try:
        raw = tomllib.loads(res.read_text())
    except tomllib.TOMLDecodeError as err:  # a broken preset is our bug, still say where
        raise ConfigError(f"preset {name}: malformed TOML: {err}") from None
    return raw


def load(
    path: str | Path | None = None, *, preset: str | None = None, overrides: Sequence[str] = ()
) -> ExperimentConfig:
    """Load a config from a file or a preset (default: the ``demo`` preset), with overrides."""
    if path is not None and preset is not None:
        raise ConfigError("give either a config file or --preset, not both")
    if path is not None:
        raw, source = read_toml(path), str(path)
        if isinstance(raw.get("plugins"), list) and all(isinstance(x, str) for x in raw["plugins"]):
            from fedshield.plugins import resolve_plugin_paths

            raw["plugins"] = resolve_plugin_paths(raw["plugins"], Path(path).parent)
        if not raw:
            raise ConfigError(
                f"{path}: the config is empty; set at least name, rounds, [data] dataset and "
                f"[model] name (or run a bundled one: --preset demo)"
            )
    else:
        preset = preset or "demo"
        raw, source = read_preset(preset), f"preset {preset}"
    raw = apply_overrides(raw, list(overrides))
    return validate(raw, source)


def dump(cfg: ExperimentConfig) -> str:
    """The fully resolved config as TOML (written next to every run)."""
    return tomli_w.dumps(cfg.model_dump(mode="json", exclude_none=True))
