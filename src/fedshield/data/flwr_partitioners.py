"""Flower Datasets' partitioners, selectable beside fedshield's (``data.partition``).

``flwr_iid``, ``flwr_dirichlet``, ``flwr_linear`` and ``flwr_square`` run the partitioners
of ``flwr_datasets.partitioner`` (Flower Datasets, extra ``hf``) on the training labels, on
any dataset (bundled, files or ``hf:``). Their parameters come from the ``[data]`` table
like fedshield's own (``data.beta`` is Dirichlet's α, ``data.min_size`` its
``min_partition_size``) and their seed from the run's partition stream, so a partition
stays a pure function of (labels, M, parameters, seed); the labels are shuffled first with
that stream (Flower's IID and size partitioners cut the rows in order).

Offered are the partitioners that split every training sample, as a fedshield partition
does: Flower's Pathological and Shard partitioners may leave samples or classes out, and
its Exponential one gives clients no sample from M ≈ log2(N) on (fedshield's ``shards``
deals k label-sorted shards per client).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
from pydantic import Field

from fedshield.core.params import NoParams, Params
from fedshield.data.partition import PARTITIONERS, feasible
from fedshield.errors import ConfigError


def _require(name: str) -> Any:
    try:
        import flwr_datasets.partitioner as part
    except ImportError:
        raise ConfigError(
            f"data.partition={name!r} needs Flower Datasets: pip install 'fedshield[hf]'"
        ) from None
    return part


def _run(name: str, make: Callable[[Any, int], Any], labels: np.ndarray,
         rng: np.random.Generator, num_clients: int) -> list[np.ndarray]:  # fmt: skip
    """Partition ``labels`` with the Flower partitioner ``make(module, seed)``; returns the
    original row indices of each client."""
    part = _require(name)
    from datasets import Dataset

    perm = rng.permutation(len(labels))
    seed = int(rng.integers(2**31 - 1))
    table = Dataset.from_dict({"label": labels[perm].tolist(), "row": perm.tolist()})
    partitioner = make(part, seed)
    partitioner.dataset = table
    try:
        return [np.sort(np.asarray(partitioner.load_partition(k)["row"], dtype=np.int64))
                for k in range(num_clients)]  # fmt: skip
    except ValueError as err:  # Flower's own checks (sizes, min_partition_size, ...)
        raise ConfigError(f"data.partition={name!r}: {err}") from None


def _needs_flwr(
    name: str, weights: Callable[[int], np.ndarray] | None = None
) -> Callable[..., None]:
    """The sizes check of a Flower partitioner (:func:`~fedshield.data.partition.feasible`),
    before any data is loaded: Flower Datasets installed, and ``data.min_size`` reachable —
    ``min_size`` × clients within the samples (Dirichlet's ``min_partition_size``, which
    Flower otherwise reports after loading, as a failure to sample with "alpha"), and for
    the size partitioners (client k's share ∝ ``weights(M)[k]``) the smallest client's at
    most ⌊n·w_min/Σw⌋ + 1 samples."""

    def check(n: int, num_clients: int, min_size: int, **_: Any) -> None:
        _require(name)
        if min_size * num_clients > n:
            raise ConfigError(
                f"data.min_size={min_size} × data.num_clients={num_clients} exceeds the {n} "
                f"training samples (data.partition={name!r})"
            )
        if weights is not None:
            w = weights(num_clients)
            most = int(n * float(w.min()) / float(w.sum())) + 1
            if most < min_size:
                raise ConfigError(
                    f"data.min_size={min_size}: partition {name!r} gives the smallest of "
                    f"data.num_clients={num_clients} clients at most {most} of the {n} "
                    "training samples; lower min_size or num_clients"
                )

    return check


class FlwrDirichletParams(Params):
    """Flower's DirichletPartitioner parameters, read from ``[data]``; the rows it sees are
    shuffled, and its ``seed`` derived, by fedshield's partition stream (the run's seed)."""

    beta: float = Field(
        0.5,
        gt=0.0,
        description="Dirichlet concentration α (data.beta); Flower's seed is derived from "
        "the run's partition stream, its rows shuffled by it",
    )
    min_size: int = Field(
        1,
        ge=0,
        description="Flower's min_partition_size (data.min_size): re-sample until every client "
        "has it (Flower's own default is 10)",
    )


@feasible(_needs_flwr("flwr_iid", np.ones))
@PARTITIONERS.register("flwr_iid", schema=NoParams)
def flwr_iid(labels: np.ndarray, num_clients: int, rng: np.random.Generator) -> list[np.ndarray]:
    """Flower Datasets' IidPartitioner: M equal parts of the shuffled rows."""
    return _run("flwr_iid", lambda p, _s: p.IidPartitioner(num_clients), labels, rng, num_clients)


@feasible(_needs_flwr("flwr_dirichlet"))
@PARTITIONERS.register("flwr_dirichlet", schema=FlwrDirichletParams)
def flwr_dirichlet(
    labels: np.ndarray, num_clients: int, rng: np.random.Generator, *, beta: float, min_size: int
) -> list[np.ndarray]:
    """Flower Datasets' DirichletPartitioner on rows shuffled by fedshield's partition
    stream, seeded from it: Flower's own output only with that shuffle and seed.

    A Dir(α) share of every class per client. ``DirichletPartitioner(seed=<run seed>)`` on
    the dataset as stored gives another partition."""

    def make(p: Any, seed: int) -> Any:
        return p.DirichletPartitioner(
            num_clients, "label", alpha=beta, min_partition_size=min_size, seed=seed
        )

    return _run("flwr_dirichlet", make, labels, rng, num_clients)


def _register_size(key: str, cls: str, what: str, weights: Callable[[int], np.ndarray]) -> None:
    def fn(labels: np.ndarray, num_clients: int, rng: np.random.Generator) -> list[np.ndarray]:
        return _run(key, lambda p, _s: getattr(p, cls)(num_clients), labels, rng, num_clients)

    fn.__doc__ = f"Flower Datasets' {cls}: client sizes {what} in the client's index."
    feasible(_needs_flwr(key, weights))(PARTITIONERS.register(key, schema=NoParams)(fn))


_register_size(
    "flwr_linear", "LinearPartitioner", "growing linearly", lambda m: np.arange(1.0, m + 1)
)
_register_size(
    "flwr_square", "SquarePartitioner", "growing with the square",
    lambda m: np.arange(1.0, m + 1) ** 2,
)  # fmt: skip


__all__ = ["flwr_dirichlet", "flwr_iid"]
