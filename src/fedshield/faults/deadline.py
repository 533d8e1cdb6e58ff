"""A round deadline with per-client speeds: stragglers (FedScale's device speeds, Lai et al.
ICML 2022; the deadline of FedBuff/FedProx-style systems, Li et al. MLSys 2020).

Client k computes at speed v_k = exp(speed_sigma · z_k), z_k ~ N(0, 1) drawn once per run
(a lognormal with median 1), times a per-round factor exp(jitter · z_{k,t}). One local
step costs c_k: the share of the model's parameters its depth/width tier trains
(``tier_cost``; 1 for a full-model client), so a deeper tier needs more compute. Its round
takes

    time_k = U_k · c_k / v_k      (U_k: its full local steps)

in units of one full-model step at speed 1. The deadline is D = deadline · U_med, U_med
the median full local steps over the M clients: with ``deadline = 1`` a full-model client
of median data at speed 1 just makes it. A client with time_k > D is late: dropped
(``late = "drop"``) or returning the ⌊U_k · D / time_k⌋ steps it finished in time
(``late = "partial"``; dropped when that is 0)."""

from __future__ import annotations

import math
from typing import Literal

import numpy as np
from pydantic import Field

from fedshield.core.params import Params
from fedshield.faults.base import FAULT_MODELS, FaultEnv, FaultModel, RoundFaults, stream


class DeadlineParams(Params):
    deadline: float = Field(
        1.0, gt=0.0, le=1e6, description="D as a multiple of the median client's full round time"
    )
    speed_sigma: float = Field(
        0.5, ge=0.0, le=10.0, description="σ of the lognormal per-client speed (median 1)"
    )
    jitter: float = Field(
        0.0, ge=0.0, le=10.0, description="σ of a lognormal per-round factor on each speed"
    )
    late: Literal["partial", "drop"] = Field(
        "partial", description="partial: a late client uploads the steps it finished; drop: none"
    )
    tier_cost: bool = Field(
        True, description="a step costs the share of parameters the client's tier trains"
    )


def completed_steps(full: int, time: float, budget: float) -> int:
    """Steps finished by the deadline: ⌊full · budget / time⌋, at most ``full``."""
    if time <= budget:
        return full
    return min(full, math.floor(full * budget / time))


@FAULT_MODELS.register("deadline", tags=["stage=response"])
class Deadline(FaultModel):
    """A round deadline: clients slower than it are dropped or return partial work.

    Per-client lognormal speeds (drawn once per run), optional per-round jitter, and a step
    cost from the client's depth tier (see the module docstring for the time model)."""

    params_schema = DeadlineParams
    deadline: float
    speed_sigma: float
    jitter: float
    late: str
    tier_cost: bool

    def prepare(self, env: FaultEnv) -> None:
        z = stream(env, 0, self.name).standard_normal(env.num_clients)
        self._speed = np.exp(self.speed_sigma * z)
        full = [env.full_steps(k) for k in range(env.num_clients)]
        self.budget = self.deadline * float(np.median(full))
        self._cost: dict[int, float] = {}

    def speeds(self, rnd: int, env: FaultEnv) -> np.ndarray:
        """v_k in round ``rnd``: the per-run speed times the per-round jitter."""
        if self.jitter == 0:
            return self._speed
        z = stream(env, rnd, self.name).standard_normal(env.num_clients)
        return self._speed * np.exp(self.jitter * z)

    def cost(self, k: int, env: FaultEnv) -> float:
        """c_k: 1, or the share of parameters client k's tier trains (cached per client)."""
        if not self.tier_cost:
            return 1.0
        if k not in self._cost:
            self._cost[k] = env.cost(k)
        return self._cost[k]

    def times(self, rnd: int, env: FaultEnv, clients: list[int]) -> dict[int, float]:
        """time_k of round ``rnd`` for ``clients`` (module docstring)."""
        v = self.speeds(rnd, env)
        return {k: env.full_steps(k) * self.cost(k, env) / float(v[k]) for k in clients}

    def respond(self, rnd: int, env: FaultEnv, out: RoundFaults) -> None:
        for k, time in self.times(rnd, env, out.pending()).items():
            if time <= self.budget:
                continue
            out.late.add(k)
            done = completed_steps(env.full_steps(k), time, self.budget)
            if self.late == "partial" and done >= 1:
                out.steps[k] = done

    def rate(self, env: FaultEnv) -> float | None:
        """The mean over the M clients of P(client k answers): its speed s_k must reach
        c_k·U_k / D (``late = "drop"``) or c_k / D (``"partial"``, at least one step), the
        per-round factor exp(jitter·z) being lognormal: Φ((ln s_k − ln need_k) / jitter)."""
        need = np.array(
            [
                self.cost(k, env) * (env.full_steps(k) if self.late == "drop" else 1)
                for k in range(env.num_clients)
            ],
            dtype=float,
        ) / max(self.budget, 1e-300)
        gap = np.log(self._speed) - np.log(need)
        if self.jitter == 0:
            return float((gap >= 0).mean())
        z = gap / (self.jitter * math.sqrt(2.0))
        return float(np.mean([0.5 * (1.0 + math.erf(v)) for v in z]))
