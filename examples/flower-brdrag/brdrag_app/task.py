"""Data, model and local training of the example: plain torch and scikit-learn.

Nothing here knows fedshield. The run config keys (``[tool.flwr.app.config]`` of
pyproject.toml) have their defaults in :data:`DEFAULTS`, which is also what a run without a
run config (``flwr.simulation.run_simulation``) uses.
"""

from __future__ import annotations

from functools import lru_cache
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from sklearn.datasets import load_digits
from torch import Tensor, nn

DEFAULTS: dict[str, Any] = {
    "num-server-rounds": 5,
    "num-clients": 4,  # the ServerApp waits for this many SuperNodes
    "lr": 0.3,
    "batch-size": 32,
    "local-steps": 5,
    "c": 0.5,  # BR-DRAG's DoD scale
    "hidden": 32,
    "test-size": 300,
    "root-size": 100,  # the server's vetted root data, disjoint from every client
    "seed": 0,
    "out": "",  # a directory for the final model and metrics ("": none)
}


def settings(run_config: dict[str, Any] | None) -> dict[str, Any]:
    """The run config over :data:`DEFAULTS`."""
    return DEFAULTS | dict(run_config or {})


@lru_cache(maxsize=4)
def _splits(seed: int, test_size: int, root_size: int) -> dict[str, tuple[Tensor, Tensor]]:
    x, y = load_digits(return_X_y=True)
    x = torch.from_numpy((x / 16.0).astype(np.float32))
    y = torch.from_numpy(y.astype(np.int64))
    perm = torch.from_numpy(np.random.default_rng(seed).permutation(len(y)))
    test, root = perm[:test_size], perm[test_size : test_size + root_size]
    train = perm[test_size + root_size :]
    return {"test": (x[test], y[test]), "root": (x[root], y[root]), "train": (x[train], y[train])}


def load_split(name: str, cfg: dict[str, Any]) -> tuple[Tensor, Tensor]:
    """``"test"``, ``"root"`` (the server's) or ``"train"`` (all clients' data)."""
    return _splits(int(cfg["seed"]), int(cfg["test-size"]), int(cfg["root-size"]))[name]


def load_partition(
    partition_id: int, num_partitions: int, cfg: dict[str, Any]
) -> tuple[Tensor, Tensor]:
    """Client ``partition_id``'s share of the training split (IID, contiguous chunks)."""
    x, y = load_split("train", cfg)
    idx = np.array_split(np.arange(len(y)), num_partitions)[partition_id]
    return x[idx], y[idx]


class Net(nn.Module):
    """A 64 → hidden → 10 MLP."""

    def __init__(self, hidden: int = 32) -> None:
        super().__init__()
        self.fc1 = nn.Linear(64, hidden)
        self.fc2 = nn.Linear(hidden, 10)

    def forward(self, x: Tensor) -> Tensor:
        return self.fc2(F.relu(self.fc1(x.flatten(1))))


def batch_generator(seed: int, server_round: int, partition_id: int) -> torch.Generator:
    """The mini-batch order of one client in one round."""
    return torch.Generator().manual_seed(seed * 1_000_003 + server_round * 1_009 + partition_id)


def train(
    net: nn.Module,
    x: Tensor,
    y: Tensor,
    *,
    lr: float,
    batch_size: int,
    steps: int,
    generator: torch.Generator,
) -> float:
    """``steps`` steps of mini-batch SGD, epoch by epoch over fresh permutations; the mean
    training loss."""
    net.train()
    opt = torch.optim.SGD(net.parameters(), lr=lr)
    done, total = 0, 0.0
    while done < steps:
        perm = torch.randperm(len(y), generator=generator)
        for start in range(0, len(y), batch_size):
            idx = perm[start : start + batch_size]
            opt.zero_grad(set_to_none=True)
            loss = F.cross_entropy(net(x[idx]), y[idx])
            loss.backward()
            opt.step()
            total += float(loss.detach())
            done += 1
            if done == steps:
                break
    return total / max(steps, 1)


@torch.no_grad()
def evaluate(net: nn.Module, x: Tensor, y: Tensor) -> tuple[float, float]:
    """(mean cross-entropy, accuracy)."""
    net.eval()
    logits = net(x)
    return float(F.cross_entropy(logits, y)), float((logits.argmax(1) == y).float().mean())
