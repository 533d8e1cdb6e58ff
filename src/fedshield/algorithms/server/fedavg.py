"""FedAvg and every "aggregate then step" server (SPEC §1, §5).

θ^{t+1} = θ^t + η_g · AGG({g_m}, {n_m}). With the ``mean`` rule this is FedAvg
(sample-weighted, or the seed's uniform 1/S form); with ``krum``, ``median``, ... it is the
corresponding Byzantine defense; rules that need a reference (``fltrust``, ``brdrag``) get
the root-data direction r^t = θ^{t,U}_root − θ^t (SPEC §3, eqs. 12–13).
"""

from __future__ import annotations

import torch
from torch import Tensor

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
from fedshield.sim.context import ClientUpdate, RoundContext


def coverage_mean(deltas: Tensor, weights: Tensor | None, masks: Tensor) -> Tensor:
    """Per-parameter weighted mean over the clients that cover it (SPEC §8, eq. 15);
    parameters nobody covers get a zero update (θ unchanged)."""
    w = masks.to(deltas.dtype)
    if weights is not None:
        w = w * weights.to(deltas.dtype)[:, None]
    num = (w * deltas).sum(0)
    den = w.sum(0)
    return num / den.clamp_min(1e-12) * (den > 0)


@SERVER_ALGORITHMS.register("fedavg")
class FedAvg(ServerAlgorithm):
    """Aggregate pseudo-gradients with the configured rule, then θ += η_g · Δ."""

    def update(
        self,
        params: Tensor,
        buffers: Tensor,
        state: State,
        updates: list[ClientUpdate],
        ctx: RoundContext,
        services: ServerServices,
    ) -> ServerStep:
        deltas = stack_deltas(updates)
        weights = client_weights(updates, self.weighting, deltas)
        metrics: dict[str, float] = {}
        masks = [u.mask for u in updates]
        if any(m is not None for m in masks):
            full = deltas.new_ones(deltas.shape[1], dtype=bool)
            stacked = [full if m is None else m for m in masks]
            agg = coverage_mean(deltas, weights, torch.stack(stacked))
        else:
            reference = None
            if self.aggregator.needs_reference:
                root = services.root_update(params, buffers, ctx)
                reference = root.delta
                metrics["agg/ref_norm"] = float(reference.norm())
            agg, diag = self.aggregator.aggregate(deltas, weights, reference=reference)
            metrics.update(diag)
        return ServerStep(
            params=params + self.lr * agg,
            buffers=mean_buffers(updates, weights),
            state=state,
            metrics=metrics,
        )
