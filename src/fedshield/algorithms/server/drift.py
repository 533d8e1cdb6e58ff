"""Drift-mitigating servers of seed 000: DRAG (SPEC §2), FedExP, FedACG, SCAFFOLD (SPEC §4)."""

from __future__ import annotations

from pydantic import Field
from torch import Tensor

from fedshield.algorithms.server.base import (
    SERVER_ALGORITHMS,
    ServerServices,
    ServerStep,
    State,
    stack_deltas,
)
from fedshield.algorithms.server.fedavg import FedAvg
from fedshield.core.context import ClientUpdate, Payload, RoundContext
from fedshield.core.params import Params
from fedshield.errors import ConfigError


class DragParams(Params):
    # Our default: α = 0.25 from the bundled-data sweep (docs/results/drag.md): 0.01 and 0.05
    # lag behind, 0.25 and 0.5 are best and within 1 point; the seed finds > 0.25 too large.
    alpha: float = Field(0.25, gt=0.0, lt=1.0, description="reference momentum α (eq. 8)")


@SERVER_ALGORITHMS.register("drag")
class DRAG(FedAvg):
    """DRAG: calibrate each g_m towards the momentum reference r^t (SPEC §2, eqs. 8–11).

    r^0 = (1/S) Σ g_m^0; r^t = (1 − α) r^{t−1} + α Δ^{t−1}. State ``ref`` holds the
    reference for the next round; it is broadcast so a client may calibrate locally."""

    params_schema = DragParams
    default_aggregator = "drag"

    def __init__(self, aggregator, **kwargs) -> None:  # noqa: ANN001, ANN003
        super().__init__(aggregator, **kwargs)
        if not aggregator.needs_reference:
            raise ConfigError(
                f"server.algorithm='drag' calibrates towards its momentum reference, so it needs "
                f"a reference-based server.aggregator (drag, brdrag, fltrust), not "
                f"{type(aggregator).__name__}"
            )

    @property
    def needs_root(self) -> bool:
        return False

    def broadcast(
        self, params: Tensor, buffers: Tensor, state: State, ctx: RoundContext
    ) -> Payload:
        extras = {"ref": state["ref"]} if "ref" in state else {}
        return Payload(params, buffers, extras)

    def reference(
        self,
        params: Tensor,
        buffers: Tensor,
        state: State,
        deltas: Tensor,
        ctx: RoundContext,
        services: ServerServices,
    ) -> Tensor:
        return state["ref"] if "ref" in state else deltas.mean(0)

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
        ref = state["ref"] if "ref" in state else stack_deltas(updates).mean(0)
        alpha = self.params.alpha  # type: ignore[attr-defined]
        new_state = dict(state, ref=(1 - alpha) * ref + alpha * agg)
        return ServerStep(params + self.lr * agg, new_buffers, new_state, metrics)


class FedExPParams(Params):
    eps: float = Field(1e-3, gt=0.0, description="ε in the step-size denominator")


@SERVER_ALGORITHMS.register("fedexp")
class FedExP(FedAvg):
    """FedExP (Jhunjhunwala et al. 2023; SPEC §4):
    η_g = max{1, Σ‖g_m‖² / (2S(‖Δ̃‖² + ε))}, θ^{t+1} = θ^t + η_g Δ̃."""

    params_schema = FedExPParams

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
        sq = sum(float(u.delta.pow(2).sum()) for u in updates)
        eps = self.params.eps  # type: ignore[attr-defined]
        eta = max(1.0, sq / (2 * len(updates) * (float(agg.pow(2).sum()) + eps)))
        metrics["agg/eta_g"] = eta
        return ServerStep(params + eta * agg, new_buffers, state, metrics)


class FedACGParams(Params):
    lam: float = Field(0.85, ge=0.0, lt=1.0, description="momentum λ of the look-ahead")


@SERVER_ALGORITHMS.register("fedacg")
class FedACG(FedAvg):
    """FedACG (Kim et al. 2024; SPEC §4): broadcast θ̂ = θ^t + λ m^{t−1};
    m^t = λ m^{t−1} + AGG(g) with g relative to θ̂; θ^{t+1} = θ^t + m^t.
    Pair with the ``fedacg`` client (proximal term towards θ̂)."""

    params_schema = FedACGParams

    def broadcast(
        self, params: Tensor, buffers: Tensor, state: State, ctx: RoundContext
    ) -> Payload:
        lam = self.params.lam  # type: ignore[attr-defined]
        start = params + lam * state["m"] if "m" in state else params
        return Payload(start, buffers)

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
        lam = self.params.lam  # type: ignore[attr-defined]
        m = lam * state["m"] + agg if "m" in state else agg
        metrics["agg/momentum_norm"] = float(m.norm())
        return ServerStep(params + self.lr * m, new_buffers, dict(state, m=m), metrics)


@SERVER_ALGORITHMS.register("scaffold")
class Scaffold(FedAvg):
    """SCAFFOLD's server (SPEC §4): broadcast h; h ← h + (1/M) Σ_{m∈S} Δh_m.
    Pair with the ``scaffold`` client."""

    def init_state(self, params: Tensor) -> State:
        return {"h": params.new_zeros(params.shape)}

    def broadcast(
        self, params: Tensor, buffers: Tensor, state: State, ctx: RoundContext
    ) -> Payload:
        return Payload(params, buffers, {"h": state["h"]})

    def update(
        self,
        params: Tensor,
        buffers: Tensor,
        state: State,
        updates: list[ClientUpdate],
        ctx: RoundContext,
        services: ServerServices,
    ) -> ServerStep:
        step = super().update(params, buffers, state, updates, ctx, services)
        h = state["h"].clone()
        for u in updates:  # attackers that skipped training upload no Δh
            if "dh" in u.extras:
                h += u.extras["dh"] / ctx.num_clients
        return ServerStep(step.params, step.buffers, dict(state, h=h), step.metrics)
