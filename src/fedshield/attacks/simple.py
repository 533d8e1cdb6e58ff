"""Non-omniscient update attacks (DRAG paper, Sec. I-A): ``noise``, ``sign_flip``, ``scaling``.

Sec. I-A of the DRAG paper lists noise injection and sign flipping; scaling (model replacement style
boosting, k·g) is in the standard set. Each rewrites only the Byzantine rows.
"""

from __future__ import annotations

import torch
from pydantic import Field
from torch import Tensor

from fedshield.attacks._common import CohortAttack, Ctx, Rng, with_rows
from fedshield.attacks.base import ATTACKS
from fedshield.core.params import Params


class NoiseParams(Params):
    sigma: float = Field(1.0, gt=0.0, description="standard deviation σ of the N(0, σ²I) upload")


class FactorParams(Params):
    k: float = Field(1.0, gt=0.0, description="factor k applied to the attacker's own update")


class ScalingParams(Params):
    k: float = Field(
        10.0, gt=0.0, description="boost factor k (10: our choice, the usual factor vs. FedAvg)"
    )


@ATTACKS.register("noise", tags=["kind=update"])
class Noise(CohortAttack):
    """Upload a fresh N(0, σ²I) draw instead of the update (the DRAG paper's noise injection, Sec.
    I-A).

    The draw comes from the ``generator`` the engine passes, so a run stays a pure
    function of (config, seed). Each attacker gets its own independent vector.
    """

    params_schema = NoiseParams
    needs_own_update = False  # the honest update is discarded, so the engine may skip it

    sigma: float

    def craft(self, updates: Tensor, mask: Tensor, generator: Rng, context: Ctx) -> Tensor:
        f = int(mask.sum())
        # Draw on the generator's own device (a CPU generator cannot feed a CUDA randn) and
        # move afterwards: the values then depend only on the generator state, not on where
        # the updates live.
        device = generator.device if generator is not None else updates.device
        draw = torch.randn(
            (f, updates.shape[1]), generator=generator, dtype=updates.dtype, device=device
        )
        return with_rows(updates, mask, draw * self.sigma)


@ATTACKS.register("sign_flip", tags=["kind=update"])
class SignFlip(CohortAttack):
    """Upload −k·g, g the attacker's own honest update (the DRAG paper's sign flipping, Sec. I-A).

    Note: ByzFL's ``SignFlipping`` is omniscient (−mean of the honest vectors); ours follows
    the seed and negates the attacker's own update. The two coincide for one input row.
    """

    params_schema = FactorParams

    k: float

    def craft(self, updates: Tensor, mask: Tensor, generator: Rng, context: Ctx) -> Tensor:
        return with_rows(updates, mask, updates[mask] * -self.k)


@ATTACKS.register("scaling", tags=["kind=update"])
class Scaling(CohortAttack):
    """Upload k·g, the attacker's own honest update boosted by k (model-replacement style).

    The default k = 10 is our choice: the usual boosting factor against plain averaging.
    """

    params_schema = ScalingParams

    k: float

    def craft(self, updates: Tensor, mask: Tensor, generator: Rng, context: Ctx) -> Tensor:
        return with_rows(updates, mask, updates[mask] * self.k)
