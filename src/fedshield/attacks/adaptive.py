"""Adaptive attacks on the root-data defenses (FLTrust, BR-DRAG), after the adaptive attack
of Cao, Fang, Liu & Gong (NDSS 2021, "FLTrust", §V-D), under two threat models.

Cao et al. put FLTrust's rule into Fang et al.'s framework: the attackers choose their
uploads g′_i = ‖r‖·e_i (e_i unit vectors: FLTrust rescales every upload to ‖r‖ anyway) to
maximise the directed deviation sᵀ(g − g′) of the aggregate g′ from the before-attack
aggregate g, s = sign(g), and solve it by gradient ascent on the e_i. We solve the same
problem through the configured rule as a black box:

for a fixed cosine cos φ = ⟨e, r̂⟩ (which fixes FLTrust's trust score ReLU(cos φ) and
BR-DRAG's λ = c(1 − cos φ)), both rules' aggregates are affine in e with a non-negative
factor, so the best e is the unit vector of that cosine closest to −s:
e(φ) = cos φ · r̂ + sin φ · û, û the unit component of −s orthogonal to r̂. We search φ
over [0, π] (a grid of ``angles`` points, then ``refine`` bisection steps around the best),
every attacker uploading ``scale``·‖r‖·e(φ*). The search calls the rule, so the same attack
runs against any rule (a plugin reference rule, or a rule without a reference, where it is
simply a direction search).

The two threat models (docs/security.md):

* ``adaptive_root`` — the attackers know the server's root update r^t (tag
  ``needs_reference``: the round loop computes r^t and passes it) and every update of the
  round, as Cao et al. assume. With no server reference (a rule without one) they fall
  back to the estimate below.
* ``adaptive_root_est`` — the attackers know only their own data: they estimate r^t by
  the mean of their own honest updates (trained like the root update: U local steps from
  θ^t on data from the same task) and simulate the rule on their own honest updates in
  place of the benign ones (Fang et al.'s partial knowledge). Not omniscient.
"""

from __future__ import annotations

import math
from typing import Any, Literal

import torch
from pydantic import Field
from torch import Tensor

from fedshield.attacks._common import CohortAttack, Ctx, Rng, with_rows
from fedshield.attacks._oracle import RuleOracle, directed, distance
from fedshield.attacks.base import ATTACKS, AttackContext
from fedshield.core.params import Params


class AdaptiveRootParams(Params):
    angles: int = Field(16, ge=2, description="grid points of the angle φ to r over [0, π]")
    refine: int = Field(6, ge=0, description="bisection steps around the best grid angle")
    scale: float = Field(1.0, gt=0.0, description="upload norm as a multiple of ‖r‖")
    objective: Literal["directed", "distance"] = Field(
        "directed",
        description="directed: Fang/Cao's sᵀ(g − g′); distance: ‖g′ − g‖ (ByzFL's Optimal_*)",
    )


def unit_directions(r: Tensor, s: Tensor) -> tuple[Tensor, Tensor] | None:
    """(r̂, û): r normalised and the unit component of −s orthogonal to it (float64); None
    when ‖r‖ = 0. û = 0 when −s is parallel to r (only φ ∈ {0, π} then differ)."""
    r64, s64 = r.double(), s.double()
    rn = torch.linalg.vector_norm(r64)
    if not bool(rn > 0) or not bool(torch.isfinite(rn)):
        return None
    r_hat = r64 / rn
    u = -s64 + (s64 @ r_hat) * r_hat
    un = torch.linalg.vector_norm(u)
    u_hat = u / un if bool(un > 0) else torch.zeros_like(u)
    return r_hat, u_hat


def angle_search(objective: Any, angles: int, refine: int) -> float:
    """argmax of ``objective(φ)`` over [0, π]: a grid, then ``refine`` steps trying the
    best ± half the previous step (first best wins ties, so φ = 0 — an honest-looking
    upload along r — is kept when nothing does better)."""
    step = math.pi / (angles - 1)
    best_phi, best = 0.0, -math.inf
    for k in range(angles):
        value = objective(k * step)
        if value > best:
            best_phi, best = k * step, value
    for _ in range(refine):
        step /= 2
        for phi in (best_phi - step, best_phi + step):
            if 0.0 <= phi <= math.pi:
                value = objective(phi)
                if value > best:
                    best_phi, best = phi, value
    return best_phi


