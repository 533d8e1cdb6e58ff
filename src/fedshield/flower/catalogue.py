"""The catalogue of named Flower-native strategies: each fixes fedshield's server algorithm
or aggregator (and takes the other from ``**kwargs``); a hyper-parameter left None takes the
registry's default (for a rule's Byzantine count f: derived, see
:mod:`fedshield.aggregators.byzantine_count`). All of them are
:class:`~fedshield.flower.adapter.FedshieldRule`, so every reply goes through the one server
round step (:mod:`fedshield.algorithms.server.step`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from torch import nn

from fedshield.flower.adapter import FedshieldRule, RootTrainParams


def _given(**kwargs: Any) -> dict[str, Any]:
    """The keyword arguments that were set (None: the registry's default)."""
    return {k: v for k, v in kwargs.items() if v is not None}




class DRAG(FedshieldRule):
    """DRAG (DRAG paper, Sec. III): calibrate every g_m towards the momentum reference r^t (eqs.
    8–11)."""

    def __init__(
        self,
        alpha: float | None = None,
        c: float | None = None,
        *,
        client_calibration: bool = False,
        **kwargs: Any,
    ) -> None:
        super().__init__(
            aggregator=kwargs.pop("aggregator", "drag"),
            aggregator_args=_given(c=c) | dict(kwargs.pop("aggregator_args", {})),
            server="drag",
            server_args=_given(alpha=alpha),
            client_calibration=client_calibration,
            **kwargs,
        )


class BRDRAG(FedshieldRule):
    """BR-DRAG (DRAG paper, Sec. IV): root-data reference r^t, updates rescaled to ‖r‖ and pulled
    towards r (eq. 15). Needs ``reference_fn`` or ``root_data`` + ``model_fn``."""

    def __init__(self, c: float | None = None, **kwargs: Any) -> None:
        super().__init__(
            aggregator="brdrag", aggregator_args=_given(c=c), server="brdrag", **kwargs
        )


class FLTrust(FedshieldRule):
    """FLTrust (DRAG paper, Sec. VI-B): ReLU-cosine trust scores against the root-data reference.
    Needs ``reference_fn`` or ``root_data`` + ``model_fn``."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(aggregator="fltrust", server="fltrust", **kwargs)


class FedExP(FedshieldRule):
    """FedExP (DRAG paper, Sec. VI-A): extrapolated server step η_g = max{1, Σ‖g‖²/(2S(‖Δ‖² +
    ε))}."""

    def __init__(self, eps: float | None = None, **kwargs: Any) -> None:
        super().__init__(server="fedexp", server_args=_given(eps=eps), **kwargs)


class FedACG(FedshieldRule):
    """FedACG (DRAG paper, Sec. VI-A): broadcast the look-ahead θ̂ = θ + λm; m ← λm + Δ. Clients
    train from the arrays they receive (θ̂); add β/2‖θ − θ̂‖² to their loss for the full method."""

    def __init__(self, lam: float | None = None, **kwargs: Any) -> None:
        super().__init__(server="fedacg", server_args=_given(lam=lam), **kwargs)


class SCAFFOLD(FedshieldRule):
    """SCAFFOLD (DRAG paper, Sec. VI-A): broadcasts h (``fs.h``); clients correct their gradients
    with :class:`fedshield.flower.client_tools.ScaffoldClient` and upload Δh (``fs.dh``)."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(server="scaffold", **kwargs)


class FedDyn(FedshieldRule):
    """FedDyn (Acar et al. 2021): h ← h − α(m/M)Δ, θ ← θ + Δ − h/α; broadcasts α
    (``fs.alpha``); clients add the dynamic regulariser with
    :class:`fedshield.flower.client_tools.AlgorithmClient` ``("feddyn", ...)``."""

    def __init__(self, alpha: float | None = None, **kwargs: Any) -> None:
        super().__init__(server="feddyn", server_args=_given(alpha=alpha), **kwargs)


class FedCART(FedshieldRule):
    """FedCART's server (FedCART paper): the configured rule on Δθ and, class by class, on the
    clients' gradient prototypes, then the CART step (virtual features matched to the
    prototypes, h' re-trained on them). ``model_fn`` builds the clients' ``DualHead``
    model; clients train with :class:`fedshield.flower.client_tools.FedCARTTrainer`.
    ``server_args``: the FedCART server parameters (``match_iters``, ``retrain_steps``,
    ``num_virtual``, ``cart``, ``aux_head``, ...)."""

    def __init__(self, model_fn: Callable[[], nn.Module], **kwargs: Any) -> None:
        super().__init__(server="fedcart", model_fn=model_fn, **kwargs)


class Krum(FedshieldRule):
    """Krum (Blanchard et al. 2017): the update closest to its S − f − 2 neighbours."""

    def __init__(self, f: int | None = None, **kwargs: Any) -> None:
        super().__init__(aggregator="krum", aggregator_args=_given(f=f), **kwargs)


class MultiKrum(FedshieldRule):
    """Multi-Krum: the mean of the m updates with the best Krum scores."""

    def __init__(self, f: int | None = None, m: int | None = None, **kwargs: Any) -> None:
        super().__init__(aggregator="multikrum", aggregator_args=_given(f=f, m=m), **kwargs)


class Median(FedshieldRule):
    """Coordinate-wise median (Yin et al. 2018)."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(aggregator="median", **kwargs)


class TrimmedMean(FedshieldRule):
    """Coordinate-wise trimmed mean (Yin et al. 2018): drop the f largest and f smallest."""

    def __init__(self, f: int | None = None, **kwargs: Any) -> None:
        super().__init__(aggregator="trimmed_mean", aggregator_args=_given(f=f), **kwargs)


class Bulyan(FedshieldRule):
    """Bulyan with Krum (El Mhamdi et al. 2018), S ≥ 4f + 3."""

    def __init__(self, f: int | None = None, **kwargs: Any) -> None:
        super().__init__(aggregator="bulyan", aggregator_args=_given(f=f), **kwargs)


class _GeoMedFamily(FedshieldRule):
    _rule = "geomed"

    def __init__(
        self,
        nu: float | None = None,
        max_iter: int | None = None,
        tol: float | None = None,
        init: str | None = None,
        **kwargs: Any,
    ) -> None:
        args = _given(nu=nu, max_iter=max_iter, tol=tol, init=init)
        super().__init__(aggregator=self._rule, aggregator_args=args, **kwargs)


class GeoMed(_GeoMedFamily):
    """Geometric median by smoothed Weiszfeld (DRAG paper, Sec. VI-B), weighted as ``weighting``
    says."""


class RFA(_GeoMedFamily):
    """RFA (Pillutla et al. 2022): the geometric median weighted by the sample counts
    (uniform under ``weighting="uniform"``, the default for a robust rule)."""

    _rule = "rfa"


class RAGA(_GeoMedFamily):
    """RAGA: the uniform geometric median (DRAG paper, Sec. VI-B)."""

    _rule = "raga"


class CenteredClipping(FedshieldRule):
    """Centered Clipping (Karimireddy et al. 2021): clip around the previous aggregate,
    kept in the strategy's state across rounds."""

    def __init__(self, tau: float | None = None, iters: int | None = None, **kwargs: Any) -> None:
        args = _given(tau=tau, iters=iters)
        super().__init__(aggregator="centered_clipping", aggregator_args=args, **kwargs)


class NormClip(FedshieldRule):
    """Norm clipping: clip every update to norm τ, then the mean."""

    def __init__(self, tau: float | None = None, **kwargs: Any) -> None:
        super().__init__(aggregator="norm_clip", aggregator_args=_given(tau=tau), **kwargs)


class MDA(FedshieldRule):
    """Minimum Diameter Averaging (El Mhamdi et al. 2020): the mean of the S − f closest-knit
    updates."""

    def __init__(self, f: int | None = None, **kwargs: Any) -> None:
        super().__init__(aggregator="mda", aggregator_args=_given(f=f), **kwargs)


class MeaMed(FedshieldRule):
    """MeaMed (Xie et al. 2018): per coordinate, the mean of the S − f values closest to the
    median."""

    def __init__(self, f: int | None = None, **kwargs: Any) -> None:
        super().__init__(aggregator="meamed", aggregator_args=_given(f=f), **kwargs)


class MoNNA(FedshieldRule):
    """MoNNA (Farhadkhani et al. 2023): the mean of the S − f updates nearest to the server's
    root-data update (``root_data``, as FLTrust)."""

    def __init__(self, f: int | None = None, **kwargs: Any) -> None:
        super().__init__(aggregator="monna", aggregator_args=_given(f=f), **kwargs)


class CAF(FedshieldRule):
    """CAF (Allouah et al. 2025): the covariance-bound agnostic filter."""

    def __init__(
        self,
        f: int | None = None,
        power_iters: int | None = None,
        seed: int | None = None,
        **kwargs: Any,
    ) -> None:
        args = _given(f=f, power_iters=power_iters, seed=seed)
        super().__init__(aggregator="caf", aggregator_args=args, **kwargs)


class SMEA(FedshieldRule):
    """SMEA (Allouah et al. 2023): the mean of the S − f updates whose covariance has the
    smallest top eigenvalue."""

    def __init__(
        self,
        f: int | None = None,
        power_iters: int | None = None,
        seed: int | None = None,
        max_subsets: int | None = None,
        **kwargs: Any,
    ) -> None:
        args = _given(f=f, power_iters=power_iters, seed=seed, max_subsets=max_subsets)
        super().__init__(aggregator="smea", aggregator_args=args, **kwargs)


class DnC(FedshieldRule):
    """DnC (Shejwalkar & Houmansadr 2021): drop the outliers along the top singular direction
    of random coordinate subsets, average the rest."""

    def __init__(
        self,
        f: int | None = None,
        niters: int | None = None,
        sub_dim: int | None = None,
        c: float | None = None,
        seed: int | None = None,
        **kwargs: Any,
    ) -> None:
        args = _given(f=f, niters=niters, sub_dim=sub_dim, c=c, seed=seed)
        super().__init__(aggregator="dnc", aggregator_args=args, **kwargs)


class SignGuard(FedshieldRule):
    """SignGuard (Xu et al. 2022): norm filter and sign-statistics clustering, then the mean
    clipped to the median norm."""

    def __init__(
        self, lower: float | None = None, upper: float | None = None, **kwargs: Any
    ) -> None:
        args = _given(lower=lower, upper=upper)
        super().__init__(aggregator="signguard", aggregator_args=args, **kwargs)


class ClippedClustering(FedshieldRule):
    """Clipped Clustering (Li et al. 2023): clip to the median of the norm history, keep the
    larger of two cosine clusters."""

    def __init__(self, max_tau: float | None = None, **kwargs: Any) -> None:
        args = _given(max_tau=max_tau)
        super().__init__(aggregator="clippedclustering", aggregator_args=args, **kwargs)


class RLR(FedshieldRule):
    """Robust learning rate (Ozdayi et al. 2021): the mean, negated where fewer than θ
    clients agree on the sign."""

    def __init__(self, theta: int | None = None, **kwargs: Any) -> None:
        super().__init__(aggregator="rlr", aggregator_args=_given(theta=theta), **kwargs)


class FLAME(FedshieldRule):
    """FLAME (Nguyen et al. 2022): HDBSCAN on cosine distances, clip to the median norm, add
    Gaussian noise."""

    def __init__(self, noise: float | None = None, seed: int | None = None, **kwargs: Any):
        args = _given(noise=noise, seed=seed)
        super().__init__(aggregator="flame", aggregator_args=args, **kwargs)


class FoolsGold(FedshieldRule):
    """FoolsGold (Fung et al. 2020): every update weighted down by its largest cosine
    similarity to another, on the round's updates."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(aggregator="foolsgold", **kwargs)


__all__ = [
    "BRDRAG",
    "CAF",
    "DRAG",
    "FLAME",
    "FoolsGold",
    "MDA",
    "RLR",
    "SMEA",
    "RAGA",
    "RFA",
    "SCAFFOLD",
    "Bulyan",
    "CenteredClipping",
    "ClippedClustering",
    "DnC",
    "FLTrust",
    "FedACG",
    "FedCART",
    "FedDyn",
    "FedExP",
    "FedshieldRule",
    "GeoMed",
    "Krum",
    "MeaMed",
    "Median",
    "MoNNA",
    "MultiKrum",
    "NormClip",
    "RootTrainParams",
    "SignGuard",
    "TrimmedMean",
]
