"""Evaluation: accuracy/loss, per-client and per-group metrics."""

from fedshield.eval.accuracy import evaluate

__all__ = ["evaluate"]
