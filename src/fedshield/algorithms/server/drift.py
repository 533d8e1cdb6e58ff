"""Drift-mitigating servers of the DRAG paper: DRAG (Secs. III–IV), FedExP, FedACG, SCAFFOLD
(Sec. VI-A),
and DRAG's calibration under FedACG's look-ahead momentum (``drag_acg``, our composition)."""

from __future__ import annotations

from typing import Any

import torch
from pydantic import Field
from torch import Tensor

from fedshield.aggregators.base import Aggregator
from fedshield.algorithms.server.base import SERVER_ALGORITHMS, ServerRound, ServerStep, State
from fedshield.algorithms.server.fedavg import Aggregated, FedAvg
from fedshield.core.context import Payload, RoundContext
from fedshield.core.flat import stack_rows
from fedshield.core.params import Params
from fedshield.errors import ConfigError


def look_ahead(params: Tensor, state: State, lam: float) -> Tensor:
    """FedACG's broadcast θ̂ = θ^t + λ m^{t−1} (θ^t before the first round)."""
    return params + lam * state["m"] if "m" in state else params


def momentum(state: State, delta: Tensor, lam: float) -> Tensor:
    """FedACG's m^t = λ m^{t−1} + Δ^t (Δ^t in the first round)."""
    return lam * state["m"] + delta if "m" in state else delta


def momentum_step(
    lr: float, lam: float, rnd: ServerRound, agg: Aggregated, state: State | None = None
) -> ServerStep:
    """FedACG's step θ^{t+1} = θ^t + η_g m^t with m^t = λ m^{t−1} + Δ^t (state ``m``),
    plus the state entries ``state``."""
    m = momentum(rnd.state, agg.delta, lam)
    metrics = {"agg/momentum_norm": float(m.norm())}
    return agg.to_step(rnd, rnd.params + lr * m, (state or {}) | {"m": m}, metrics)


def _ref_extras(state: State) -> dict[str, Tensor]:
    """DRAG's reference r^t, broadcast when there is one (a client may calibrate locally)."""
    return {"ref": state["ref"]} if "ref" in state else {}


class DragParams(Params):
    # Our default: α = 0.25 from the bundled-data sweep (docs/results/drag.md): 0.01 and 0.05
    # lag behind, 0.25 and 0.5 are best and within 1 point; the DRAG paper finds > 0.25 too large.
    alpha: float = Field(0.25, gt=0.0, lt=1.0, description="reference momentum α (eq. 8)")


@SERVER_ALGORITHMS.register("drag", tags=["needs_aggregator=needs_reference"])
class DRAG(FedAvg):
    """DRAG: calibrate each g_m towards the momentum reference r^t (DRAG paper, eqs. 8–11).

    r^0 = (1/S) Σ g_m^0; r^t = (1 − α) r^{t−1} + α Δ^{t−1}. State ``ref`` holds the
    reference for the next round; it is broadcast so a client may calibrate locally."""

    params_schema = DragParams
    params: DragParams
    default_aggregator = "drag"
    optional_broadcast = ("ref",)
    later_state: tuple[str, ...] = ("ref",)  # r^t, from round 1's screened mean on

    def __init__(self, aggregator: Aggregator, **kwargs: Any) -> None:
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
        return Payload(params, buffers, _ref_extras(state))

    def reference(self, rnd: ServerRound) -> Tensor:
        """r^t from state; before the first round r^0 = (1/S) Σ g_m^0 over the screened
        updates — through the rule's robust field counterpart when the rule is a Byzantine
        defense (docs/security.md §2), so one attacker cannot set the first reference."""
        if "ref" in rnd.state:
            return rnd.state["ref"]
        return self.aggregate_field(rnd.deltas(), None)

    def next_ref(self, rnd: ServerRound, agg: Aggregated) -> State:
        """r^{t+1} = (1 − α) r^t + α Δ^t (eq. 8), as the state entry ``ref``."""
        alpha = self.params.alpha
        return {"ref": (1 - alpha) * self.reference(rnd) + alpha * agg.delta}

    def step(self, rnd: ServerRound, agg: Aggregated) -> ServerStep:
        return agg.to_step(rnd, rnd.params + self.lr * agg.delta, self.next_ref(rnd, agg))


class FedExPParams(Params):
    eps: float = Field(1e-3, gt=0.0, description="ε in the step-size denominator")


