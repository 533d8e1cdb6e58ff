"""The round progress bar of ``fedshield run``, one definition for both backends.

``round_columns()`` is the bar's layout: run name, bar, rounds done/total, the last
evaluated test accuracy (live metrics), the last round's wall time, elapsed time and ETA.
:class:`RoundProgress` drives it from the per-round callback that both the simulator
(``Simulator.run(on_round)``) and the Flower strategy call after each round.
"""

from __future__ import annotations

import time
from types import TracebackType
from typing import Any

from rich.console import Console
from rich.progress import (
    BarColumn,
    Progress,
    ProgressColumn,
    TaskID,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)


def round_columns() -> list[ProgressColumn]:
    """Columns of the round bar (fields ``acc`` and ``last`` are set by RoundProgress)."""
    return [
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        TextColumn("{task.completed}/{task.total}"),
        TextColumn("{task.fields[acc]}"),
        TextColumn("{task.fields[last]}"),
        TimeElapsedColumn(),
        TextColumn("eta"),
        TimeRemainingColumn(),
    ]


def format_round(m: dict[str, Any], previous_acc: str = "") -> str:
    """The live-metrics field: the round's test accuracy, or the last one shown."""
    return f"acc {m['test_acc']:.4f}" if "test_acc" in m else previous_acc


class RoundProgress:
    """A rich round bar as a context manager; pass :meth:`on_round` as the run's callback.

    ``on_round(m, wall_s)`` takes the round's metrics and, when the caller measured it, the
    round's wall time (the Flower strategy does); without it the time since the previous
    callback is shown. The first callback may come at any round (a resumed run): ETA is
    estimated from the rounds run in this session only.
    """

    def __init__(
        self,
        name: str,
        total: int,
        *,
        console: Console | None = None,
        enabled: bool = True,
    ) -> None:
        self.progress = Progress(
            *round_columns(), console=console, disable=not enabled, transient=False
        )
        self.name, self.total = name, total
        self.task: TaskID | None = None
        self._last = 0.0
        self._acc = ""

    def __enter__(self) -> RoundProgress:
        self.progress.__enter__()
        self.task = self.progress.add_task(self.name, total=self.total, acc="", last="")
        self._last = time.perf_counter()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.progress.__exit__(exc_type, exc, tb)

    def on_round(self, m: dict[str, Any], wall_s: float | None = None) -> None:
        assert self.task is not None, "use RoundProgress as a context manager"
        now = time.perf_counter()
        took = wall_s if wall_s is not None else now - self._last
        self._last = now
        self._acc = format_round(m, self._acc)
        self.progress.update(
            self.task, completed=m["round"], acc=self._acc, last=f"last round {took:.1f}s"
        )


__all__ = ["RoundProgress", "format_round", "round_columns"]
