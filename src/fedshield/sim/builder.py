"""Config → components: data, partition, model, client/server algorithms, aggregator, attack.

Everything that can be checked without data is checked first (names, method parameters,
aggregator feasibility), so a bad config fails in milliseconds with the key it concerns.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import nn

from fedshield.aggregators.base import AGGREGATORS, Aggregator
from fedshield.algorithms.client import CLIENT_ALGORITHMS, ClientAlgorithm, LocalSpec
from fedshield.algorithms.server import SERVER_ALGORITHMS, ServerAlgorithm
from fedshield.attacks.base import ATTACKS, DataAttack, UpdateAttack
from fedshield.config import ExperimentConfig
from fedshield.core.params import parse_params
from fedshield.data import DataBundle, TensorData, carve, load_dataset, make_long_tail, partition
from fedshield.errors import ConfigError
from fedshield.models import build_model
from fedshield.registry import RegistryError


def load_plugins() -> None:
    """Import every module that registers components (registries fill on import)."""
    import fedshield.aggregators  # noqa: F401
    import fedshield.attacks  # noqa: F401
    import fedshield.data  # noqa: F401
    import fedshield.models  # noqa: F401


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    dev = torch.device(name)
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ConfigError(f"run.device={name!r} but no CUDA device is available")
    return dev


@dataclass
class Components:
    """The data-independent parts of an experiment."""

    client: ClientAlgorithm
    server: ServerAlgorithm
    aggregator: Aggregator
    attack: UpdateAttack | DataAttack | None


def _construct(key: str, factory: Any, args: dict[str, Any]) -> Any:
    try:
        return factory(**args)
    except TypeError as err:
        raise ConfigError(f"{key}: {err}") from None


def _get(registry: Any, name: str, key: str) -> Any:
    try:
        return registry.get(name)
    except RegistryError as err:
        raise ConfigError(f"{key}: {err}") from None


def build_components(cfg: ExperimentConfig) -> Components:
    load_plugins()
    c, s = cfg.client, cfg.server
    spec = LocalSpec(
        lr=c.lr,
        batch_size=c.batch_size,
        steps=c.local_steps,
        epochs=c.local_epochs,
        momentum=c.momentum,
        weight_decay=c.weight_decay,
    )
    client_cls = _get(CLIENT_ALGORITHMS, c.algorithm, "client.algorithm")
    client = client_cls(spec, parse_params(client_cls.params_schema, c.params, "client.params"))

    server_cls = _get(SERVER_ALGORITHMS, s.algorithm, "server.algorithm")
    if "aggregator" not in s.model_fields_set:  # e.g. server.algorithm = "drag" → "drag" rule
        s.aggregator = server_cls.default_aggregator
    agg_cls = _get(AGGREGATORS, s.aggregator, "server.aggregator")
    aggregator = _construct("server.aggregator_args", agg_cls, s.aggregator_args)
    try:
        aggregator.validate(s.clients_per_round)
    except ConfigError as err:
        raise ConfigError(f"server.aggregator={s.aggregator!r}: {err}") from None

    server = server_cls(
        aggregator,
        lr=s.lr,
        weighting=s.weighting,
        params=parse_params(server_cls.params_schema, s.params, "server.params"),
    )

    attack = None
    if cfg.attack.name != "none":
        attack_cls = _get(ATTACKS, cfg.attack.name, "attack.name")
        attack = _construct("attack.params", attack_cls, cfg.attack.params)
    elif cfg.attack.fraction > 0:
        raise ConfigError(
            f"attack.fraction={cfg.attack.fraction} but attack.name='none'; "
            f"choose an attack (see `fedshield list attacks`)"
        )
    import fedshield.eval as eval_pkg

    for name in cfg.eval.metrics:
        _get(eval_pkg.EVALUATORS, name, "eval.metrics")
    unknown = sorted(set(cfg.eval.params) - set(cfg.eval.metrics))
    if unknown:
        raise ConfigError(f"eval.params.{unknown[0]}: no such evaluator in eval.metrics")
    if server.needs_root and cfg.data.root_size == 0:
        raise ConfigError(
            f"server.aggregator={s.aggregator!r} needs a root dataset: set data.root_size > 0"
        )
    return Components(client, server, aggregator, attack)


@dataclass
class Experiment:
    cfg: ExperimentConfig
    components: Components
    bundle: DataBundle
    clients: list[TensorData]
    train: TensorData
    root: TensorData | None
    val: TensorData | None
    model: nn.Module
    byzantine: tuple[int, ...]
    device: torch.device


def choose_byzantine(cfg: ExperimentConfig) -> tuple[int, ...]:
    """The fixed Byzantine set A (SPEC §6): round(fraction·M) workers chosen by the seed."""
    if cfg.attack.name == "none" or cfg.attack.mode != "fixed":
        return ()
    m = cfg.data.num_clients
    a = int(round(cfg.attack.fraction * m))
    rng = np.random.default_rng([cfg.seed, 0xB1A5])
    return tuple(sorted(int(i) for i in rng.choice(m, size=a, replace=False)))


def build(cfg: ExperimentConfig) -> Experiment:
    components = build_components(cfg)
    device = resolve_device(cfg.run.device)
    d = cfg.data
    bundle = load_dataset(d.dataset, d.root, d.download, d.params)
    train = bundle.train
    if d.long_tail.rho > 1:
        train = make_long_tail(train, bundle.num_classes, d.long_tail.rho, cfg.seed)
    sizes = {k: v for k, v in {"root": d.root_size, "val": d.val_size}.items() if v > 0}
    train, held = carve(train, sizes, cfg.seed) if sizes else (train, {})
    part_args: dict[str, Any] = {}
    if d.partition == "dirichlet":
        part_args = {"beta": d.beta, "min_size": d.min_size}
    elif d.partition == "shards":
        part_args = {"shards_per_client": d.shards_per_client}
    try:
        parts = partition(train.y, d.num_clients, d.partition, cfg.seed, **part_args)
    except RegistryError as err:
        raise ConfigError(f"data.partition: {err}") from None
    clients = [train.subset(p) for p in parts]
    if device.type == "cuda":  # small federated datasets fit on the device: no per-step copies
        clients = [c.to(device) for c in clients]
    torch.manual_seed(cfg.seed)
    model = build_model(cfg.model.name, bundle.input_shape, bundle.num_classes, **cfg.model.params)
    model.to(device)
    exp = Experiment(
        cfg=cfg,
        components=components,
        bundle=bundle,
        clients=clients,
        train=train,
        root=held.get("root"),
        val=held.get("val"),
        model=model,
        byzantine=choose_byzantine(cfg),
        device=device,
    )
    if cfg.run.vectorize is True:  # "auto" decides (and logs) at the first round instead
        from fedshield.sim.vectorized import require_vectorizable

        require_vectorizable(exp)
    return exp
