"""Helpers shared by the update attacks: input checks, the benign-row statistics and
:class:`CohortAttack`, the call every attack on the cohort's rows shares.

Parameters are validated by each attack's schema (:mod:`fedshield.attacks.base`).
"""

from __future__ import annotations

from typing import TypeAlias

import torch
from torch import Tensor

from fedshield.attacks.base import AttackContext, UpdateAttack

#: what :meth:`CohortAttack.craft` gets besides the rows: the round's attack generator and
#: the rule's context (None for attacks without ``needs_rule``)
Rng: TypeAlias = torch.Generator | None
Ctx: TypeAlias = AttackContext | None


def check_inputs(updates: Tensor, byzantine: Tensor) -> Tensor:
    """Validate the ``[S, d]`` matrix and ``[S]`` mask; return the mask as bool on ``updates``'
    device (the engine may build it on the CPU while the updates live on the GPU)."""
    if updates.dim() != 2 or not updates.is_floating_point():
        raise ValueError(
            f"updates must be a floating [S, d] tensor, got {updates.dtype} "
            f"of shape {tuple(updates.shape)}"
        )
    if byzantine.shape != (updates.shape[0],) or byzantine.dtype != torch.bool:
        raise ValueError(
            f"byzantine must be a bool tensor of shape [{updates.shape[0]}], got "
            f"{byzantine.dtype} of shape {tuple(byzantine.shape)}"
        )
    return byzantine.to(updates.device)


def honest_pool(updates: Tensor, mask: Tensor) -> Tensor:
    """The rows an omniscient attacker computes its statistics from: the benign ones.

    With no benign row in the cohort (every selected worker is Byzantine) there is nothing
    to imitate, so we fall back to all rows, i.e. the attackers' own honest updates. That
    is our choice (the papers assume a benign majority); it keeps the round well defined.
    """
    benign = updates[~mask]
    return benign if benign.shape[0] > 0 else updates


def coord_std(rows: Tensor) -> Tensor:
    """Coordinate-wise *unbiased* std (``torch.std``'s default, as in the ALIE and NDSS'21
    reference code and in ByzFL). A single row has no spread: we return zeros rather than
    the NaN that ``correction=1`` would give, so one benign worker cannot poison θ with NaN."""
    if rows.shape[0] < 2:
        return torch.zeros_like(rows[0])
    return rows.std(dim=0)


def with_rows(updates: Tensor, mask: Tensor, rows: Tensor) -> Tensor:
    """A copy of ``updates`` whose Byzantine rows are ``rows`` (``[f, d]`` or one ``[d]``
    vector broadcast to every attacker); benign rows are copied unchanged."""
    out = updates.clone()
    out[mask] = rows.to(dtype=updates.dtype, device=updates.device)
    return out


class CohortAttack(UpdateAttack):
    """An update attack crafting the Byzantine rows from the round's cohort: the call
    checks the inputs and, with no attacker selected, returns the cohort unchanged (after
    :meth:`forget`); else :meth:`craft` gives the new matrix. ``context`` reaches attacks
    with ``needs_rule`` (the round loop passes none to the others)."""

    def __call__(
        self,
        updates: Tensor,
        byzantine: Tensor,
        *,
        generator: torch.Generator | None = None,
        context: AttackContext | None = None,
    ) -> Tensor:
        mask = check_inputs(updates, byzantine)
        if not bool(mask.any()):
            self.forget()
            return updates.clone()
        return self.craft(updates, mask, generator, context)

    def forget(self) -> None:
        """Clear what the last call recorded (``last_tau``, ...): no attacker this round."""

    def craft(self, updates: Tensor, mask: Tensor, generator: Rng, context: Ctx) -> Tensor:
        """The ``[S, d]`` matrix with the rows of ``mask`` (at least one) crafted."""
        raise NotImplementedError
