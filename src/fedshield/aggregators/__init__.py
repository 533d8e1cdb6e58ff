"""Aggregation rules (DRAG paper, Secs. II-A, III, IV, VI; docs/defenses.md; docs/security.md):
pure functions of an ``[S, d]`` update matrix.

>>> import torch, fedshield.aggregators as agg
>>> agg.build("krum", f=2)(torch.randn(10, 5)).shape
torch.Size([5])

Every rule is a registry entry with a typed parameter schema and tags (``fedshield list
aggregators``); the constructors (``Krum(f=2)``) and :func:`build` validate through the same
schema. Every rule returns a finite result in the input dtype for finite rows of any size
(geometry in float64, see :mod:`fedshield.aggregators._ops`) and drops rows holding NaN/Inf
(``agg/nonfinite``), except where the table says otherwise. :meth:`Aggregator.adapted` gives
the rule to run on fewer rows than configured (a smaller f, or None).

==================  ==============================================  ==========================
name                rule                                            tags
==================  ==============================================  ==========================
mean                FedAvg weighted mean                            uses_weights,
                                                                    reference_free
drag                DRAG eq. 10–11; weights=None is the paper       needs_reference,
                                                                    uses_weights
brdrag              BR-DRAG eq. 15, 1/S; NaN/Inf row → r            robust, needs_reference
fltrust             FLTrust; NaN/Inf row → trust 0                  robust, needs_reference
geomed              smoothed-Weiszfeld geometric median             robust, reference_free,
                                                                    uses_weights
rfa                 geometric median weighted by n_m                + sample_weighted
raga                geometric median, uniform                       robust, reference_free
krum                Krum (Blanchard 2017), S > 2f + 2               robust, reference_free,
                                                                    min_clients
multikrum           Multi-Krum: weighted mean of the m best         robust, reference_free,
                                                                    uses_weights, min_clients
median              coordinate-wise median (Yin 2018)               robust, reference_free
trimmed_mean        coordinate-wise trimmed mean (Yin 2018), 2f<S   robust, reference_free,
                                                                    min_clients
centered_clipping   Centered Clipping (Karimireddy 2021); centre =  robust, needs_center,
                    ``reference`` = previous aggregate (0 first)    uses_weights
norm_clip           clip each update to norm τ, weighted mean       robust, uses_weights
bulyan              Bulyan with Krum (El Mhamdi 2018), S ≥ 4f + 3   robust, reference_free,
                                                                    min_clients
mda                 Minimum Diameter Averaging (El Mhamdi 2020),    robust, reference_free,
                    exact search, 2f < S                            min_clients
meamed              mean around the median (Xie 2018), 2f < S       robust, reference_free,
                                                                    min_clients
monna               MoNNA (Farhadkhani 2023): mean of the S − f     robust, needs_reference,
                    rows nearest to the root-data reference r       min_clients
caf                 covariance-bound agnostic filter (Allouah       robust, reference_free,
                    2025), 2f < S                                   min_clients
smea                smallest max-eigenvalue averaging (Allouah      robust, reference_free,
                    2023), 2f < S                                   min_clients
dnc                 Divide-and-Conquer (Shejwalkar 2021): SVD       robust, reference_free,
                    outlier scores on random coordinates, 2f < S    min_clients
signguard           SignGuard (Xu 2022): norm filter + sign         robust, reference_free
                    clustering, clipped mean
clippedclustering   Clipped Clustering (Li 2023): clip to the       robust
                    median norm history, larger cosine cluster
rlr                 robust learning rate (Ozdayi 2021): mean,       uses_weights,
                    negated where sign agreement < θ                reference_free
flame               FLAME (Nguyen 2022): HDBSCAN on cosines, clip   robust, reference_free
                    to the median norm, noise λ·S_t
foolsgold           FoolsGold (Fung 2020) on the round's updates:   reference_free
                    weights from max cosine, pardoned, logit
==================  ==============================================  ==========================
"""

from __future__ import annotations

from typing import Any

from fedshield._plugins import import_submodules
from fedshield.aggregators.base import AGGREGATORS, Aggregator, Diagnostics
from fedshield.aggregators.brdrag import brdrag_calibrate
from fedshield.aggregators.drag import drag_calibrate

import_submodules(__name__)


def build(name: str, /, **kwargs: Any) -> Aggregator:
    """Construct the aggregator registered as ``name`` from its hyper-parameters.

    Goes through the registry: unknown names raise its error (listing the known names),
    unknown or invalid hyper-parameters a :class:`~fedshield.errors.ConfigError` naming the
    key (with a did-you-mean). ``None`` values take the defaults.
    """
    return AGGREGATORS.build(name, **kwargs)


def names() -> list[str]:
    """Registered aggregator names, sorted."""
    return AGGREGATORS.names()


__all__ = [
    "AGGREGATORS",
    "Aggregator",
    "Diagnostics",
    "brdrag_calibrate",
    "build",
    "drag_calibrate",
    "names",
]
