"""Callbacks around the round loop (pfl-research's ``after_central_iteration`` style).

A round's body (:meth:`Simulator.end_round`) only changes the model: update attack, upload
checks, server step. Everything around it is a :class:`Callback` run by
:meth:`Simulator.record` after every round, in order — on the simulator and on the Flower
strategy alike, so both backends write the same files:

1. :class:`Evaluation` — test accuracy/loss every ``eval.every`` rounds and the registered
   evaluators (``eval.metrics``) when due; wall times they report go to timing, not metrics;
2. :class:`MetricsFiles` — ``metrics.jsonl`` (a pure function of config and seed) and
   ``timing.jsonl`` (wall times);
3. :class:`Checkpointing` — an atomic checkpoint every ``checkpoint.every`` rounds;
4. whatever the caller adds (a progress bar, experiment trackers, ...).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from fedshield.config import ExperimentConfig
    from fedshield.sim.checkpoint import JsonlLog
    from fedshield.sim.state import RunState

Record = dict[str, Any]


class RunView(Protocol):
    """What a callback may read and call of the run it is attached to (the simulator, also
    inside the Flower strategy): callbacks, trackers and the privacy accountant depend on
    this, not on the whole :class:`~fedshield.sim.engine.Simulator`."""

    cfg: ExperimentConfig
    out: Path | None
    config_text: str
    records: list[Record]
    state: RunState
    metrics: JsonlLog | None
    timing: JsonlLog | None

    def evaluate(self) -> dict[str, float]: ...

    def evaluate_extra(self, rnd: int) -> dict[str, float]: ...

    def save(self) -> None: ...


def is_timing_key(key: str) -> bool:
    """Wall-clock quantities never enter metrics.jsonl (they differ between identical runs)."""
    return key.endswith("wall_s") or key.startswith("time/")


class Callback:
    """Hooks around the round loop; every method is optional."""

    def on_run_start(self, sim: RunView) -> None:
        """Before the first round of this session (after a resume: the next round)."""

    def after_round(self, sim: RunView, record: Record, timing: Record) -> None:
        """After round ``record["round"]``; may add entries to ``record`` / ``timing``."""

    def on_run_end(self, sim: RunView, summary: dict[str, Any]) -> None:
        """After the last round, with the run's summary."""


class Evaluation(Callback):
    def after_round(self, sim: RunView, record: Record, timing: Record) -> None:
        cfg = sim.cfg
        rnd = record["round"]
        t0 = time.perf_counter()
        ran = False
        if rnd % cfg.eval.every == 0 or rnd == cfg.rounds:
            record.update(sim.evaluate())
            ran = True
        every = cfg.eval.metrics_every
        if cfg.eval.metrics and (rnd == cfg.rounds or (every and rnd % every == 0)):
            for k, v in sim.evaluate_extra(rnd).items():
                (timing if is_timing_key(k) else record)[k] = v
            ran = True
        if ran:
            timing["eval_wall_s"] = time.perf_counter() - t0


class MetricsFiles(Callback):
    def after_round(self, sim: RunView, record: Record, timing: Record) -> None:
        if sim.metrics is not None and sim.timing is not None:
            sim.metrics.append(record)
            sim.timing.append(timing)


class Checkpointing(Callback):
    def after_round(self, sim: RunView, record: Record, timing: Record) -> None:
        rnd = record["round"]
        if sim.out is not None and (rnd % sim.cfg.checkpoint.every == 0 or rnd == sim.cfg.rounds):
            sim.save()


class OnRound(Callback):
    """Calls ``fn(record)`` after every round (a progress bar's update), or
    ``fn(record, wall_s=...)`` when ``fn`` takes the round's wall time."""

    def __init__(self, fn: Callable[..., None]) -> None:
        from fedshield.core.callables import accepts

        self.fn = fn
        self.timed = accepts(fn, "wall_s")

    def after_round(self, sim: RunView, record: Record, timing: Record) -> None:
        if self.timed:
            self.fn(record, wall_s=timing["wall_s"])
        else:
            self.fn(record)


def default_callbacks() -> list[Callback]:
    return [Evaluation(), MetricsFiles(), Checkpointing()]


__all__ = [
    "Callback",
    "Checkpointing",
    "Evaluation",
    "MetricsFiles",
    "OnRound",
    "default_callbacks",
    "is_timing_key",
]
