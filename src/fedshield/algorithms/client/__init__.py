"""Local update rules (docs/references.md: the papers and baselines). Every module here
registers itself."""

from fedshield._plugins import import_submodules
from fedshield.algorithms.client.base import (
    CLIENT_ALGORITHMS,
    ClientAlgorithm,
    ClientContext,
    ClientRound,
    LocalSpec,
)

import_submodules(__name__)

__all__ = ["CLIENT_ALGORITHMS", "ClientAlgorithm", "ClientContext", "ClientRound", "LocalSpec"]
