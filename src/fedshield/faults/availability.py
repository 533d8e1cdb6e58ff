"""Independent per-round availability: each client is online with probability p in every
round (the Bernoulli availability of FLGo's client state machine, Wang et al. 2023; the
independent participation model of Li et al., ICLR 2020, with one p for all)."""

from __future__ import annotations

import numpy as np
from pydantic import Field

from fedshield.core.params import Params
from fedshield.faults.base import FAULT_MODELS, FaultEnv, FaultModel, uniforms


class AvailabilityParams(Params):
    p: float = Field(0.8, ge=0.0, le=1.0, description="probability a client is online in a round")


@FAULT_MODELS.register("availability", tags=["stage=availability"])
class Availability(FaultModel):
    """Each client is online in each round with probability p, independently.

    Client k is online in round t when u_{k,t} < p, u from the (seed, t) fault stream, so
    over T rounds a client is online Binomial(T, p) times."""

    params_schema = AvailabilityParams
    p: float

    def available(self, rnd: int, env: FaultEnv) -> np.ndarray:
        return uniforms(env, rnd, self.name) < self.p

    def rate(self, env: FaultEnv) -> float | None:
        return self.p
