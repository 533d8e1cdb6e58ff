"""The grid of client algorithms × model families that the conformance and equivalence
tests run, derived from the registries: a new algorithm is covered by its registration."""

from __future__ import annotations

from typing import Any

from fedshield.registry import Entry

#: a small model of every family, for 1×8×8 inputs and 10 classes (``digits``)
SMALL_MODELS: dict[str, tuple[str, dict[str, Any]]] = {
    "mlp": ("mlp", {"hidden": 16}),
    "cnn_small": ("cnn_small", {}),  # BatchNorm: buffers travel with the update
    "dual_head": ("dual_head", {"backbone": "mlp", "hidden": 16}),
    "multi_exit": ("eevit", {"patch_size": 4, "embed_dim": 16, "num_heads": 2, "depth": 3}),
}


def families(entry: Entry[Any]) -> list[str]:
    """The :data:`SMALL_MODELS` a client algorithm declares it trains (``needs_model``)."""
    needs = entry.tag_values("needs_model")
    if "multi_exit" in needs:
        return ["multi_exit"]
    if "dual_head" in needs:
        return ["dual_head"]
    return ["mlp", "cnn_small", "dual_head"]  # any classifier, the dual-head one included


def server_for(client: str) -> str:
    """The server algorithm whose broadcast ``client`` needs (the one naming it in its
    ``needs_client`` tag), else ``fedavg``."""
    from fedshield.algorithms.server import SERVER_ALGORITHMS

    for entry in SERVER_ALGORITHMS.entries():
        if entry.is_package and client in entry.tag_values("needs_client"):
            return entry.name
    return "fedavg"


__all__ = ["SMALL_MODELS", "families", "server_for"]
