"""Robust evaluation of the inference model (FedCART paper): evaluators ``robust`` and ``groups``.

``robust``: natural accuracy, FGSM(ε), PGD-20 (step ε/4, random start), CW∞ (CW margin,
κ = 50, 30 steps), AutoAttack standard (via torchattacks; skipped with a warning and
``robust/aa_skipped = 1`` when the package is missing or ``autoattack = false``) and
"Robust AVG" = the mean of FGSM, CW, PGD-20 and AA (of those that ran), and the worst
case ``robust/worst``: the fraction of samples that every attack of the round left
correctly classified (per sample, on the samples all of them attacked). The worst case is
the headline: no single attack ranks methods reliably (CalFAT's CW∞ accuracy sits 5–8
points under its PGD-20 where FedCART's moves by ≤ 1). With ``groups = true``
it adds the per-group metrics below from the same per-sample results.

``autoattack_rounds = "final"`` (default) runs AutoAttack at the run's last round only
when ``eval.metrics_every`` asks for the evaluator every k rounds: per-round curves of the
cheap attacks, AutoAttack once (``robust/aa_skipped = 1`` in the other rounds, whose
``robust/worst`` is then over FGSM, PGD and CW∞).

``groups``: natural and PGD-20 accuracy per class-frequency group. Classes are grouped by
their training-set count n_c: Majority n_c > ``majority_min``, Minority n_c <
``minority_max``, Medium in between (150 / 45 as for CIFAR-100-LT in the FedCART paper).

ε defaults to 8/255 on colour data and 0.1 on grayscale (our choice, the
budgets common in the adversarial-training literature for CIFAR and MNIST-like data);
``max_samples`` evaluates a seeded random subset of the test set (for CPU runs), and
``autoattack_max_samples`` runs AutoAttack on a seeded random k of those (``robust/aa_n``);
Robust AVG then averages each attack's accuracy on its own samples.
Keys: ``robust/natural``, ``robust/fgsm``, ``robust/pgd20``, ``robust/cw``, ``robust/aa``,
``robust/avg``, ``robust/worst`` (``robust/worst_n`` samples),
``groups/<majority|medium|minority>/<natural|pgd20|worst|classes>``.
"""

from __future__ import annotations

import logging
import time
from typing import Any, Literal

import torch
from pydantic import Field, model_validator
from torch import Tensor, nn

from fedshield.adversarial import EVAL_ATTACKS, MissingDependencyError, robust_correct
from fedshield.adversarial.autoattack import MIN_CLASSES
from fedshield.core.context import derive_seed
from fedshield.core.params import Params, parse_params
from fedshield.errors import ConfigError
from fedshield.eval.base import EVALUATORS, EvalInputs

log = logging.getLogger("fedshield")

GROUPS = ("majority", "medium", "minority")
_AA_SUBSET = 0xAA  # purpose mixed into the seed of AutoAttack's subset


class GroupParams(Params):
    """Parameters of the ``groups`` evaluator (and the shared part of ``robust``)."""

    eps: float | None = Field(
        None, ge=0.0, description="L∞ budget (unset: 8/255 on colour, 0.1 on grayscale data)."
    )
    pgd_steps: int = Field(20, ge=1, description="Number of PGD steps of the robust accuracy.")
    pgd_alpha: float | None = Field(None, gt=0.0, description="PGD step size (unset: eps/4).")
    max_samples: int | None = Field(
        None, ge=1, description="Evaluate a seeded random subset of this many test samples."
    )
    batch_size: int = Field(256, ge=1, description="Batch size of the attacks and predictions.")
    seed: int | None = Field(
        None, ge=0, description="Seed of the attacks and the subset (unset: the run's seed)."
    )
    majority_min: int = Field(
        150, ge=0, description="A class is Majority when its training count exceeds this."
    )
    minority_max: int = Field(
        45, ge=0, description="A class is Minority when its training count is below this."
    )

    @model_validator(mode="after")
    def _thresholds(self) -> GroupParams:
        if self.minority_max > self.majority_min + 1:
            raise ValueError(
                f"minority_max={self.minority_max} must not exceed majority_min + 1 "
                f"({self.majority_min + 1}): the groups would overlap"
            )
        return self


