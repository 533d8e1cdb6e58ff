"""FedAvg and every "aggregate then step" server (FedAvg, McMahan et al. 2017; the
Byzantine defenses of the DRAG paper, Sec. VI-B; docs/defenses.md).

θ^{t+1} = θ^t + η_g · AGG({g_m}, {n_m}). With the ``mean`` rule this is FedAvg
(sample-weighted, or the DRAG paper's uniform 1/S form); with ``krum``, ``median``, ... it is the
corresponding Byzantine defense; rules that need a reference (``fltrust``, ``brdrag``) get
the root-data direction r^t = θ^{t,U}_root − θ^t (DRAG paper, eqs. 12–13).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

import torch
from torch import Tensor

from fedshield.aggregators._ops import ref_geometry, rho_ratios
from fedshield.algorithms.server.aggregation import aggregate_covered
from fedshield.algorithms.server.base import (
    SERVER_ALGORITHMS,
    ServerAlgorithm,
    ServerRound,
    ServerStep,
    State,
)
from fedshield.core.context import ClientUpdate, RoundContext

log = logging.getLogger("fedshield")


def coverage_mean(deltas: Tensor, weights: Tensor | None, masks: Tensor) -> Tensor:
    """Per-parameter weighted mean over the clients that cover it (early-exit ViT paper, eq. 15);
    parameters nobody covers get a zero update (θ unchanged)."""
    w = masks.to(deltas.dtype)
    if weights is not None:
        w = w * weights.to(deltas.dtype)[:, None]
    num = (w * deltas).sum(0)
    den = w.sum(0)
    return num / den.clamp_min(1e-12) * (den > 0)


def benign_geometry(
    deltas: Tensor,
    ref: Tensor,
    updates: list[ClientUpdate],
    ctx: RoundContext,
    c: float | None = None,
) -> dict[str, float]:
    """The DRAG paper's Fig. 10 quantities over the benign rows B: min/max of ρ_m = ‖r‖/‖g_m‖, the
    mean cos(g_m, r), the Assumption 4 quantity (1/(S(1 − w))) Σ_{m∈B} cos(g_m, r) ρ_m —
    the mean of cos·ρ over B, since S(1 − w) = |B| — and, for the DoD rules (``c`` given),
    the mean λ_m = c(1 − cos) over B. The rule's own ``agg/*`` diagnostics cover every row."""
    geo = ref_geometry(deltas, ref)
    rho, has_rho = rho_ratios(geo)
    benign = torch.tensor([u.client_id not in ctx.byzantine for u in updates], device=deltas.device)
    out = {"agg/ref_norm": float(geo.ref_norm)}
    ok = benign & has_rho & geo.defined
    if bool(ok.any()):
        out |= {
            "agg/benign_rho_min": float(rho[ok].min()),
            "agg/benign_rho_max": float(rho[ok].max()),
            "agg/benign_mean_cos": float(geo.cos[ok].mean()),
            "agg/benign_mean_cos_rho": float((geo.cos[ok] * rho[ok]).mean()),
        }
        if c is not None:
            out["agg/benign_mean_lambda"] = float((c * (1.0 - geo.cos[ok])).mean())
    return out


@dataclass
class Aggregated:
    """A round's aggregate Δ, the new buffers, diagnostics and server-state entries."""

    delta: Tensor
    buffers: Tensor
    metrics: dict[str, float] = field(default_factory=dict)
    state: State = field(default_factory=dict)

    def to_step(
        self,
        rnd: ServerRound,
        params: Tensor,
        state: State | None = None,
        metrics: dict[str, float] | None = None,
    ) -> ServerStep:
        """θ^{t+1} = ``params`` with these buffers; the round's state updated by this
        aggregate's entries, then ``state``; these metrics, then ``metrics``."""
        new_state = rnd.state | self.state | (state or {})
        return ServerStep(params, self.buffers, new_state, self.metrics | (metrics or {}))


