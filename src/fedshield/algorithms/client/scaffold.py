"""SCAFFOLD's client (Karimireddy et al. 2020; SPEC §4).

Local step: θ ← θ − η(∇F_m(θ; z) − h_m + h). After the round the client refreshes its
control variate h_m and uploads Δh_m = h_m⁺ − h_m (``extras["dh"]``):

* ``variant = "seed"`` (seed 000's form): h_m⁺ = ∇F_m(θ^t; z_m^{t,0}), the gradient of the
  first local mini-batch at the received model;
* ``variant = "option2"`` (the original paper's option II):
  h_m⁺ = h_m − h + (θ^t − θ_m^{t,U}) / (U η).
"""

from __future__ import annotations

from typing import Literal

import torch
from pydantic import Field
from torch import Tensor, nn

from fedshield.algorithms.client.base import CLIENT_ALGORITHMS, ClientAlgorithm, ClientContext
from fedshield.algorithms.client.functional import ScaffoldForm
from fedshield.core.context import ClientUpdate, Payload
from fedshield.core.flat import num_params
from fedshield.core.integrity import FieldSpec
from fedshield.core.params import Params
from fedshield.data.bundle import TensorData


class ScaffoldParams(Params):
    variant: Literal["seed", "option2"] = Field(
        "seed",
        description="h_m⁺: 'seed' = first mini-batch gradient at θ^t (seed 000); 'option2' = "
        "h_m − h + (θ^t − θ_m)/(Uη) (Karimireddy et al. 2020, option II)",
    )


@CLIENT_ALGORITHMS.register("scaffold", tags=["uploads=dh", "vectorizable"])
class ScaffoldClient(ClientAlgorithm):
    """Control-variate corrected local SGD; uploads the control-variate change."""

    params_schema = ScaffoldParams

    def init_state(self, num_params: int) -> dict[str, Tensor]:
        return {}  # h_m = 0 until the first participation (allocated lazily)

    def upload_spec(self, model: nn.Module) -> dict[str, FieldSpec]:
        return {"dh": FieldSpec((num_params(model),))}

    @torch.no_grad()
    def adjust_grads(
        self,
        model: nn.Module,
        payload: Payload,
        state: dict[str, Tensor],
        start: list[Tensor],
        step: int,
    ) -> None:
        # A parameter the loss does not reach (FedCART's h', a frozen exit) has no gradient:
        # its ∇F is 0, and the correction h − h_m still applies to it.
        for p in model.parameters():
            if p.grad is None:
                p.grad = torch.zeros_like(p)
        grads = [p.grad for p in model.parameters()]
        flat = torch.cat([g.reshape(-1) for g in grads])
        if step == 0:
            state["_first_grad"] = flat.clone()  # ∇F_m(θ^t; z^{t,0}), the seed's h_m⁺
        correction = payload.extras["h"] - state.get("h", torch.zeros_like(flat))
        offset = 0
        for g in grads:
            n = g.numel()
            g.add_(correction[offset : offset + n].view_as(g))
            offset += n

    def finish(
        self,
        model: nn.Module,
        update: ClientUpdate,
        payload: Payload,
        data: TensorData,
        ctx: ClientContext,
        state: dict[str, Tensor],
    ) -> ClientUpdate:
        old = state.get("h", torch.zeros_like(update.delta))
        first = state.pop("_first_grad")
        if self.params.variant == "seed":  # type: ignore[attr-defined]
            new = first
        else:
            steps = self.spec.num_steps(len(data))
            new = old - payload.extras["h"] - update.delta / (steps * self.spec.lr)
        state["h"] = new
        update.extras["dh"] = new - old
        return update

    def vector_form(self) -> ScaffoldForm:
        return ScaffoldForm(self, self.params.variant)  # type: ignore[attr-defined]
