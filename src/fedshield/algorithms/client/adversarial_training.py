"""Federated adversarial-training baselines of the FedCART paper: a local AT loss + FedAvg
(or any configured aggregator).

* ``fedpgd``    — Madry PGD-AT: CE(f(x'), y), x' = PGD-K(CE);
* ``fedfat``    — our reading of FedFAT: L_NAT + L_AT = CE(f(x), y) + CE(f(x'), y);
* ``fedtrades`` — CE(f(x), y) + β KL(p(x) ‖ p(x')), x' maximises the KL (β = 6);
* ``fedmart``   — MART's boosted CE on x' + β KL · (1 − p_y(x)) (β = 6);
* ``calfat``    — CE(s·(z' + τ log π_k), y) on x' generated TRADES-style on the calibrated
  logits (s = 10, τ = 0.1, π_k the client's class prior);
* ``fedtaet``   — TAET (CVPR 2025): natural CE for the first rounds, then HARL on x'
  (class-balanced, deviation-penalised adversarial CE; ``fedshield.losses.taet``).

The attack budget defaults to our choice of ε (8/255 on colour inputs, 0.1 on grayscale, read
off the batch's channel count) with step ε/4 and K = 10 steps. Adversarial examples are
generated with the model in eval mode (BatchNorm running statistics untouched by the
attack's forward passes), as the TRADES, MART and CalFAT reference code does.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator

import torch
import torch.nn.functional as F
from pydantic import Field
from torch import Tensor, nn

from fedshield.adversarial import pgd, trades_pgd
from fedshield.adversarial.linf import Draws
from fedshield.algorithms.client.base import (
    CLIENT_ALGORITHMS,
    GLOBAL_RNG,
    ClientAlgorithm,
)
from fedshield.algorithms.client.pieces import Batch, ClientRound
from fedshield.core.context import ClientUpdate, Payload
from fedshield.core.params import Params
from fedshield.data.bundle import TensorData
from fedshield.losses import (
    calibrated_ce,
    calibrated_logits,
    class_log_prior,
    harl_loss,
    mart_loss,
    trades_loss,
)

GRAYSCALE_EPS = 0.1
COLOUR_EPS = 8 / 255


class ATParams(Params):
    eps: float | None = Field(
        None,
        ge=0.0,
        description="L∞ budget of the training attack (unset: 8/255 on colour, 0.1 on "
        "grayscale inputs).",
    )
    alpha: float | None = Field(
        None, gt=0.0, description="PGD step size of the training attack (unset: eps/4)."
    )
    steps: int = Field(10, ge=0, description="Number K of PGD steps of the training attack.")
    attack_eval_mode: bool = Field(
        True,
        description="Generate x' with the model in eval mode, as the reference code does.",
    )


def default_eps(x: Tensor) -> float:
    """Our default budget: 0.1 on grayscale (1 channel), 8/255 on colour inputs."""
    return GRAYSCALE_EPS if x.shape[1] == 1 else COLOUR_EPS


@contextlib.contextmanager
def eval_mode(model: nn.Module, enabled: bool = True) -> Iterator[None]:
    """Temporarily switch ``model`` to eval mode (restoring its previous mode)."""
    was_training = model.training
    if enabled:
        model.eval()
    try:
        yield
    finally:
        model.train(was_training)


class AdversarialClient(ClientAlgorithm):
    """Local SGD on an adversarial loss: x' = PGD-K (:meth:`examples`), then the
    subclass's :meth:`objective`."""

    params_schema: type[Params] = ATParams
    params: ATParams

    def budget(self, x: Tensor) -> tuple[float, float]:
        p = self.params
        eps = p.eps if p.eps is not None else default_eps(x)
        alpha = p.alpha if p.alpha is not None else eps / 4
        return eps, alpha

    def pgd_examples(
        self,
        model: nn.Module,
        x: Tensor,
        y: Tensor,
        steps: int | None = None,
        draws: Draws = GLOBAL_RNG,
    ) -> Tensor:
        """x' = PGD-K with CE and a uniform random start from ``draws`` (the global RNG,
        which the engine seeds per (seed, round, client), or the client's replayed stream)."""
        eps, alpha = self.budget(x)
        k = self.params.steps if steps is None else steps
        with eval_mode(model, self.params.attack_eval_mode):
            return pgd(model, x, y, eps, alpha, k, draws=draws)

    def trades_examples(
        self,
        model: nn.Module,
        x: Tensor,
        draws: Draws = GLOBAL_RNG,
        transform: Callable[[Tensor], Tensor] | None = None,
    ) -> Tensor:
        """x' maximising KL(p(x) ‖ p(x')) (TRADES' inner problem), optionally on transformed
        logits (CalFAT's calibration)."""
        eps, alpha = self.budget(x)
        with eval_mode(model, self.params.attack_eval_mode):
            return trades_pgd(
                model, x, eps, alpha, self.params.steps,
                logit_transform=transform, draws=draws,
            )  # fmt: skip

    def examples(self, model: nn.Module, b: Batch, draws: Draws) -> Tensor | None:
        return self.pgd_examples(model, b.x, b.y, draws=draws)


