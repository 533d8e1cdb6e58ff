"""Vectorised cohorts (``run.vectorize``): a round's clients trained as one batched
computation with ``torch.func`` (see :mod:`.trainer`; support checks in :mod:`.support`,
per-client random streams in :mod:`.rng`)."""

from fedshield.sim.vectorized.support import (
    probe,
    require_vectorizable,
    trainer_for,
    why_sequential,
)
from fedshield.sim.vectorized.trainer import VectorizedTrainer

__all__ = ["VectorizedTrainer", "probe", "require_vectorizable", "trainer_for", "why_sequential"]
