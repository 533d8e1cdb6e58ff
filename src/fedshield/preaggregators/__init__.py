"""Pre-aggregators (Allouah et al. 2023 NNM, Karimireddy et al. 2022 Bucketing, ARC,
static clipping): pure transformations of the ``[n, d]`` update rows that compose in front
of any aggregation rule.

>>> import torch, fedshield.aggregators as agg, fedshield.preaggregators as pre
>>> rule = pre.compose(["nnm"], {"nnm": {"f": 2}}, agg.build("krum", f=2))
>>> rule(torch.randn(10, 5)).shape
torch.Size([5])

Configured as ``server.pre_aggregators = ["nnm", "bucketing"]`` with
``server.pre_aggregator_args = {nnm = {f = 2}, bucketing = {s = 2}}``; the builder wraps the
rule in a :class:`ComposedRule` (``fedshield list pre-aggregators``).

==========  ===========================================================  ==============
name        what reaches the rule                                        ByzFL 0.0.11
==========  ===========================================================  ==============
nnm         each row → mean of its n − f nearest rows                    ``NNM(f)``
bucketing   ⌈n/s⌉ means of random buckets of s rows                      ``Bucketing(s)``
arc         the ⌊2f(n − f)/n⌋ largest rows clipped to the next norm      ``ARC(f)``
clip        every row clipped to norm c                                  ``Clipping(c)``
==========  ===========================================================  ==============
"""

from __future__ import annotations

from typing import Any

from fedshield._plugins import import_submodules
from fedshield.preaggregators.base import PRE_AGGREGATORS, PreAggregator
from fedshield.preaggregators.composed import ComposedRule, compose

import_submodules(__name__)


def build(name: str, /, **params: Any) -> PreAggregator:
    """The pre-aggregator registered as ``name`` (parameters validated by its schema)."""
    return PRE_AGGREGATORS.build(name, **params)


def names() -> list[str]:
    """Registered pre-aggregator names, sorted."""
    return PRE_AGGREGATORS.names()


__all__ = ["PRE_AGGREGATORS", "ComposedRule", "PreAggregator", "build", "compose", "names"]
