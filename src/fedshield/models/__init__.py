"""Model registry (docs/usage.md). ``build_model(name, input_shape, num_classes, **params)``;
``parse_model_params(name, params)`` validates ``model.params`` without building, and
``model_tags(name, params)`` gives the tags of the model those params build, and
``check_model(name, shape, classes, params)`` builds it on the meta device (a data-free full
check). Every module here registers its models on import."""

from fedshield._plugins import import_submodules
from fedshield.models.base import (
    MODELS,
    Classifier,
    build_model,
    check_model,
    model_tags,
    parse_model_params,
)

import_submodules(__name__)

__all__ = ["MODELS", "Classifier", "build_model", "check_model", "model_tags", "parse_model_params"]