@SERVER_ALGORITHMS.register("fedexp")
class FedExP(FedAvg):
    """FedExP (Jhunjhunwala et al., ICLR 2023; DRAG paper, Sec. VI-A):
    η_g = max{1, Σ‖g_m‖² / (2S(‖Δ̃‖² + ε))}, θ^{t+1} = θ^t + η_g Δ̃."""

    params_schema = FedExPParams
    params: FedExPParams

    def step(self, rnd: ServerRound, agg: Aggregated) -> ServerStep:
        # Σ‖g_m‖²/S through the rule's field counterpart (the median of the squared norms
        # under a robust rule): one huge upload cannot set the step size (docs/security.md §2).
        sq = rnd.deltas().to(torch.float64).pow(2).sum(1, keepdim=True)
        mean_sq = float(self.aggregate_field(sq, None)[0])
        eps = self.params.eps
        agg_sq = float(agg.delta.to(torch.float64).pow(2).sum())
        eta = max(1.0, mean_sq / (2 * (agg_sq + eps)))
        return agg.to_step(rnd, rnd.params + eta * agg.delta, metrics={"agg/eta_g": eta})


class FedACGParams(Params):
    lam: float = Field(0.85, ge=0.0, lt=1.0, description="momentum λ of the look-ahead")


@SERVER_ALGORITHMS.register("fedacg", tags=["central_dp"])
class FedACG(FedAvg):
    """FedACG (Kim et al., CVPR 2024): broadcast θ̂ = θ^t + λ m^{t−1};
    m^t = λ m^{t−1} + AGG(g) with g relative to θ̂; θ^{t+1} = θ^t + m^t.
    Pair with the ``fedacg`` client (proximal term towards θ̂)."""

    params_schema = FedACGParams
    params: FedACGParams
    later_state: tuple[str, ...] = ("m",)  # m^t, from round 1 on

    def broadcast(
        self, params: Tensor, buffers: Tensor, state: State, ctx: RoundContext
    ) -> Payload:
        lam = self.params.lam
        return Payload(look_ahead(params, state, lam), buffers)

    def step(self, rnd: ServerRound, agg: Aggregated) -> ServerStep:
        return momentum_step(self.lr, self.params.lam, rnd, agg)


class DragACGParams(DragParams):  # DragACG runs DRAG's steps: it has DRAG's fields
    alpha: float = Field(0.25, gt=0.0, lt=1.0, description="DRAG's reference momentum α (eq. 8)")
    lam: float = Field(0.85, ge=0.0, lt=1.0, description="FedACG's look-ahead momentum λ")


@SERVER_ALGORITHMS.register("drag_acg", tags=["needs_aggregator=needs_reference"])
class DragACG(DRAG):
    """DRAG's calibration inside FedACG's look-ahead momentum loop (our composition).

    FedACG wins the drift table with an effective server step up to 1/(1 − λ) times
    FedAvg's (docs/results/drag.md); this asks whether DRAG's directions add to that step.
    Broadcast θ̂ = θ^t + λ m^{t−1} (FedACG); clients (the ``fedacg`` client: proximal
    term towards θ̂) return g_m relative to θ̂; the ``drag`` rule calibrates them towards
    DRAG's reference r^t (eq. 10–11), Δ^t = (1/S) Σ v_m; then r^{t+1} = (1 − α) r^t +
    α Δ^t (eq. 8), m^t = λ m^{t−1} + Δ^t and θ^{t+1} = θ^t + η_g m^t. λ = 0 is DRAG;
    c = 0 is FedACG."""

    params_schema = DragACGParams
    params: DragACGParams
    later_state: tuple[str, ...] = ("ref", "m")

    def broadcast(
        self, params: Tensor, buffers: Tensor, state: State, ctx: RoundContext
    ) -> Payload:
        lam = self.params.lam
        return Payload(look_ahead(params, state, lam), buffers, _ref_extras(state))

    def step(self, rnd: ServerRound, agg: Aggregated) -> ServerStep:
        return momentum_step(self.lr, self.params.lam, rnd, agg, self.next_ref(rnd, agg))


@SERVER_ALGORITHMS.register("scaffold", tags=["needs_client=scaffold"])
class Scaffold(FedAvg):
    """SCAFFOLD's server (Karimireddy et al., ICML 2020): broadcast h; h ← h + (1/M) Σ_{m∈S} Δh_m.
    Pair with the ``scaffold`` client."""

    def init_state(self, params: Tensor) -> State:
        return super().init_state(params) | {"h": params.new_zeros(params.shape)}

    def broadcast(
        self, params: Tensor, buffers: Tensor, state: State, ctx: RoundContext
    ) -> Payload:
        return Payload(params, buffers, {"h": state["h"]})

    def step(self, rnd: ServerRound, agg: Aggregated) -> ServerStep:
        h = rnd.state["h"]
        rows = [u.extras["dh"] for u in rnd.updates if "dh" in u.extras]  # skipped attackers
        if rows:
            # h ← h + (1/M) Σ_{m∈S} Δh_m = h + (K/M)·mean(Δh): the mean through the rule's
            # field counterpart, so one client's Δh cannot poison h (docs/security.md §2).
            k = len(rows) / rnd.ctx.num_clients
            h = h + k * self.aggregate_field(stack_rows(rows), None)
        return agg.to_step(rnd, rnd.params + self.lr * agg.delta, {"h": h})
