"""Model registry (SPEC §9). ``build_model(name, input_shape, num_classes, **params)``.
Every module here registers its models on import."""

from fedshield._plugins import import_submodules
from fedshield.models.base import MODELS, Classifier, build_model

import_submodules(__name__)

__all__ = ["MODELS", "Classifier", "build_model"]
