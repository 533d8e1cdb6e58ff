"""FedDyn's server (Acar et al., "Federated Learning Based on Dynamic Regularization", ICLR
2021, Algorithm 1).

With P_t the round's m = |P_t| uploads of M clients, g_k = θ_k^t − θ^{t−1} and
Δ = (1/m) Σ_{k∈P_t} g_k (the configured rule: the mean is the paper's, with
``server.weighting = "uniform"``):

    h^t = h^{t−1} − α (1/M) Σ_{k∈P_t} g_k = h^{t−1} − α (m/M) Δ
    θ^t = (1/m) Σ_{k∈P_t} θ_k^t − h^t/α = θ^{t−1} + Δ − h^t/α

(the server step η_g scales Δ; 1 is the paper's). Both lines read the rule's Δ only, so a
robust rule screens what enters h and ``[privacy.central]`` noise covers it. Pair with the
``feddyn`` client, to which α is broadcast.
"""

from __future__ import annotations

from pydantic import Field
from torch import Tensor

from fedshield.algorithms.client.feddyn import ALPHA
from fedshield.algorithms.server.base import SERVER_ALGORITHMS, ServerRound, ServerStep, State
from fedshield.algorithms.server.fedavg import Aggregated, FedAvg
from fedshield.core.context import Payload, RoundContext
from fedshield.core.params import Params


class FedDynParams(Params):
    alpha: float = Field(
        0.01,
        gt=0.0,
        description="α of the dynamic regulariser (the paper uses 0.1, 0.01, 0.001); "
        "broadcast to the feddyn clients",
    )


@SERVER_ALGORITHMS.register("feddyn", tags=["needs_client=feddyn"])
class FedDyn(FedAvg):
    """FedDyn's server: broadcast θ and α; h ← h − α(m/M)Δ; θ ← θ + Δ − h/α."""

    params_schema = FedDynParams
    params: FedDynParams

    def init_state(self, params: Tensor) -> State:
        return super().init_state(params) | {"h": params.new_zeros(params.shape)}

    def broadcast(
        self, params: Tensor, buffers: Tensor, state: State, ctx: RoundContext
    ) -> Payload:
        return Payload(params, buffers, {ALPHA: params.new_tensor(self.params.alpha)})

    def step(self, rnd: ServerRound, agg: Aggregated) -> ServerStep:
        alpha, share = self.params.alpha, len(rnd.updates) / rnd.ctx.num_clients
        h = rnd.state["h"] - alpha * share * agg.delta
        return agg.to_step(rnd, rnd.params + self.lr * agg.delta - h / alpha, {"h": h})


__all__ = ["FedDyn", "FedDynParams"]
