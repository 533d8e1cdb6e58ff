"""Server algorithms (SPEC §1–§5, §7, §8). Every module here registers itself."""

from fedshield._plugins import import_submodules
from fedshield.algorithms.server.base import (
    SERVER_ALGORITHMS,
    ServerAlgorithm,
    ServerRound,
    ServerServices,
    ServerStep,
)

import_submodules(__name__)

__all__ = ["SERVER_ALGORITHMS", "ServerAlgorithm", "ServerRound", "ServerServices", "ServerStep"]
