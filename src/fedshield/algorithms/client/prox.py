"""Proximal local objectives: FedProx and FedACG's client (DRAG paper, Sec. VI-A)."""

from __future__ import annotations

from pydantic import Field

from fedshield.algorithms.client.base import CLIENT_ALGORITHMS, ClientAlgorithm
from fedshield.algorithms.client.pieces import GradStep
from fedshield.core.params import Params


class ProxParams(Params):
    mu: float = Field(0.01, ge=0.0, description="proximal weight")


class _Proximal(ClientAlgorithm):
    """The proximal gradient term μ(θ − θ_start); each subclass names its weight μ (its own
    schema field, so that FedACG's client is not typed as having FedProx's ``mu``)."""

    @property
    def mu(self) -> float:
        raise NotImplementedError

    def adjust(self, step: GradStep) -> None:
        for g, p, p0 in zip(step.grads, step.params, step.start):
            g.add_(p - p0, alpha=self.mu)


@CLIENT_ALGORITHMS.register("fedprox", tags=["local_dp"])
class FedProx(_Proximal):
    """F_m(θ) + (μ/2)‖θ − θ_start‖²: the gradient gains μ(θ − θ_start) (Li et al., MLSys 2020;
    μ = 0.01, DRAG paper, Sec. VI-A).

    With FedACG's server the start point is the look-ahead model θ̂ and μ plays β
    (use the ``fedacg`` client, whose default is β = 0.001)."""

    params_schema = ProxParams
    params: ProxParams

    @property
    def mu(self) -> float:
        return self.params.mu


class ACGParams(Params):
    beta: float = Field(0.001, ge=0.0, description="proximal weight towards the look-ahead model")


@CLIENT_ALGORITHMS.register("fedacg", tags=["local_dp"])
class FedACGClient(_Proximal):
    """FedACG client: minimise F_m(θ) + (β/2)‖θ − θ̂‖² from the look-ahead θ̂ (Kim et al.,
    CVPR 2024)."""

    params_schema = ACGParams
    params: ACGParams

    @property
    def mu(self) -> float:
        return self.params.beta
