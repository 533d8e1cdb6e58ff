"""BR-DRAG with the per-round DoD scale c^t of the DRAG paper's Theorem 2 (``brdrag_ct``).

Theorem 2's first case takes c^t = w^t / (w^t − x^t) ∈ [1/2, 1], w^t the round's Byzantine
share and x^t a sum over the malicious rows of their cosine with the trusted reference.
The DRAG paper's text omits the definition (its eq. 23); our reading, marked as such, is

    x^t = (1/S) Σ_{m∈A^t} cos(g_m^t, r^t)  ∈ [−w^t, w^t],

so c^t falls from 1 (attackers orthogonal or aligned with r, x^t ≥ 0, clipped to 1) to 1/2
(every attacker exactly opposite r, x^t = −w^t). The server does not know A^t:

* ``c_rule = "estimate"`` (deployable): A^t = the rows with cos(g_m, r) < 0, the ones eq. 15
  turns towards r the most;
* ``c_rule = "oracle"``: A^t = the selected Byzantine workers, which only the simulator
  knows (a check of the theorem's condition, not a defense).

With w^t = 0 (no attacker, or no negative cosine) c^t = ``c_min`` = 1/2, BR-DRAG's constant
default. c^t is clipped to [``c_min``, ``c_max``] and logged as ``agg/c_t``. The calibration
itself is the ``brdrag`` rule (eq. 15) with c = c^t for the round.
"""

from __future__ import annotations

import copy
from typing import Any, Literal

import torch
from pydantic import Field, model_validator
from torch import Tensor

import fedshield.aggregators  # noqa: F401  (registers the rules)
from fedshield.aggregators._ops import ref_geometry
from fedshield.aggregators.base import AGGREGATORS, Aggregator
from fedshield.algorithms.server.base import SERVER_ALGORITHMS, ServerRound, ServerStep
from fedshield.algorithms.server.fedavg import BRDRAG
from fedshield.core.params import Params
from fedshield.errors import ConfigError
from fedshield.registry import tags_of


class BRDragCtParams(Params):
    c_rule: Literal["estimate", "oracle"] = Field(
        "estimate",
        description="Who counts as attacker in c^t: rows with a negative cosine to r "
        "('estimate') or the simulator's Byzantine workers ('oracle').",
    )
    c_min: float = Field(0.5, ge=0.0, description="Lower clip of c^t (the theorem's 1/2).")
    c_max: float = Field(1.0, ge=0.0, description="Upper clip of c^t (the theorem's 1).")

    @model_validator(mode="after")
    def _range(self) -> BRDragCtParams:
        if self.c_min > self.c_max:
            raise ValueError(f"c_min={self.c_min} exceeds c_max={self.c_max}")
        return self


def theorem_c(cos: Tensor, attacker: Tensor, c_min: float = 0.5, c_max: float = 1.0) -> float:
    """c^t = w / (w − x) clipped to [c_min, c_max], with w = |A|/S and
    x = (1/S) Σ_{m∈A} cos_m over the rows flagged in ``attacker``; c_min when A is empty."""
    s = cos.numel()
    w = float(attacker.sum()) / s if s else 0.0
    if w == 0.0:
        return c_min
    x = float(cos[attacker].double().sum()) / s
    c = w / (w - x) if w - x > 0 else c_max
    return min(max(c, c_min), c_max)


@SERVER_ALGORITHMS.register(
    "brdrag_ct", tags=["needs_root", "needs_aggregator=dod_scale"]
)
class BRDragCt(BRDRAG):
    """BR-DRAG whose DoD scale is the theorem's per-round c^t ∈ [1/2, 1] (DRAG paper, Thm. 2)."""

    params_schema = BRDragCtParams
    params: BRDragCtParams

    def __init__(self, aggregator: Aggregator, **kwargs: Any) -> None:
        super().__init__(aggregator, **kwargs)
        # The builder refuses a rule without the tag first; this guards direct library use.
        if "dod_scale" not in tags_of(aggregator):
            name = getattr(type(aggregator), "registry_name", type(aggregator).__name__)
            raise ConfigError(
                f"server.algorithm='brdrag_ct' sets the 'brdrag' rule's c every round; "
                f"server.aggregator must be 'brdrag', not {name!r}"
            )

    def update(self, rnd: ServerRound) -> ServerStep:
        p: BRDragCtParams = self.params
        ref = self.reference(rnd)  # the root-data direction, trained once this round
        assert ref is not None
        geo = ref_geometry(rnd.deltas(), ref)
        cos = torch.where(geo.defined, geo.cos, 1.0)  # a row without direction: as r itself
        if p.c_rule == "oracle":
            flagged = torch.tensor([u.client_id in rnd.ctx.byzantine for u in rnd.updates])
        else:
            flagged = cos < 0
        c_t = theorem_c(cos.cpu(), flagged.cpu(), p.c_min, p.c_max)
        run = copy.copy(self)  # servers own no mutable state: a copy runs this round's rule
        run.aggregator = AGGREGATORS.build("brdrag", c=c_t)
        step = run.step(rnd, run.aggregate(rnd, ref))
        step.metrics["agg/c_t"] = c_t
        step.metrics["agg/flagged"] = float(flagged.sum())
        return step


__all__ = ["BRDragCt", "BRDragCtParams", "theorem_c"]