@CLIENT_ALGORITHMS.register("fedpgd", tags=["local_dp"])
class FedPGD(AdversarialClient):
    """FedPGD trains on Madry's PGD adversarial examples only: CE(f(x'), y) (Madry et al. 2018)."""

    def objective(self, model: nn.Module, b: Batch, x_adv: Tensor | None) -> Tensor:
        return F.cross_entropy(model(x_adv), b.y)


@CLIENT_ALGORITHMS.register("fedfat", tags=["local_dp"])
class FedFAT(AdversarialClient):
    """FedFAT trains on natural plus PGD cross-entropy, CE(f(x), y) + CE(f(x'), y) (our
    reading of the FedCART paper's baseline)."""

    def objective(self, model: nn.Module, b: Batch, x_adv: Tensor | None) -> Tensor:
        return F.cross_entropy(model(b.x), b.y) + F.cross_entropy(model(x_adv), b.y)


class BetaParams(ATParams):
    beta: float = Field(6.0, ge=0.0, description="Weight β of the KL term.")


@CLIENT_ALGORITHMS.register("fedtrades", tags=["local_dp"])
class FedTRADES(AdversarialClient):
    """FedTRADES trains on CE(x) + β KL(p(x) ‖ p(x')) with x' maximising the KL (TRADES,
    Zhang et al. 2019)."""

    params_schema = BetaParams
    params: BetaParams

    def examples(self, model: nn.Module, b: Batch, draws: Draws) -> Tensor | None:
        return self.trades_examples(model, b.x, draws)

    def objective(self, model: nn.Module, b: Batch, x_adv: Tensor | None) -> Tensor:
        return trades_loss(model(b.x), model(x_adv), b.y, self.params.beta)


@CLIENT_ALGORITHMS.register("fedmart", tags=["local_dp"])
class FedMART(AdversarialClient):
    """FedMART trains on MART's boosted CE on x' plus β KL · (1 − p_y(x)) (Wang et al. 2020)."""

    params_schema = BetaParams
    params: BetaParams

    def objective(self, model: nn.Module, b: Batch, x_adv: Tensor | None) -> Tensor:
        return mart_loss(model(b.x), model(x_adv), b.y, self.params.beta)


class CalFATParams(ATParams):
    scale: float = Field(10.0, gt=0.0, description="Logit scale s of the calibrated CE.")
    tau: float = Field(0.1, ge=0.0, description="Prior weight τ in z + τ log π_k.")


LOG_PRIOR_KEY = "calfat/log_prior"


@CLIENT_ALGORITHMS.register("calfat", tags=["local_dp"])
class CalFAT(AdversarialClient):
    """CalFAT trains on the prior-calibrated CE of TRADES-style x' (Chen et al., NeurIPS
    2022). The client's log-prior log π_k is a constant of the round, computed
    from its labels."""

    params_schema = CalFATParams
    params: CalFATParams

    def constants(self, model: nn.Module, c: ClientRound) -> dict[str, Tensor]:
        counts = c.data.class_counts(_num_classes(model, c.data, c.device))
        return {LOG_PRIOR_KEY: class_log_prior(counts).to(c.device)}

    def examples(self, model: nn.Module, b: Batch, draws: Draws) -> Tensor | None:
        log_prior, tau = b.consts[LOG_PRIOR_KEY], self.params.tau
        return self.trades_examples(
            model, b.x, draws, lambda z: calibrated_logits(z, log_prior, tau)
        )

    def objective(self, model: nn.Module, b: Batch, x_adv: Tensor | None) -> Tensor:
        p = self.params
        return calibrated_ce(model(x_adv), b.y, b.consts[LOG_PRIOR_KEY], p.scale, p.tau)


