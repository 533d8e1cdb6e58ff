"""Seed purposes and cohort sampling: the streams every backend derives from (seed, round).

The simulator, the batched trainer, the Flower strategies and the privacy mechanisms all
draw from these, so the same (config, seed) gives the same cohorts, batches and root-data
steps on every backend. A purpose is mixed into each derived seed so streams never collide.
"""

from __future__ import annotations

import numpy as np

#: purposes mixed into derived seeds
COHORT, BYZ, TORCH, BATCH, ATTACK, ROOT, FAULTS = range(7)


def sample_cohort(seed: int, rnd: int, num_clients: int, per_round: int) -> tuple[int, ...]:
    """S of M clients uniformly without replacement, seeded by (seed, round) (DRAG paper, Sec.
    II-A; a run is a pure function of config and seed)."""
    rng = np.random.default_rng([seed, rnd, COHORT])
    return tuple(sorted(int(k) for k in rng.choice(num_clients, per_round, replace=False)))


def sample_available(
    seed: int, rnd: int, available: tuple[int, ...], per_round: int
) -> tuple[int, ...]:
    """S of the ``available`` clients (sorted ids) from the same (seed, round) stream as
    :func:`sample_cohort`, which it equals when every client is available (numpy draws the
    same positions from an array as from ``range``); all of them when fewer than S are."""
    if len(available) <= per_round:
        return tuple(available)
    rng = np.random.default_rng([seed, rnd, COHORT])
    pool = np.asarray(available, dtype=np.int64)
    return tuple(sorted(int(k) for k in rng.choice(pool, per_round, replace=False)))


__all__ = [
    "ATTACK",
    "BATCH",
    "BYZ",
    "COHORT",
    "FAULTS",
    "ROOT",
    "TORCH",
    "sample_available",
    "sample_cohort",
]
