"""FedAvg and every "aggregate then step" server (SPEC §1, §5).

θ^{t+1} = θ^t + η_g · AGG({g_m}, {n_m}). With the ``mean`` rule this is FedAvg
(sample-weighted, or the seed's uniform 1/S form); with ``krum``, ``median``, ... it is the
corresponding Byzantine defense; rules that need a reference (``fltrust``, ``brdrag``) get
the root-data direction r^t = θ^{t,U}_root − θ^t (SPEC §3, eqs. 12–13).
"""

from __future__ import annotations

import torch
from torch import Tensor

from fedshield.aggregators._ops import ref_geometry, rho_ratios
from fedshield.algorithms.server.base import (
    SERVER_ALGORITHMS,
    ServerAlgorithm,
    ServerServices,
    ServerStep,
    State,
    client_weights,
    mean_buffers,
    stack_deltas,
)
from fedshield.core.context import ClientUpdate, RoundContext


def coverage_mean(deltas: Tensor, weights: Tensor | None, masks: Tensor) -> Tensor:
    """Per-parameter weighted mean over the clients that cover it (SPEC §8, eq. 15);
    parameters nobody covers get a zero update (θ unchanged)."""
    w = masks.to(deltas.dtype)
    if weights is not None:
        w = w * weights.to(deltas.dtype)[:, None]
    num = (w * deltas).sum(0)
    den = w.sum(0)
    return num / den.clamp_min(1e-12) * (den > 0)


def benign_geometry(
    deltas: Tensor, ref: Tensor, updates: list[ClientUpdate], ctx: RoundContext
) -> dict[str, float]:
    """Seed 000 Fig. 10 quantities over the benign rows: ρ_m = ‖r‖/‖g_m‖ (min, max) and the
    mean cos(g_m, r). The rule's own ``agg/*`` diagnostics cover every row."""
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
        }
    return out


@SERVER_ALGORITHMS.register("fedavg")
class FedAvg(ServerAlgorithm):
    """Aggregate pseudo-gradients with the configured rule, then θ += η_g · Δ."""

    def reference(
        self,
        params: Tensor,
        buffers: Tensor,
        state: State,
        deltas: Tensor,
        ctx: RoundContext,
        services: ServerServices,
    ) -> Tensor | None:
        """The reference direction r^t handed to the rule (root-data direction by default)."""
        if not self.aggregator.needs_reference:
            return None
        return services.root_update(params, buffers, ctx).delta

    def aggregate(
        self,
        params: Tensor,
        buffers: Tensor,
        state: State,
        updates: list[ClientUpdate],
        ctx: RoundContext,
        services: ServerServices,
    ) -> tuple[Tensor, Tensor, dict[str, float]]:
        """(Δ, aggregated buffers, diagnostics) for this round's updates."""
        deltas = stack_deltas(updates)
        weights = client_weights(updates, self.weighting, deltas)
        metrics: dict[str, float] = {}
        masks = [u.mask for u in updates]
        if any(m is not None for m in masks):
            full = deltas.new_ones(deltas.shape[1], dtype=torch.bool)
            stacked = torch.stack([full if m is None else m for m in masks])
            agg = coverage_mean(deltas, weights, stacked)
        else:
            ref = self.reference(params, buffers, state, deltas, ctx, services)
            if ref is not None:
                metrics.update(benign_geometry(deltas, ref, updates, ctx))
            agg, diag = self.aggregator.aggregate(deltas, weights, reference=ref)
            metrics.update(diag)
        return agg, mean_buffers(updates, weights), metrics

    def update(
        self,
        params: Tensor,
        buffers: Tensor,
        state: State,
        updates: list[ClientUpdate],
        ctx: RoundContext,
        services: ServerServices,
    ) -> ServerStep:
        agg, new_buffers, metrics = self.aggregate(params, buffers, state, updates, ctx, services)
        return ServerStep(params + self.lr * agg, new_buffers, state, metrics)


@SERVER_ALGORITHMS.register("brdrag")
class BRDRAG(FedAvg):
    """BR-DRAG (SPEC §3): root-data reference + the ``brdrag`` calibration (eq. 15)."""

    default_aggregator = "brdrag"


@SERVER_ALGORITHMS.register("fltrust")
class FLTrust(FedAvg):
    """FLTrust (Cao et al. 2021; SPEC §5): root-data reference + trust-weighted mean."""

    default_aggregator = "fltrust"