class RobustParams(GroupParams):
    """Parameters of the ``robust`` evaluator."""

    fgsm: bool = Field(True, description="Report FGSM(ε) accuracy.")
    cw: bool = Field(True, description="Report CW∞ accuracy (PGD on the CW margin loss).")
    cw_steps: int = Field(30, ge=1, description="Number of steps of the CW∞ attack.")
    kappa: float = Field(50.0, ge=0.0, description="Confidence margin κ of the CW loss.")
    autoattack: bool = Field(
        True, description="Run AutoAttack; false skips it (it is slow on a CPU)."
    )
    autoattack_version: Literal["standard", "plus", "rand", "apgd"] = Field(
        "standard",
        description="AutoAttack version passed to torchattacks ('apgd': APGD-CE + APGD-T).",
    )
    autoattack_steps: int = Field(
        100, ge=1, description="Iterations of APGD-CE and APGD-T in version 'apgd'."
    )
    autoattack_rounds: Literal["final", "every"] = Field(
        "final",
        description="Run AutoAttack at the last round only ('final') or at every evaluation.",
    )
    autoattack_max_samples: int | None = Field(
        None, ge=1, description="Run AutoAttack on a seeded random k of the evaluated samples."
    )
    groups: bool = Field(False, description="Also report the per-group metrics.")


def default_eps(input_shape: tuple[int, ...]) -> float:
    return 0.1 if input_shape[0] == 1 else 8 / 255


def class_groups(counts: Tensor, majority_min: int, minority_max: int) -> dict[str, Tensor]:
    """Boolean class masks of the Majority / Medium / Minority groups from n_c."""
    major = counts > majority_min
    minor = counts < minority_max
    return {"majority": major, "medium": ~(major | minor), "minority": minor}


def group_accuracy(correct: Tensor, y: Tensor, mask: Tensor) -> float | None:
    """Accuracy over the samples whose class is in ``mask`` (None when there are none)."""
    sel = mask[y]
    return float(correct[sel].float().mean()) if bool(sel.any()) else None


def subset_indices(n: int, k: int | None, seed: int) -> Tensor:
    """Sorted indices of a seeded uniform random k-subset of range(n) (all when k ≥ n).

    Uniform, not a prefix: test sets are often stored class by class, so the first k
    samples would all belong to the first classes."""
    if k is None or k >= n:
        return torch.arange(n)
    g = torch.Generator().manual_seed(seed)
    return torch.sort(torch.randperm(n, generator=g)[:k]).values


def _test_set(inputs: EvalInputs, max_samples: int | None, seed: int) -> tuple[Tensor, Tensor]:
    test = inputs.bundle.test
    return test.batch(subset_indices(len(test), max_samples, seed), "cpu")


def _group_metrics(
    p: GroupParams,
    inputs: EvalInputs,
    y: Tensor,
    results: dict[str, Tensor],
    counts: bool = True,
) -> dict[str, float]:
    n_c = inputs.train.class_counts(inputs.bundle.num_classes).cpu()
    out: dict[str, float] = {}
    for name, mask in class_groups(n_c, p.majority_min, p.minority_max).items():
        if counts:
            out[f"groups/{name}/classes"] = float(mask.sum())
        for key, correct in results.items():
            acc = group_accuracy(correct, y, mask)
            if acc is not None:  # an empty group has no accuracy (and JSON has no NaN)
                out[f"groups/{name}/{key}"] = acc
    return out


def _pgd(p: GroupParams, eps: float, seed: int) -> Any:
    return EVAL_ATTACKS.build("pgd", eps=eps, alpha=p.pgd_alpha, steps=p.pgd_steps, seed=seed)


def _check_robust(p: RobustParams, num_classes: int) -> None:
    """AutoAttack's targeted attacks (APGD-T, FAB-T) read the 3rd and 4th largest logits:
    refused before training when the data has fewer classes, naming the key to turn off."""
    if p.autoattack and num_classes < MIN_CLASSES:
        raise ConfigError(
            f"eval.params.robust.autoattack: AutoAttack needs >= {MIN_CLASSES} classes (its "
            f"targeted DLR loss reads the 3rd and 4th largest logits); the data has "
            f"{num_classes}. Set eval.params.robust.autoattack = false"
        )


