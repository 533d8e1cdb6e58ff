"""System heterogeneity for the in-process simulator: availability, dropout,
deadlines and partial work as registered fault models (``fedshield list faults``).

Configured as ``[faults] models = ["diurnal", "dropout", "deadline"]`` with
``[faults.params] dropout = {p = 0.1}``; :func:`fedshield.faults.plan.build_plan` checks the
names and parameters (and reads trace files) before any data is loaded. docs/faults.md
describes the models, keys and metrics.
"""

from __future__ import annotations

from fedshield._plugins import import_submodules
from fedshield.faults.base import FAULT_MODELS, FaultEnv, FaultModel, RoundFaults

import_submodules(__name__)

__all__ = ["FAULT_MODELS", "FaultEnv", "FaultModel", "RoundFaults"]