class TAETParams(ATParams):
    stabilize_rounds: int = Field(
        40,
        ge=0,
        description="Rounds of TAET's first stage (natural CE) before HARL; the reference "
        "code trains 40 of 100 epochs with CE, and one round is one local epoch at E = 1.",
    )
    harl_alpha: float = Field(0.1, ge=0.0, description="Weight α of HARL's balanced term.")
    harl_beta: float = Field(0.1, ge=0.0, description="Weight β of HARL's deviation term.")
    harl_gamma: float = Field(0.1, ge=0.0, description="Weight γ of HARL's rare-class term.")


ROUND_KEY = "taet/round"


def with_round(payload: Payload, rnd: int) -> Payload:
    """A copy of ``payload`` whose extras carry the round number (for a two-stage loss)."""
    extras = {**payload.extras, ROUND_KEY: torch.tensor(float(rnd))}
    return Payload(payload.params, payload.buffers, extras)


def taet_stage(payload: Payload, stabilize_rounds: int) -> int:
    """1 (natural CE) in rounds 1..stabilize_rounds, then 2 (HARL on x')."""
    rnd = payload.extras.get(ROUND_KEY)
    return 2 if rnd is None or float(rnd) > stabilize_rounds else 1


@CLIENT_ALGORITHMS.register("fedtaet")
class FedTAET(AdversarialClient):
    """FedTAET runs TAET's two stages locally: natural CE first, then HARL on PGD examples.

    TAET (Wang Yu-Hang et al., CVPR 2025): an initial stabilisation stage of natural CE
    (``stabilize_rounds`` rounds), then the Hierarchical Adversarial Robustness Loss on x'
    (:func:`~fedshield.losses.harl_loss`). The round reaches the pieces through a copy of
    the payload's extras. It owns its update (client by client, no DP-SGD): HARL couples a
    batch's samples through class means, which per-sample clipping cannot bound, and
    :mod:`fedshield.privacy` refuses the algorithms that own their loop."""

    params_schema = TAETParams
    params: TAETParams

    def local_update(self, model: nn.Module, rnd: ClientRound) -> ClientUpdate:
        staged = rnd.replace(payload=with_round(rnd.payload, rnd.ctx.round))
        return super().local_update(model, staged)

    def _stage(self, payload: Payload) -> int:
        return taet_stage(payload, self.params.stabilize_rounds)

    def examples(self, model: nn.Module, b: Batch, draws: Draws) -> Tensor | None:
        if self._stage(b.payload) == 1:
            return None
        return self.pgd_examples(model, b.x, b.y, draws=draws)

    def objective(self, model: nn.Module, b: Batch, x_adv: Tensor | None) -> Tensor:
        if self._stage(b.payload) == 1:
            return F.cross_entropy(model(b.x), b.y)
        p: TAETParams = self.params
        return harl_loss(model(x_adv), b.y, p.harl_alpha, p.harl_beta, p.harl_gamma)


def _num_classes(model: nn.Module, data: TensorData, device: torch.device) -> int:
    """C from the classifier head, or from one forward pass for other modules."""
    head = getattr(model, "head", None)
    if isinstance(head, nn.Linear):
        return head.out_features
    with torch.no_grad(), eval_mode(model):
        x, _ = data.batch(torch.arange(1), device)
        return int(model(x).shape[1])


__all__ = [
    "ATParams",
    "AdversarialClient",
    "BetaParams",
    "CalFAT",
    "FedFAT",
    "FedMART",
    "FedPGD",
    "FedTAET",
    "FedTRADES",
    "TAETParams",
    "default_eps",
    "eval_mode",
]
