"""Server algorithms (SPEC §1–§5, §7, §8)."""

from fedshield.algorithms.server import fedavg as _fedavg  # noqa: F401  (fills the registry)
from fedshield.algorithms.server.base import (
    SERVER_ALGORITHMS,
    ServerAlgorithm,
    ServerServices,
    ServerStep,
)

__all__ = ["SERVER_ALGORITHMS", "ServerAlgorithm", "ServerServices", "ServerStep"]