@SERVER_ALGORITHMS.register("fedavg", tags=["central_dp"])
class FedAvg(ServerAlgorithm):
    """Aggregate pseudo-gradients with the configured rule, then θ += η_g · Δ.

    A subclass changes what differs: the reference handed to the rule (:meth:`reference`)
    or the step taken from the aggregate (:meth:`step`)."""

    def reference(self, rnd: ServerRound) -> Tensor | None:
        """The reference direction r^t handed to the rule (root-data direction by default)."""
        if not self.aggregator.needs_reference:
            return None
        return rnd.root_update().delta

    def aggregate(self, rnd: ServerRound, ref: Tensor | None = None) -> Aggregated:
        """The configured rule on the screened updates: on the whole cohort, or per
        coverage group when clients upload masks (docs/security.md §2); buffers by the rule's field
        counterpart; the centre of Centered Clipping carried in server state. Under
        ``[privacy.central]`` (docs/privacy.md): clip every row (and r) to C → the rule → Gaussian
        noise calibrated to the rule's sensitivity (:mod:`fedshield.privacy.central`).
        ``ref``: the reference already formed this round (default: :meth:`reference`)."""
        updates, ctx, state = rnd.updates, rnd.ctx, rnd.state
        deltas = rnd.deltas()
        dp = getattr(self, "central_dp", None)
        dp_metrics: dict[str, float] = {}
        if dp is not None:
            deltas, dp_metrics = dp.clip_updates(deltas)
        weights = self.weights(updates, deltas)
        masks = None
        if any(u.mask is not None for u in updates):
            full = deltas.new_ones(deltas.shape[1], dtype=torch.bool)
            masks = torch.stack([full if u.mask is None else u.mask for u in updates])
        if ref is None:
            ref = self.reference(rnd)
        if dp is not None and ref is not None:
            ref = dp.clip_reference(ref)  # BR-DRAG/FLTrust rescale rows to ‖r‖
        center = state.get("center")
        if ref is None and center is not None:
            ref = center  # Centered Clipping: the rule's reference is its centre
        outcome = aggregate_covered(self.aggregator, deltas, weights, masks, ref)
        if dp is not None:  # noised before anything (the next centre) is derived from it
            outcome.delta, noise_metrics = dp.privatize(outcome.delta, len(updates), ctx, center)
            dp_metrics |= noise_metrics
        metrics = dict(outcome.metrics) | dp_metrics
        if outcome.degraded:
            metrics["sys/degraded"] = float(outcome.degraded)
        if outcome.skipped:
            # θ unchanged (no masks: the one group is the cohort) or only some blocks.
            key = "sys/skipped" if masks is None else "sys/skipped_groups"
            metrics[key] = float(outcome.skipped)
            log.warning(
                "round %d: %s could not run on %d row(s) (%d group(s)); those parameters "
                "are unchanged this round",
                ctx.round,
                type(self.aggregator).__name__,
                len(updates),
                outcome.skipped,
            )
        if self.aggregator.needs_reference and ref is not None and masks is None:
            metrics.update(
                benign_geometry(deltas, ref, updates, ctx, getattr(self.aggregator, "c", None))
            )
        new_state: State = {}
        if center is not None:
            # The next centre: this round's aggregate where there was one (Karimireddy et al. 2021).
            cov = outcome.covered
            new_state["center"] = (
                outcome.delta if cov is None else torch.where(cov, outcome.delta, center)
            )
            if cov is None and outcome.skipped:
                new_state["center"] = center
        new_buffers = self.aggregate_buffers(rnd.buffers, updates, weights)
        return Aggregated(outcome.delta, new_buffers, metrics, new_state)

    def update(self, rnd: ServerRound) -> ServerStep:
        return self.step(rnd, self.aggregate(rnd))

    def step(self, rnd: ServerRound, agg: Aggregated) -> ServerStep:
        """The step from the round's aggregate: θ^{t+1} = θ^t + η_g Δ."""
        return agg.to_step(rnd, rnd.params + self.lr * agg.delta)


@SERVER_ALGORITHMS.register("brdrag", tags=["needs_root", "central_dp"])
class BRDRAG(FedAvg):
    """BR-DRAG (DRAG paper, Sec. IV): root-data reference + the ``brdrag`` calibration (eq. 15)."""

    default_aggregator = "brdrag"


@SERVER_ALGORITHMS.register("fltrust", tags=["needs_root", "central_dp"])
class FLTrust(FedAvg):
    """FLTrust (Cao et al., NDSS 2021): root-data reference + trust-weighted mean."""

    default_aggregator = "fltrust"
