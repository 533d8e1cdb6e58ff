"""Randomness of the randomised rules (DnC's coordinate draws, FLAME's noise) as a function of
the input.

A rule stays a pure function of its rows (the contract of :mod:`fedshield.aggregators.base`:
the same rows give the same result, in any order, after a checkpoint resume too), yet draws
fresh randomness every round: the generator is seeded with the configured ``seed`` and a
digest of the sorted float64 squared norms of the finite rows. Sorting makes it independent
of the row order; any change in any row changes it. An omniscient attacker who knows every
row can predict the draw, as it can predict every deterministic rule.
"""

from __future__ import annotations

import hashlib

import torch
from torch import Tensor


def input_generator(seed: int, sq_norms: Tensor, tag: str) -> torch.Generator:
    """A CPU generator seeded by ``seed``, ``tag`` (the rule) and the rows' ``sq_norms``."""
    digest = hashlib.blake2b(digest_size=8)
    digest.update(f"{tag}:{seed}:".encode())
    finite = sq_norms[torch.isfinite(sq_norms)]
    digest.update(finite.to(torch.float64).sort().values.cpu().numpy().tobytes())
    return torch.Generator().manual_seed(int.from_bytes(digest.digest(), "little") >> 1)


__all__ = ["input_generator"]
