"""Aggregation rules (SPEC §1–§5): pure functions of an ``[S, d]`` update matrix.

>>> import torch, fedshield.aggregators as agg
>>> agg.build("krum", f=2)(torch.randn(10, 5)).shape
torch.Size([5])

==================  ===========================================  ======================
name                rule                                          uses ``weights``
==================  ===========================================  ======================
mean                FedAvg weighted mean (§1)                     yes
drag                DRAG eq. 10–11 (§2), needs ``reference``      yes (None = paper)
brdrag              BR-DRAG eq. 15 (§3), needs ``reference``      no (1/S, eq. 15)
fltrust             FLTrust (§5), needs ``reference``             no (trust scores)
geomed / rfa        smoothed-Weiszfeld geometric median (§5)      yes
raga                geometric median, uniform (§5)                no
krum                Krum (Blanchard 2017)                         no (selection)
multikrum           Multi-Krum (Blanchard 2017)                   among the selected
median              coordinate-wise median (Yin 2018)             no
trimmed_mean        coordinate-wise trimmed mean (Yin 2018)       no
centered_clipping   Centered Clipping (Karimireddy 2021)          yes
==================  ===========================================  ======================
"""

from __future__ import annotations

import inspect
from typing import Any

from fedshield.aggregators import (  # noqa: F401  (importing registers the rules)
    brdrag,
    clipping,
    drag,
    fltrust,
    geomed,
    krum,
    mean,
    median,
    trimmed_mean,
)
from fedshield.aggregators.base import AGGREGATORS, Aggregator, Diagnostics
from fedshield.aggregators.brdrag import brdrag_calibrate
from fedshield.aggregators.drag import drag_calibrate
from fedshield.errors import ConfigError


def build(name: str, /, **kwargs: Any) -> Aggregator:
    """Construct the aggregator registered as ``name`` from its hyper-parameters.

    Unknown names raise the registry's error (which lists the known names); unknown
    hyper-parameters raise :class:`ConfigError` listing the accepted ones.
    """
    cls = AGGREGATORS.get(name)
    accepted = [p for p in inspect.signature(cls).parameters if p != "self"]
    unknown = sorted(set(kwargs) - set(accepted))
    if unknown:
        raise ConfigError(
            f"aggregator {name!r}: unknown parameter(s) {', '.join(unknown)}; "
            f"accepted: {', '.join(accepted) or '(none)'}"
        )
    return cls(**kwargs)


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
