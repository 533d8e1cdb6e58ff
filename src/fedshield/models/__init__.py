"""Model registry (SPEC §9). ``build_model(name, input_shape, num_classes, **params)``."""

from fedshield.models import cnn as _cnn  # noqa: F401  (fills the registry)
from fedshield.models import resnet as _resnet  # noqa: F401
from fedshield.models.base import MODELS, Classifier, build_model

__all__ = ["MODELS", "Classifier", "build_model"]
