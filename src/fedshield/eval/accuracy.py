"""Batched test-set evaluation of a classifier."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from fedshield.data.bundle import TensorData


@torch.no_grad()
def evaluate(
    model: nn.Module, data: TensorData, batch_size: int, device: torch.device
) -> dict[str, float]:
    """Top-1 accuracy and mean cross-entropy over ``data`` (model put in eval mode)."""
    was_training = model.training
    model.eval()
    correct = torch.zeros((), device=device)
    loss = torch.zeros((), device=device)
    n = len(data)
    for start in range(0, n, batch_size):
        x, y = data.batch(torch.arange(start, min(start + batch_size, n)), device)
        logits = model(x).float()
        loss += F.cross_entropy(logits, y, reduction="sum")
        correct += (logits.argmax(1) == y).sum()
    model.train(was_training)
    return {"acc": float(correct) / max(n, 1), "loss": float(loss) / max(n, 1)}
