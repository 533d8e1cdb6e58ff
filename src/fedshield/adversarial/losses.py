"""Attack objectives (maximised) on logits (FedCART paper).

Objectives are *summed* over the batch, as in the reference PGD-AT/TRADES/MART code: the
sign step is invariant to the reduction, and a sum avoids the per-sample gradient shrinking
with the batch size (which, for large batches, can underflow to an exact zero sign).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import Tensor

from fedshield.errors import ConfigError

Objective = Callable[[Tensor, Tensor], Tensor]
"""``objective(logits, y) -> scalar`` to be maximised by the attack."""


def ce_loss(logits: Tensor, y: Tensor) -> Tensor:
    """Cross-entropy of the true label (untargeted PGD / FGSM objective)."""
    return F.cross_entropy(logits, y, reduction="sum")


def cw_margin_loss(logits: Tensor, y: Tensor, kappa: float = 50.0) -> Tensor:
    """Carlini–Wagner margin objective for CW∞ (κ = 50: the usual confidence margin; the FedCART
    paper names CW without one).

    Per sample ``min(max_{j≠y} z_j − z_y, κ)`` written as ``−relu(z_y − max_{j≠y} z_j + κ)``
    up to a constant, which is the ``cwloss`` of the MART/FAT reference code: the gradient
    pushes the best wrong logit above the true one until the margin exceeds κ.
    """
    true = logits.gather(1, y[:, None]).squeeze(1)
    # Mask the true class with -inf so it can never be the "best other" logit.
    others = logits.scatter(1, y[:, None], float("-inf")).amax(dim=1)
    return -torch.relu(true - others + kappa).sum()


def cw_margin(logits: Tensor, y: Tensor) -> Tensor:
    """Per-sample margin ``z_y − max_{j≠y} z_j`` (positive ⇔ correctly classified)."""
    true = logits.gather(1, y[:, None]).squeeze(1)
    return true - logits.scatter(1, y[:, None], float("-inf")).amax(dim=1)


def resolve_objective(loss: str | Objective, *, kappa: float = 50.0) -> Objective:
    """Map ``"ce"`` / ``"cw"`` / a callable to an objective; callables may return per-sample
    values, which are summed."""
    if callable(loss):
        return lambda logits, y: loss(logits, y).sum()
    if loss == "ce":
        return ce_loss
    if loss == "cw":
        return lambda logits, y: cw_margin_loss(logits, y, kappa)
    raise ConfigError(f"attack loss must be 'ce', 'cw' or a callable, got {loss!r}")


__all__ = ["Objective", "ce_loss", "cw_margin", "cw_margin_loss", "resolve_objective"]
