"""FedCART's dual-head model (SPEC §7, §9): a shared feature extractor r with a main
classifier h (trained by the clients) and an auxiliary classifier h' (re-trained by the
server on balanced virtual features, and the one used at inference).

``model(x)`` is always the inference model h'(r(x)), in train and eval mode alike, so
evaluation, robust evaluation and plain client rules all see r + h'; FedCART's client
reaches h explicitly through :meth:`DualHead.forward_main` / :meth:`DualHead.main_path`.

Parameter layout (relied on by the FedCART server, which only sees the flat vector):
``[r ..., h.weight, h.bias, h'.weight, h'.bias]`` — the two heads are the last four
parameter tensors, each head C·D + C entries.
"""

from __future__ import annotations

from typing import Any

from torch import Tensor, nn

from fedshield.errors import ConfigError
from fedshield.models.base import MODELS, Classifier


class DualHead(Classifier):
    """r → z ∈ R^D; ``main_head`` = h (training), ``head`` = h' (inference)."""

    def __init__(self, backbone: nn.Module, num_classes: int) -> None:
        super().__init__()
        head = getattr(backbone, "head", None)
        if not (hasattr(backbone, "forward_features") and isinstance(head, nn.Linear)):
            raise ConfigError(
                f"model 'dual_head' needs a backbone with forward_features and a linear head "
                f"(a fedshield Classifier), got {type(backbone).__name__}"
            )
        # The backbone's own head becomes h; an Identity takes its place so its parameters
        # are not registered twice and the trunk's come first in the flat vector.
        backbone.head = nn.Identity()
        self.backbone = backbone
        self.num_features = int(backbone.num_features)
        self.main_head = head
        self.head = nn.Linear(self.num_features, num_classes)

    @property
    def aux_head(self) -> nn.Linear:
        """h' (alias of ``head``: the Classifier interface's inference head)."""
        return self.head

    def forward_features(self, x: Tensor) -> Tensor:
        return self.backbone.forward_features(x)

    def forward_main(self, x: Tensor) -> Tensor:
        """h(r(x)): the training-time model that FedCART's adversarial examples attack."""
        return self.main_head(self.forward_features(x))

    def main_path(self) -> nn.Module:
        """(r, h) as a module, for attack functions that call ``model(x)``.

        The view reports this model's train/eval mode, so code that saves and restores the
        view's mode (eval-mode attacks) restores the model's own."""
        path = _MainPath(self)
        path.training = self.training  # attribute only: nn.Module.train() would recurse
        return path


class _MainPath(nn.Module):
    def __init__(self, model: DualHead) -> None:
        super().__init__()
        self.model = model

    def forward(self, x: Tensor) -> Tensor:
        return self.model.forward_main(x)


@MODELS.register("dual_head")
def dual_head(
    input_shape: tuple[int, int, int],
    num_classes: int,
    backbone: str = "cnn_small",
    **backbone_params: Any,
) -> DualHead:
    """FedCART dual head (r, h, h') around any registered backbone; other params go to it."""
    from fedshield.models.base import build_model

    if backbone == "dual_head":
        raise ConfigError("model.params.backbone cannot be 'dual_head' itself")
    net = build_model(backbone, input_shape, num_classes, **backbone_params)
    return DualHead(net, num_classes)
