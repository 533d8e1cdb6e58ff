"""Pure loss functions of the adversarial-training methods (FedCART paper).

No state, no model: every function maps tensors (logits, features, labels, priors) to a
scalar loss, so each can be checked on a hand-worked example.

* :func:`supervised_contrastive` / :func:`align_loss` — FedCART's L_Align;
* :func:`trades_kl` / :func:`trades_loss` — TRADES (FedTRADES, TRADES+FedCART);
* :func:`mart_loss` — MART (FedMART, MART+FedCART);
* :func:`calibrated_ce` / :func:`class_log_prior` — CalFAT's logit-calibrated CE;
* :func:`harl_loss` — TAET's second-stage loss (FedTAET, TAET+FedCART);
* :mod:`~fedshield.losses.gradient_matching` — per-class gradient prototypes of a linear
  classifier and the virtual-feature gradient-matching objective (FedCART's CART step).
"""

from fedshield.losses.calfat import calibrated_ce, calibrated_logits, class_log_prior
from fedshield.losses.contrastive import align_loss, supervised_contrastive
from fedshield.losses.gradient_matching import (
    MatchResult,
    class_gradient_sums,
    linear_ce_grad,
    linear_ce_grad_per_sample,
    match_distance,
    plateaued,
    synthesize_features,
)
from fedshield.losses.mart import mart_loss
from fedshield.losses.taet import class_mean_losses, harl_loss, harl_terms
from fedshield.losses.trades import trades_kl, trades_loss

__all__ = [
    "MatchResult",
    "align_loss",
    "calibrated_ce",
    "calibrated_logits",
    "class_gradient_sums",
    "class_mean_losses",
    "class_log_prior",
    "harl_loss",
    "harl_terms",
    "linear_ce_grad",
    "linear_ce_grad_per_sample",
    "mart_loss",
    "match_distance",
    "plateaued",
    "supervised_contrastive",
    "synthesize_features",
    "trades_kl",
    "trades_loss",
]
