"""Long-tailed transform of a training set (docs/usage.md; Cao et al. 2019 profile).

Class 0 is always the head: n_c = ⌊n_max · ρ^{−c/(C−1)}⌋. On a source whose classes are
unequal (SVHN), n_max is the largest head size every class can meet,
n_max = min_c count_c · ρ^{c/(C−1)}, so n_0/n_{C−1} = ρ up to flooring and the counts
decrease with c whatever the source's own class sizes are.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch

from fedshield.data.bundle import TensorData
from fedshield.errors import ConfigError, DataError

# Guards floor() against 3236.9999 from float pow (and min() against 4947.9999).
_EPS = 1e-9


def _exponent(c: int, num_classes: int) -> float:
    return c / (num_classes - 1) if num_classes > 1 else 0.0


def long_tail_counts(n_max: int, num_classes: int, rho: float) -> list[int]:
    """n_c = floor(n_max · rho^(−c/(C−1))), c = 0..C−1 (docs/usage.md).

    CIFAR-10 with n_max = 5000 and rho = 50 gives [5000, 3237, ..., 100] (13,996 in all).
    """
    if not rho >= 1:
        raise ConfigError(f"data.long_tail.rho must be >= 1, got {rho}")
    return [
        int(math.floor(n_max * rho ** (-_exponent(c, num_classes)) + _EPS))
        for c in range(num_classes)
    ]


def long_tail_n_max(counts: Sequence[int], rho: float) -> int:
    """The head size n_max = ⌊min_c count_c · ρ^{c/(C−1)}⌋: the largest n_max whose profile
    :func:`long_tail_counts` every class can supply (n_c ≤ count_c for all c).

    SVHN's train counts [4948, 13861, 10585, ...] with ρ = 50 give class 0's 4,948; a
    balanced source gives its class size."""
    if not rho >= 1:
        raise ConfigError(f"data.long_tail.rho must be >= 1, got {rho}")
    num_classes = len(counts)
    return int(
        math.floor(min(n * rho ** _exponent(c, num_classes) for c, n in enumerate(counts)) + _EPS)
    )


def make_long_tail(data: TensorData, num_classes: int, rho: float, seed: int) -> TensorData:
    """Keep n_c samples of class c, chosen by a seeded shuffle (head = class 0, docs/usage.md).

    Every class must be present: an absent class would make the whole profile empty."""
    counts = data.class_counts(num_classes).tolist()
    missing = [c for c, n in enumerate(counts) if n == 0]
    if missing:
        raise DataError(
            f"data.long_tail: class {missing[0]} has no training sample, so no long-tailed "
            f"profile with head class 0 exists ({len(missing)} of {num_classes} classes empty)"
        )
    target = long_tail_counts(long_tail_n_max(counts, rho), num_classes, rho)
    g = torch.Generator().manual_seed(seed)
    keep = []
    for c in range(num_classes):
        idx = torch.nonzero(data.y == c, as_tuple=True)[0]
        idx = idx[torch.randperm(len(idx), generator=g)]
        keep.append(idx[: target[c]])
    return data.subset(torch.sort(torch.cat(keep)).values)