class _AdaptiveRoot(CohortAttack):
    params_schema = AdaptiveRootParams
    needs_rule = True
    angles: int
    refine: int
    scale: float
    objective: str

    def __init__(self, **params: Any) -> None:
        super().__init__(**params)
        #: φ chosen in the last call (radians; None before the first call).
        self.last_angle: float | None = None
        #: True when the last call used the server's r^t, False when it estimated it.
        self.last_known: bool | None = None

    def _cohort(
        self, updates: Tensor, mask: Tensor, context: AttackContext | None
    ) -> tuple[Tensor, Tensor, Tensor, AttackContext]:
        """(simulated before-attack rows, their Byzantine mask, r, context to run the rule
        with) for this threat model."""
        raise NotImplementedError

    def forget(self) -> None:
        self.last_angle = None

    def craft(self, updates: Tensor, mask: Tensor, generator: Rng, context: Ctx) -> Tensor:
        rows, sim_mask, r, ctx = self._cohort(updates, mask, context)
        oracle = RuleOracle(ctx)
        before = oracle(rows)
        if before is None or not bool(torch.isfinite(before).all()):
            before = rows.mean(dim=0)
        s = torch.sign(before)
        dirs = unit_directions(r, s)
        if dirs is None:  # no reference direction at all: nothing to hide behind
            self.last_angle = None
            return with_rows(updates, mask, torch.zeros_like(updates[0]))
        r_hat, u_hat = dirs
        norm = self.scale * float(torch.linalg.vector_norm(r.double()))

        def craft(phi: float) -> Tensor:
            return (norm * (math.cos(phi) * r_hat + math.sin(phi) * u_hat)).to(updates.dtype)

        def value(phi: float) -> float:
            out = oracle(with_rows(rows, sim_mask, craft(phi)))
            if self.objective == "directed":
                return directed(out, before, s)
            return distance(out, before)

        phi = angle_search(value, self.angles, self.refine)
        self.last_angle = phi
        return with_rows(updates, mask, craft(phi))


def _own_estimate(
    updates: Tensor, mask: Tensor, context: AttackContext | None
) -> tuple[Tensor, Tensor, Tensor, AttackContext]:
    """Partial knowledge: the attackers' own honest rows stand in for the benign ones, r̂
    their mean; the simulated cohort is [own rows; as many crafted rows], uniform weights."""
    own = updates[mask]
    r_hat = own.mean(dim=0)
    rows = torch.cat([own, own])
    sim_mask = torch.zeros(rows.shape[0], dtype=torch.bool, device=rows.device)
    sim_mask[own.shape[0] :] = True
    rule = context.rule if context is not None else None
    return rows, sim_mask, r_hat, AttackContext(rule=rule, reference=r_hat)


@ATTACKS.register(
    "adaptive_root", tags=["kind=update", "omniscient", "needs_rule", "needs_reference"]
)
class AdaptiveRoot(_AdaptiveRoot):
    """Cao et al. 2021's adaptive attack on root-data defenses, attackers knowing r^t and all
    updates.

    Uploads ‖r‖·e(φ*), e(φ) = cos φ·r̂ + sin φ·û with φ* maximising the directed deviation
    of the configured rule's aggregate (module docstring). The round loop passes the
    server's r^t (tag ``needs_reference``); without one the attackers estimate it by the
    mean of their own honest updates (``last_known`` says which)."""

    needs_reference = True

    def _cohort(
        self, updates: Tensor, mask: Tensor, context: AttackContext | None
    ) -> tuple[Tensor, Tensor, Tensor, AttackContext]:
        ref = context.reference if context is not None else None
        self.last_known = ref is not None
        if ref is None:
            ref = updates[mask].mean(dim=0)
            context = AttackContext(
                rule=context.rule if context is not None else None,
                weights=context.weights if context is not None else None,
                reference=ref,
            )
        ref = ref.to(device=updates.device, dtype=updates.dtype)
        return updates, mask, ref, context  # type: ignore[return-value]


@ATTACKS.register("adaptive_root_est", tags=["kind=update", "needs_rule"])
class AdaptiveRootEstimated(_AdaptiveRoot):
    """The adaptive root-data attack with r^t and the benign updates estimated from the
    attackers' own data.

    As ``adaptive_root``, but the attackers never see r^t nor a benign update: r̂ is the
    mean of their own honest updates and the rule is simulated on their own updates in
    place of the benign ones (module docstring)."""

    def _cohort(
        self, updates: Tensor, mask: Tensor, context: AttackContext | None
    ) -> tuple[Tensor, Tensor, Tensor, AttackContext]:
        self.last_known = False
        return _own_estimate(updates, mask, context)


__all__ = ["AdaptiveRoot", "AdaptiveRootEstimated", "angle_search", "unit_directions"]
