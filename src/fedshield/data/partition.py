"""Partitioners: split a train set's indices among M clients (SPEC §9).

Each takes the label vector and returns M disjoint index tensors that together cover every
sample exactly once. All randomness comes from a ``numpy.random.Generator`` seeded by the
caller, so a partition is a pure function of (labels, M, parameters, seed).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch
from torch import Tensor

from fedshield.errors import ConfigError
from fedshield.registry import Registry

Partitioner = Callable[..., list[np.ndarray]]
PARTITIONERS: Registry[Partitioner] = Registry(
    "partitioner", context=("labels", "num_clients", "rng")
)

MAX_REDRAWS = 1000


@PARTITIONERS.register("iid")
def iid(labels: np.ndarray, num_clients: int, rng: np.random.Generator) -> list[np.ndarray]:
    """Shuffle, then split into M near-equal parts."""
    return list(np.array_split(rng.permutation(len(labels)), num_clients))


@PARTITIONERS.register("dirichlet")
def dirichlet(
    labels: np.ndarray,
    num_clients: int,
    rng: np.random.Generator,
    beta: float = 0.5,
    min_size: int = 1,
) -> list[np.ndarray]:
    """Per-class Dir(beta) proportions over clients (Hsu et al. 2019), re-drawn until every
    client holds at least ``min_size`` samples. Smaller beta ⇒ more label skew.

    As in NIID-Bench (Li et al. 2022), a client already holding N/M samples gets no share of
    the next classes in a draw, which keeps the re-draw loop short for small beta."""
    if beta <= 0:
        raise ConfigError(f"data.beta must be > 0, got {beta}")
    if min_size * num_clients > len(labels):
        raise ConfigError(
            f"data.min_size={min_size} × num_clients={num_clients} exceeds {len(labels)} samples"
        )
    classes = np.unique(labels)
    by_class = [np.flatnonzero(labels == c) for c in classes]
    for _ in range(MAX_REDRAWS):
        parts: list[list[np.ndarray]] = [[] for _ in range(num_clients)]
        sizes = np.zeros(num_clients)
        for idx in by_class:
            idx = rng.permutation(idx)
            p = rng.dirichlet(np.full(num_clients, beta))
            p = p * (sizes < len(labels) / num_clients)
            p = p / p.sum()
            cuts = (np.cumsum(p) * len(idx)).astype(int)[:-1]
            for k, chunk in enumerate(np.split(idx, cuts)):
                parts[k].append(chunk)
                sizes[k] += len(chunk)
        out = [np.sort(np.concatenate(p)) for p in parts]
        if min(len(p) for p in out) >= min_size:
            return out
    raise ConfigError(
        f"dirichlet partition: no draw in {MAX_REDRAWS} gave every one of {num_clients} clients "
        f">= data.min_size={min_size} samples with beta={beta}; lower min_size or raise beta"
    )


@PARTITIONERS.register("shards")
def shards(
    labels: np.ndarray,
    num_clients: int,
    rng: np.random.Generator,
    shards_per_client: int = 2,
) -> list[np.ndarray]:
    """Sort by label, cut into M·k shards, deal k random shards to each client (McMahan 2017)."""
    n_shards = num_clients * shards_per_client
    if n_shards > len(labels):
        raise ConfigError(
            f"shards partition: {num_clients} clients × data.shards_per_client="
            f"{shards_per_client} = {n_shards} shards exceeds {len(labels)} samples"
        )
    # Stable sort with a random tie-break so samples of one class are shuffled between shards.
    order = np.lexsort((rng.random(len(labels)), labels))
    pieces = np.array_split(order, n_shards)
    deal = rng.permutation(n_shards).reshape(num_clients, shards_per_client)
    return [np.sort(np.concatenate([pieces[s] for s in row])) for row in deal]


def partition(
    labels: Tensor | np.ndarray,
    num_clients: int,
    name: str,
    seed: int,
    **params: object,
) -> list[Tensor]:
    """Run a registered partitioner; check the result is a partition with no empty client."""
    y = labels.numpy() if isinstance(labels, Tensor) else np.asarray(labels)
    if num_clients > len(y):
        raise ConfigError(
            f"data.num_clients={num_clients} exceeds the {len(y)} training samples available"
        )
    fn = PARTITIONERS.get(name)
    try:
        parts = fn(y, num_clients, np.random.default_rng([seed, 0xDA7A]), **params)
    except TypeError as err:
        raise ConfigError(f"partitioner {name!r}: {err}") from None
    empty = [k for k, p in enumerate(parts) if len(p) == 0]
    if empty:
        raise ConfigError(
            f"partition {name!r} left {len(empty)} of {num_clients} clients without data "
            f"(e.g. client {empty[0]}); use fewer clients or a less skewed partition"
        )
    return [torch.from_numpy(p.astype(np.int64)) for p in parts]
