"""FedDyn's client (Acar et al., "Federated Learning Based on Dynamic Regularization", ICLR
2021, Algorithm 1).

Client k, sampled in round t, minimises from the broadcast θ^{t−1}

    R_k(θ) = L_k(θ) − ⟨∇L_k(θ_k^{t−1}), θ⟩ + (α/2)‖θ − θ^{t−1}‖²

by local SGD: each step's gradient gains α(θ − θ^{t−1}) − ∇L_k(θ_k^{t−1}). Its state
g_k = ∇L_k(θ_k^{t−1}) (0 before its first round) is kept by the simulator across rounds,
like SCAFFOLD's h_m, and follows the first-order condition of the local problem:
g_k ← g_k − α(θ_k^t − θ^{t−1}). α is the server's (``server.params.alpha``), broadcast
as ``feddyn/alpha``, so both sides use one value; the upload is Δθ alone.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from fedshield.algorithms.client.base import CLIENT_ALGORITHMS, ClientAlgorithm
from fedshield.algorithms.client.pieces import ClientRound, GradStep, Trained
from fedshield.core.context import ClientUpdate
from fedshield.errors import ConfigError

ALPHA = "feddyn/alpha"  # payload: the server's α (a 0-d tensor)
GRAD = "feddyn/grad"  # constants: g_k = ∇L_k(θ_k^{t−1})


@CLIENT_ALGORITHMS.register("feddyn", tags=["local_dp"])
class FedDynClient(ClientAlgorithm):
    """Local SGD on FedDyn's dynamically regularised objective; keeps ∇L_k(θ_k^{t−1})."""

    # The regulariser reaches every parameter, those the loss does not included.
    fills_missing_grads = True
    payload_extras = (ALPHA,)

    later_state: tuple[str, ...] = ("grad",)

    def init_state(self, num_params: int) -> dict[str, Tensor]:
        return {}  # g_k = 0 until the first participation (allocated lazily)

    def constants(self, model: nn.Module, c: ClientRound) -> dict[str, Tensor]:
        if ALPHA not in c.payload.extras:
            raise ConfigError(
                "client.algorithm='feddyn' needs server.algorithm='feddyn', which broadcasts "
                "the regulariser's α"
            )
        g = c.state.get("grad")
        return {GRAD: g if g is not None else torch.zeros_like(c.payload.params)}

    def adjust(self, step: GradStep) -> None:
        alpha = step.payload.extras[ALPHA]
        grad_k = step.split(step.consts[GRAD])
        for g, p, p0, gk in zip(step.grads, step.params, step.start, grad_k):
            g.addcmul_(p - p0, alpha).sub_(gk)

    def finish_clients(self, trained: Trained, updates: list[ClientUpdate]) -> None:
        alpha = trained.payload.extras[ALPHA]
        for u, state in zip(updates, trained.states):
            old = state.get("grad")
            old = old if old is not None else torch.zeros_like(u.delta)
            state["grad"] = old - alpha * u.delta


__all__ = ["ALPHA", "FedDynClient"]
