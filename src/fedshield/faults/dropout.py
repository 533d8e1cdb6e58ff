"""Dropout after selection: a sampled client goes silent before it uploads (a crash, a
lost connection), the responsiveness fault of FLGo's client state machine (Wang et al.
2023) and the "stragglers dropped" regime of FedProx's experiments (Li et al. 2020)."""

from __future__ import annotations

from pydantic import Field

from fedshield.core.params import Params
from fedshield.faults.base import FAULT_MODELS, FaultEnv, FaultModel, RoundFaults, uniforms


class DropoutParams(Params):
    p: float = Field(0.1, ge=0.0, le=1.0, description="probability a sampled client drops out")


@FAULT_MODELS.register("dropout", tags=["stage=response"])
class Dropout(FaultModel):
    """A sampled client drops out of the round with probability p, independently.

    Client k drops in round t when u_{k,t} < p; its upload never arrives (the server step
    sees fewer rows than the cohort it asked)."""

    params_schema = DropoutParams
    p: float

    def respond(self, rnd: int, env: FaultEnv, out: RoundFaults) -> None:
        u = uniforms(env, rnd, self.name)
        out.dropped.update(k for k in out.pending() if u[k] < self.p)

    def rate(self, env: FaultEnv) -> float | None:
        return 1.0 - self.p
