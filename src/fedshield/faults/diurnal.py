"""Time-varying availability: a diurnal profile (the day/night cycle measured on phones by
Yang et al., WWW 2021, "Characterizing impacts of heterogeneity in federated learning upon
large-scale smartphone data"; FedScale's availability traces, Lai et al. ICML 2022).

p_k(t) = clip(mean + amplitude · sin(2π (t / period + φ_k)), 0, 1), with client k's phase
φ_k = phase_spread · u_k (u_k uniform, drawn once per run): 0 puts every client in one time
zone, 1 spreads them over the whole day."""

from __future__ import annotations

import math

import numpy as np
from pydantic import Field

from fedshield.core.params import Params
from fedshield.faults.base import FAULT_MODELS, FaultEnv, FaultModel, stream, uniforms


class DiurnalParams(Params):
    mean: float = Field(0.6, ge=0.0, le=1.0, description="mean online probability")
    amplitude: float = Field(0.3, ge=0.0, le=1.0, description="swing of the probability")
    period: float = Field(24.0, gt=0.0, le=1e6, description="rounds per cycle (a day)")
    phase_spread: float = Field(
        0.0, ge=0.0, le=1.0, description="client phases uniform in [0, phase_spread) cycles"
    )


def diurnal_probability(
    rnd: int, mean: float, amplitude: float, period: float, phase: np.ndarray
) -> np.ndarray:
    """p_k(t) of the module docstring for every client's ``phase`` (in cycles)."""
    p = mean + amplitude * np.sin(2.0 * math.pi * (rnd / period + phase))
    return np.clip(p, 0.0, 1.0)


@FAULT_MODELS.register("diurnal", tags=["stage=availability"])
class Diurnal(FaultModel):
    """A client is online with a probability that follows a sinusoidal day/night cycle.

    p_k(t) = clip(mean + amplitude · sin(2π (t/period + φ_k)), 0, 1); the phases φ_k are
    drawn once per run from the seed."""

    params_schema = DiurnalParams
    mean: float
    amplitude: float
    period: float
    phase_spread: float

    def phases(self, env: FaultEnv) -> np.ndarray:
        return self.phase_spread * stream(env, 0, self.name).random(env.num_clients)

    def available(self, rnd: int, env: FaultEnv) -> np.ndarray:
        p = diurnal_probability(rnd, self.mean, self.amplitude, self.period, self.phases(env))
        return uniforms(env, rnd, self.name) < p

    def rate(self, env: FaultEnv) -> float | None:
        """p_k(t) averaged over one cycle (the clip makes it differ from ``mean``)."""
        grid = np.linspace(0.0, 1.0, 1024, endpoint=False)
        return float(diurnal_probability(0, self.mean, self.amplitude, 1.0, grid).mean())
