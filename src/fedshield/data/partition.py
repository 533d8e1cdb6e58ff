"""Partitioners: split a train set's indices among M clients (docs/usage.md).

Each takes the label vector and returns M disjoint index tensors that together cover every
sample exactly once. All randomness comes from a ``numpy.random.Generator`` seeded by the
caller, so a partition is a pure function of (labels, M, parameters, seed).

A partitioner's parameters live directly in the ``[data]`` table (``data.beta``,
``data.min_size``, ``data.shards_per_client``); each entry's schema names the ones it
reads, and :func:`partitioner_params` picks and validates them. ``data.min_size`` holds for
every partitioner: Dirichlet re-draws until each client has that many samples, the others
(whose sizes follow from N and M) are refused when they cannot give them.

Each entry may declare ``check(n, num_clients, min_size, **params)`` (:func:`feasible`): the
sizes it cannot split ``n`` samples into, raised as a ConfigError. :func:`check_sizes` runs
it on a dataset's declared size before any data is loaded, :func:`partition` on the real one.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import numpy as np
import torch
from pydantic import Field
from torch import Tensor

from fedshield.core.params import NoParams, Params
from fedshield.errors import ConfigError
from fedshield.registry import Registry

Partitioner = Callable[..., list[np.ndarray]]
PARTITIONERS: Registry[Partitioner] = Registry(
    "partitioner", context=("labels", "num_clients", "rng")
)

MAX_REDRAWS = 1000


class DirichletParams(Params):
    beta: float = Field(
        0.5, gt=0.0, description="Dirichlet concentration β (smaller: more label skew)"
    )
    min_size: int = Field(
        1, ge=0, description="re-draw until every client holds at least this many samples"
    )


class ShardsParams(Params):
    shards_per_client: int = Field(
        2, ge=1, description="label-sorted shards dealt to each client (≈ classes per client)"
    )


SizeCheck = Callable[..., None]


def feasible(check: SizeCheck) -> Callable[[Partitioner], Partitioner]:
    """Attach ``check(n, num_clients, min_size, **params)`` to a partitioner: raise a
    ConfigError, naming the keys, when ``n`` samples cannot be split as asked. It must
    refuse only what is impossible for *every* label vector of ``n`` samples, so that a
    declared (or upper-bound) size never refuses a feasible config."""

    def deco(fn: Partitioner) -> Partitioner:
        fn.check = check  # type: ignore[attr-defined]
        return fn

    return deco


def _too_small(name: str, n: int, num_clients: int, min_size: int, per_client: int) -> str:
    return (
        f"data.min_size={min_size}: partition {name!r} gives each of data.num_clients="
        f"{num_clients} clients about {per_client} of the {n} training samples; lower "
        f"min_size or num_clients"
    )


def _check_iid(n: int, num_clients: int, min_size: int) -> None:
    if n // num_clients < min_size:  # array_split: every part holds floor or ceil(n / M)
        raise ConfigError(_too_small("iid", n, num_clients, min_size, n // num_clients))


def _check_dirichlet(n: int, num_clients: int, min_size: int, **_: Any) -> None:
    if min_size * num_clients > n:
        raise ConfigError(
            f"data.min_size={min_size} × num_clients={num_clients} exceeds {n} samples"
        )


def _check_shards(n: int, num_clients: int, min_size: int, *, shards_per_client: int) -> None:
    n_shards = num_clients * shards_per_client
    if n_shards > n:
        raise ConfigError(
            f"shards partition: {num_clients} clients × data.shards_per_client="
            f"{shards_per_client} = {n_shards} shards exceeds {n} samples"
        )
    most = shards_per_client * -(-n // n_shards)  # k shards of at most ceil(n / (M k))
    if most < min_size:
        raise ConfigError(_too_small("shards", n, num_clients, min_size, most))


@feasible(_check_iid)
@PARTITIONERS.register("iid", schema=NoParams)
def iid(labels: np.ndarray, num_clients: int, rng: np.random.Generator) -> list[np.ndarray]:
    """Shuffle the samples, then split them into M near-equal parts."""
    return list(np.array_split(rng.permutation(len(labels)), num_clients))


@feasible(_check_dirichlet)
@PARTITIONERS.register("dirichlet", schema=DirichletParams)
def dirichlet(
    labels: np.ndarray,
    num_clients: int,
    rng: np.random.Generator,
    *,
    beta: float,
    min_size: int,
) -> list[np.ndarray]:
    """Give each client a Dir(β) share of every class: label skew set by β (Hsu 2019).

    The draw is repeated until every client holds at least ``min_size`` samples. As in
    NIID-Bench (Li et al. 2022), a client already holding N/M samples gets no share of the
    next classes in a draw, which keeps the re-draw loop short for small β."""
    _check_dirichlet(len(labels), num_clients, min_size)
    classes = np.unique(labels)
    by_class = [np.flatnonzero(labels == c) for c in classes]
    for _ in range(MAX_REDRAWS):
        parts: list[list[np.ndarray]] = [[] for _ in range(num_clients)]
        sizes = np.zeros(num_clients)
        for idx in by_class:
            idx = rng.permutation(idx)
            p = rng.dirichlet(np.full(num_clients, beta))
            p = p * (sizes < len(labels) / num_clients)
            if not p.sum() > 0:  # every share underflowed or went to full clients: re-draw
                break
            p = p / p.sum()
            cuts = (np.cumsum(p) * len(idx)).astype(int)[:-1]
            for k, chunk in enumerate(np.split(idx, cuts)):
                parts[k].append(chunk)
                sizes[k] += len(chunk)
        else:
            out = [np.sort(np.concatenate(p)) for p in parts]
            if min(len(p) for p in out) >= min_size:
                return out
    raise ConfigError(
        f"dirichlet partition: no draw in {MAX_REDRAWS} gave every one of {num_clients} clients "
        f">= data.min_size={min_size} samples with beta={beta}; lower min_size or raise beta"
    )


@feasible(_check_shards)
@PARTITIONERS.register("shards", schema=ShardsParams)
def shards(
    labels: np.ndarray,
    num_clients: int,
    rng: np.random.Generator,
    *,
    shards_per_client: int,
) -> list[np.ndarray]:
    """Sort by label, cut into M·k shards and deal k random shards to each client.

    McMahan et al. 2017's pathological non-IID split: about k classes per client."""
    n_shards = num_clients * shards_per_client
    _check_shards(len(labels), num_clients, 1, shards_per_client=shards_per_client)
    # Stable sort with a random tie-break so samples of one class are shuffled between shards.
    order = np.lexsort((rng.random(len(labels)), labels))
    pieces = np.array_split(order, n_shards)
    deal = rng.permutation(n_shards).reshape(num_clients, shards_per_client)
    return [np.sort(np.concatenate([pieces[s] for s in row])) for row in deal]


