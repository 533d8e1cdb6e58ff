"""Data-poisoning attacks (DRAG paper, Sec. I-A; backdoors: docs/security.md §6): the client trains
honestly on poisoned data."""

from __future__ import annotations

from torch import Tensor

from fedshield.attacks.base import ATTACKS, DataAttack


@ATTACKS.register("label_flip", tags=["kind=data"])
class LabelFlip(DataAttack):
    """Train honestly on flipped labels l ↦ L − l − 1 for L classes (the DRAG paper's label
    flipping, Sec. I-A).

    Inputs are left untouched. A fixed permutation (0 ↔ L−1, 1 ↔ L−2, ...), so the poisoned
    client's updates stay plausible in norm and hard to spot, as the seed notes (§I-A). It
    has no parameters."""

    def poison(self, x: Tensor, y: Tensor, num_classes: int) -> tuple[Tensor, Tensor]:
        if isinstance(num_classes, bool) or not isinstance(num_classes, int) or num_classes < 1:
            raise ValueError(f"num_classes must be an int >= 1, got {num_classes!r}")
        if y.is_floating_point() or y.is_complex():
            raise ValueError(f"labels must be an integer tensor, got {y.dtype}")
        if y.numel() and (int(y.min()) < 0 or int(y.max()) >= num_classes):
            raise ValueError(
                f"labels must lie in [0, {num_classes - 1}], got range "
                f"[{int(y.min())}, {int(y.max())}]"
            )
        # A new tensor: the caller's dataset may be shared with the benign copy of the data.
        return x, (num_classes - 1) - y
