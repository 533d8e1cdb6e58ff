"""Routing metrics: accuracy, exit histogram, depth saving and the accept/defer risk
decomposition (early-exit ViT paper, eqs. 13–14, and eq. 17 for the depth proxy).

For exit e < L, among the samples that reach e: A_e are accepted there, D_e deferred to
e + 1. The two-stage risk is Pr(A_e) 𝓔_{e|A_e} + Pr(D_e) 𝓔_{e+1|D_e}; deferral lowers it
exactly when 𝓔_{e+1|D_e} < 𝓔_{e|D_e}, so both are reported.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from fedshield.routing.policies import ExitProbs, stack_exits


def _error(wrong: Tensor, subset: Tensor) -> float:
    """Misclassification rate on a subset; NaN when it is empty (the rate is undefined)."""
    n = int(subset.sum())
    return float((wrong & subset).sum()) / n if n else float("nan")


@dataclass(frozen=True)
class ExitDecomposition:
    """Accept/defer statistics at one exit e < L (``exit`` is 1-based)."""

    exit: int
    reached: int  # |A_e ∪ D_e|
    accepted: int  # |A_e|
    deferred: int  # |D_e|
    err_accepted: float  # 𝓔_{e|A_e}
    err_deferred_here: float  # 𝓔_{e|D_e}: had the deferred samples exited at e
    err_deferred_next: float  # 𝓔_{e+1|D_e}: what exit e + 1 does on them

    @property
    def deferral_gain(self) -> float:
        """Pr(D_e)(𝓔_{e|D_e} − 𝓔_{e+1|D_e}) among samples reaching e: > 0 ⇔ deferring helped."""
        if self.deferred == 0:
            return 0.0
        return self.deferred / self.reached * (self.err_deferred_here - self.err_deferred_next)


@dataclass(frozen=True)
class RoutingMetrics:
    accuracy: float
    exit_counts: list[int]  # samples leaving at each exit, index 0 = exit 1
    exit_accuracy: list[float]  # accuracy of each exit on all samples
    avg_depth: float  # ē = mean 1-based exit index
    depth_saving: float  # 1 − ē / L
    decomposition: list[ExitDecomposition]  # exits 1..L-1

    def as_dict(self, prefix: str = "route") -> dict[str, float]:
        """One flat dict with namespaced keys, as the metrics log expects."""
        n = sum(self.exit_counts)
        out = {
            f"{prefix}/acc": self.accuracy,
            f"{prefix}/avg_depth": self.avg_depth,
            f"{prefix}/depth_saving": self.depth_saving,
        }
        for e, (count, acc) in enumerate(zip(self.exit_counts, self.exit_accuracy), start=1):
            out[f"{prefix}/exit/{e}/frac"] = count / n if n else float("nan")
            out[f"{prefix}/exit/{e}/acc"] = acc
        for dec in self.decomposition:
            key = f"{prefix}/exit/{dec.exit}"
            out[f"{key}/err_accepted"] = dec.err_accepted
            out[f"{key}/err_deferred_here"] = dec.err_deferred_here
            out[f"{key}/err_deferred_next"] = dec.err_deferred_next
            out[f"{key}/deferral_gain"] = dec.deferral_gain
        return out


def routing_metrics(probs: ExitProbs, labels: Tensor, exit_idx: Tensor) -> RoutingMetrics:
    """Metrics of a routing decision ``exit_idx`` (0-based, as returned by ``route``)."""
    p = stack_exits(probs)
    num_exits, n = p.shape[0], p.shape[1]
    labels = labels.to(p.device)
    exit_idx = exit_idx.to(p.device)
    if labels.shape != (n,) or exit_idx.shape != (n,):
        raise ValueError(f"labels and exit_idx must be [{n}]")
    if n and not (int(exit_idx.min()) >= 0 and int(exit_idx.max()) < num_exits):
        raise ValueError(f"exit_idx must be 0-based exit indices in 0..{num_exits - 1}")
    wrong = p.argmax(dim=-1) != labels  # [L, N]: would exit e misclassify sample i?
    routed_wrong = wrong.gather(0, exit_idx[None]).squeeze(0)
    counts = torch.bincount(exit_idx, minlength=num_exits)
    avg_depth = float((exit_idx + 1).double().mean()) if n else float("nan")

    decomposition = []
    for e in range(num_exits - 1):  # 0-based e; the decomposition needs a next exit
        accepted, deferred = exit_idx == e, exit_idx > e
        decomposition.append(
            ExitDecomposition(
                exit=e + 1,
                reached=int((exit_idx >= e).sum()),
                accepted=int(accepted.sum()),
                deferred=int(deferred.sum()),
                err_accepted=_error(wrong[e], accepted),
                err_deferred_here=_error(wrong[e], deferred),
                err_deferred_next=_error(wrong[e + 1], deferred),
            )
        )
    return RoutingMetrics(
        accuracy=1 - float(routed_wrong.double().mean()) if n else float("nan"),
        exit_counts=counts.tolist(),
        exit_accuracy=[1 - float(w.double().mean()) if n else float("nan") for w in wrong],
        avg_depth=avg_depth,
        depth_saving=1 - avg_depth / num_exits,
        decomposition=decomposition,
    )


__all__ = ["ExitDecomposition", "RoutingMetrics", "routing_metrics"]