def partitioner_params(name: str, source: Mapping[str, Any] | Any, where: str = "data") -> Params:
    """The validated parameters of partitioner ``name``, read from ``source`` (the ``[data]``
    table as a mapping, or the DataConfig object): only the keys the entry's schema
    declares are taken (``beta`` and ``min_size`` for dirichlet), so the builder passes
    the whole section through the registry. An unknown name is a RegistryError naming
    ``data.partition``; a bad value a ConfigError naming ``where.key`` (``data.beta``)."""
    entry = PARTITIONERS.entry(name, "data.partition")
    raw: dict[str, Any] = {}
    for key in entry.schema.model_fields:
        if isinstance(source, Mapping):
            if key in source:
                raw[key] = source[key]
        elif hasattr(source, key):
            raw[key] = getattr(source, key)
    return entry.parse(raw, where)


def check_sizes(
    n: int,
    num_clients: int,
    name: str,
    min_size: int = 1,
    *,
    where: str = "data",
    parsed: Params | None = None,
    **params: Any,
) -> None:
    """Refuse, from the sample count ``n`` alone, a split partitioner ``name`` cannot make:
    more clients than samples, ``min_size`` × clients beyond ``n``, too many shards, ...
    (the builder calls it with the size the dataset declares, before loading it).
    ``parsed``: the parameters as :func:`partitioner_params` returned them."""
    entry = PARTITIONERS.entry(name, "data.partition")
    kwargs = (parsed or _parse_params(name, params, min_size, where)).kwargs()
    if num_clients > n:
        raise ConfigError(
            f"data.num_clients={num_clients} exceeds the {n} training samples available"
        )
    check = getattr(entry.obj, "check", None)
    if check is not None:
        kwargs.pop("min_size", None)
        check(n, num_clients, max(min_size, 1), **kwargs)


def _parse_params(
    name: str, params: Mapping[str, Any], min_size: int, where: str = "data"
) -> Params:
    """The validated parameters of partitioner ``name`` given as keywords (``min_size`` to
    those whose schema has it); a run reads them once, from its ``[data]`` section
    (:func:`partitioner_params`), and hands them on as ``parsed``."""
    entry = PARTITIONERS.entry(name, "data.partition")
    if "min_size" in entry.schema.model_fields:
        params = {"min_size": min_size, **params}
    return entry.parse(params, where)


def partition(
    labels: Tensor | np.ndarray,
    num_clients: int,
    name: str,
    seed: int,
    *,
    where: str = "data",
    min_size: int | None = None,
    parsed: Params | None = None,
    **params: object,
) -> list[Tensor]:
    """Run a registered partitioner with ``params`` validated by its schema (keys named
    ``where.key``); check the result is a partition in which every client holds at least
    ``min_size`` samples (``data.min_size``; at least one in any case). A partitioner
    whose schema has ``min_size`` (Dirichlet) receives it; with ``min_size=None`` it
    takes its schema's default."""
    entry = PARTITIONERS.entry(name, "data.partition")
    if min_size is None:
        min_size = int(params.get("min_size", 1))  # type: ignore[call-overload]
    params = {k: v for k, v in params.items() if k != "min_size"}
    parsed = parsed or _parse_params(name, params, min_size, where)
    kwargs = parsed.kwargs()
    y = labels.numpy() if isinstance(labels, Tensor) else np.asarray(labels)
    check_sizes(len(y), num_clients, name, min_size, where=where, parsed=parsed)
    parts = entry.obj(y, num_clients, np.random.default_rng([seed, 0xDA7A]), **kwargs)
    empty = [k for k, p in enumerate(parts) if len(p) == 0]
    if empty:
        raise ConfigError(
            f"partition {name!r} left {len(empty)} of {num_clients} clients without data "
            f"(e.g. client {empty[0]}); use fewer clients or a less skewed partition"
        )
    small = min(len(p) for p in parts)
    if small < min_size:
        raise ConfigError(
            f"data.min_size={min_size}: partition {name!r} gave a client only {small} "
            f"samples; lower min_size or num_clients"
        )
    return [torch.from_numpy(p.astype(np.int64)) for p in parts]