@EVALUATORS.register("robust", schema=RobustParams)
def robust(model: nn.Module, inputs: EvalInputs, **params: Any) -> dict[str, float]:
    """The robust evaluator reports natural, FGSM, PGD-20, CW∞, AutoAttack and Robust AVG
    accuracy of the inference model (FedCART paper).

    ``params`` are validated against :class:`RobustParams`, the schema the registry
    declares, so ``EVALUATORS.parse("robust", ...)`` at build time and this call accept and
    refuse the same tables."""
    p = parse_params(RobustParams, params, "eval.params.robust")
    assert isinstance(p, RobustParams)
    seed = inputs.seed if p.seed is None else p.seed
    eps = p.eps if p.eps is not None else default_eps(inputs.bundle.input_shape)
    x, y = _test_set(inputs, p.max_samples, seed)
    pgd_key = f"pgd{p.pgd_steps}"
    attacks: dict[str, Any] = {}
    if p.fgsm:
        attacks["fgsm"] = EVAL_ATTACKS.build("fgsm", eps=eps)
    attacks[pgd_key] = _pgd(p, eps, seed)
    if p.cw:
        attacks["cw"] = EVAL_ATTACKS.build(
            "cw", eps=eps, steps=p.cw_steps, kappa=p.kappa, seed=seed
        )
    out: dict[str, float] = {"robust/eps": eps, "robust/n": float(len(y))}
    if p.autoattack and (p.autoattack_rounds == "every" or inputs.final):
        try:
            attacks["aa"] = EVAL_ATTACKS.build(
                "autoattack", eps=eps, version=p.autoattack_version,
                steps=p.autoattack_steps, seed=seed,
            )  # fmt: skip
        except MissingDependencyError as err:
            log.warning("robust evaluation: AutoAttack skipped (%s)", err)
    if "aa" not in attacks:
        out["robust/aa_skipped"] = 1.0

    t0 = time.perf_counter()
    results = {"natural": robust_correct(model, x, y, None, batch_size=p.batch_size)}
    aa_idx = torch.arange(len(y))
    for name, attack in attacks.items():
        idx = torch.arange(len(y))
        if name == "aa":  # its own seeded subset of the evaluated samples
            idx = subset_indices(len(y), p.autoattack_max_samples, derive_seed(seed, _AA_SUBSET))
            aa_idx = idx
        results[name] = robust_correct(model, x[idx], y[idx], attack, batch_size=p.batch_size)
    if "aa" in results:
        out["robust/aa_n"] = float(len(results["aa"]))
    for name, correct in results.items():
        out[f"robust/{name}"] = float(correct.float().mean())
    robust_keys = [k for k in ("fgsm", "cw", pgd_key, "aa") if k in results]
    out["robust/avg"] = sum(out[f"robust/{k}"] for k in robust_keys) / len(robust_keys)
    worst = worst_case(results, aa_idx)
    out["robust/worst"] = float(worst.float().mean())
    out["robust/worst_n"] = float(len(worst))
    out["robust/wall_s"] = time.perf_counter() - t0
    if p.groups:
        per = {k: results[k] for k in ("natural", pgd_key)}
        out.update(_group_metrics(p, inputs, y, per))
        out.update(_group_metrics(p, inputs, y[aa_idx], {"worst": worst}, counts=False))
    return out


robust.check = _check_robust  # type: ignore[attr-defined]  # read by check_evaluators


def worst_case(results: dict[str, Tensor], subset: Tensor) -> Tensor:
    """Per sample of ``subset``: correct naturally and under every attack in ``results``
    (``aa`` holds its results on ``subset`` only, the others on every sample)."""
    worst = torch.ones(len(subset), dtype=torch.bool)
    for name, correct in results.items():
        worst &= correct if name == "aa" else correct[subset]
    return worst


@EVALUATORS.register("groups", schema=GroupParams)
def groups(model: nn.Module, inputs: EvalInputs, **params: Any) -> dict[str, float]:
    """The groups evaluator reports natural and PGD-20 accuracy per Majority / Medium /
    Minority class-frequency group (FedCART paper), with :class:`GroupParams` as its schema."""
    p = parse_params(GroupParams, params, "eval.params.groups")
    seed = inputs.seed if p.seed is None else p.seed
    eps = p.eps if p.eps is not None else default_eps(inputs.bundle.input_shape)
    x, y = _test_set(inputs, p.max_samples, seed)
    results = {
        "natural": robust_correct(model, x, y, None, batch_size=p.batch_size),
        f"pgd{p.pgd_steps}": robust_correct(
            model, x, y, _pgd(p, eps, seed), batch_size=p.batch_size
        ),
    }
    return _group_metrics(p, inputs, y, results)


__all__ = [
    "GroupParams",
    "RobustParams",
    "class_groups",
    "group_accuracy",
    "groups",
    "robust",
    "worst_case",
]
