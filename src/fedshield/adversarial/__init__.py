"""Adversarial examples for training and robust evaluation (FedCART paper; early-exit ViT paper).

Batched, device-agnostic, white-box L∞ attacks that work on any ``nn.Module`` returning
logits. They never change the model's train/eval mode (training code decides) and never
write parameters' ``.grad`` (gradients are taken w.r.t. the input only), so they can run
inside a training step. Randomness comes from an explicit ``torch.Generator``.

* generation: :func:`fgsm`, :func:`pgd`, :func:`cw_linf`, :func:`trades_pgd`;
* evaluation: ``EVAL_ATTACKS`` ("fgsm", "pgd", "cw", "autoattack") and
  :func:`robust_accuracy` / :func:`robust_correct`.
"""

from fedshield.adversarial.autoattack import AutoAttackAdapter, MissingDependencyError
from fedshield.adversarial.evaluation import EvalAttack, robust_accuracy, robust_correct
from fedshield.adversarial.fgsm import fgsm
from fedshield.adversarial.losses import ce_loss, cw_margin, cw_margin_loss
from fedshield.adversarial.pgd import cw_linf, pgd
from fedshield.adversarial.registry import EVAL_ATTACKS, CWAttack, FGSMAttack, PGDAttack
from fedshield.adversarial.trades import trades_pgd

__all__ = [
    "EVAL_ATTACKS",
    "AutoAttackAdapter",
    "CWAttack",
    "EvalAttack",
    "FGSMAttack",
    "MissingDependencyError",
    "PGDAttack",
    "ce_loss",
    "cw_linf",
    "cw_margin",
    "cw_margin_loss",
    "fgsm",
    "pgd",
    "robust_accuracy",
    "robust_correct",
    "trades_pgd",
]
