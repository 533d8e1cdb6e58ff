"""SCAFFOLD's client (Karimireddy et al., ICML 2020; DRAG paper, Sec. VI-A).

Local step: θ ← θ − η(∇F_m(θ; z) − h_m + h). After the round the client refreshes its
control variate h_m and uploads Δh_m = h_m⁺ − h_m (``extras["dh"]``):

* ``variant = "seed"`` (the DRAG paper's form): h_m⁺ = ∇F_m(θ^t; z_m^{t,0}), the gradient of the
  first local mini-batch at the received model;
* ``variant = "option2"`` (the original paper's option II):
  h_m⁺ = h_m − h + (θ^t − θ_m^{t,U}) / (U η).
"""

from __future__ import annotations

from typing import Literal

import torch
from pydantic import Field
from torch import Tensor, nn

from fedshield.algorithms.client.base import CLIENT_ALGORITHMS, ClientAlgorithm
from fedshield.algorithms.client.pieces import ClientRound, GradStep, Trained
from fedshield.core.context import ClientUpdate
from fedshield.core.flat import num_params
from fedshield.core.integrity import FieldSpec
from fedshield.core.params import Params


class ScaffoldParams(Params):
    variant: Literal["seed", "option2"] = Field(
        "seed",
        description="h_m⁺: 'seed' = first mini-batch gradient at θ^t (the DRAG paper); 'option2' = "
        "h_m − h + (θ^t − θ_m)/(Uη) (Karimireddy et al. 2020, option II)",
    )


CORRECTION = "scaffold/correction"
FIRST_GRAD = "scaffold/first_grad"


@CLIENT_ALGORITHMS.register("scaffold", tags=["uploads=dh", "local_dp", "dp_uploads"])
class ScaffoldClient(ClientAlgorithm):
    """Control-variate corrected local SGD; uploads the control-variate change."""

    payload_extras = ("h",)

    params_schema = ScaffoldParams
    params: ScaffoldParams
    # A parameter the loss does not reach (FedCART's h', a frozen exit) has ∇F = 0, and
    # the correction h − h_m still applies to it.
    fills_missing_grads = True

    later_state: tuple[str, ...] = ("h",)

    def reads_step_size(self) -> bool:
        return self.params.variant == "option2"  # h_m⁺ = h_m − h + (θ^t − θ_m)/(Uη)

    def init_state(self, num_params: int) -> dict[str, Tensor]:
        return {}  # h_m = 0 until the first participation (allocated lazily)

    def upload_spec(self, model: nn.Module) -> dict[str, FieldSpec]:
        return {"dh": FieldSpec((num_params(model),))}

    def constants(self, model: nn.Module, c: ClientRound) -> dict[str, Tensor]:
        h = c.payload.extras["h"]
        return {CORRECTION: h - c.state.get("h", torch.zeros_like(h))}

    def adjust(self, step: GradStep) -> None:
        if step.step == 0 and self.params.variant == "seed":
            step.keep(FIRST_GRAD, step.flat(step.grads))  # ∇F_m(θ^t; z^{t,0}): h_m⁺
        for g, c in zip(step.grads, step.split(step.consts[CORRECTION])):
            g.add_(c)

    def finish_clients(self, trained: Trained, updates: list[ClientUpdate]) -> None:
        h = trained.payload.extras["h"]
        seed = self.params.variant == "seed"
        for i, (u, state) in enumerate(zip(updates, trained.states)):
            old = state.get("h", torch.zeros_like(u.delta))
            if seed:
                new = trained.kept[FIRST_GRAD][i].clone()
            else:
                new = old - h - u.delta / (trained.steps[i] * trained.spec.lr)
            state["h"] = new
            u.extras["dh"] = new - old
