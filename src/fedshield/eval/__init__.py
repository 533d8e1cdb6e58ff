"""Evaluation: accuracy/loss plus registered evaluators (robust accuracy, routing, ...).

An evaluator named in ``eval.metrics`` runs on the global model at the final round (and
every ``eval.metrics_every`` rounds when set); its flat dict of metrics joins that round's
record and ``summary.json``. Every module here registers itself.
"""

from fedshield._plugins import import_submodules
from fedshield.eval.accuracy import evaluate
from fedshield.eval.base import EVALUATORS, EvalInputs

import_submodules(__name__)

__all__ = ["EVALUATORS", "EvalInputs", "evaluate"]
