"""Server algorithms (the DRAG paper's, the FedCART paper's, the early-exit ViT paper's and
their baselines; docs/references.md). Every module here registers itself."""

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
