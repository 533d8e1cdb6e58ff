"""Local update rules (SPEC §1, §4, §7, §8)."""

from fedshield.algorithms.client import sgd as _sgd  # noqa: F401  (fills the registry)
from fedshield.algorithms.client.base import (
    CLIENT_ALGORITHMS,
    ClientAlgorithm,
    ClientContext,
    LocalSpec,
)

__all__ = ["CLIENT_ALGORITHMS", "ClientAlgorithm", "ClientContext", "LocalSpec"]
