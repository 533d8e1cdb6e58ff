"""One experiment, run end to end: threads, build, the round loop with a progress bar.

Used by ``fedshield run``, by sweeps (each run of a grid) and by library users::

    from fedshield import config, runner
    summary = runner.run(config.load(preset="demo"), Path("runs/demo"))
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn


def progress_columns() -> list[Any]:
    """The progress bar of every backend: rounds done, the live metric, the last round's
    wall time, elapsed time and ETA."""
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


def set_threads(cfg: Any) -> None:
    """``run.threads`` torch threads, 1 when unset: on a busy 2-core machine two threads
    measured 6-17x slower per round than one (oversubscription), and one thread keeps runs
    bit-reproducible across machines with different core counts."""
    import torch

    torch.set_num_threads(cfg.run.threads or 1)


def run(
    cfg: Any,
    out: Path | None,
    *,
    resume: bool = False,
    quiet: bool = False,
    console: Console | None = None,
    callbacks: list[Any] | None = None,
) -> dict[str, Any]:
    """Build and run one experiment; returns its summary (with ``out``)."""
    import time

    from fedshield.sim.builder import build
    from fedshield.sim.engine import Simulator

    set_threads(cfg)
    sim = Simulator(build(cfg), out, resume=resume)
    show = cfg.run.progress and not quiet
    with Progress(*progress_columns(), console=console, disable=not show) as bar:
        done = sim.state.round - 1
        task = bar.add_task(cfg.name, total=cfg.rounds, completed=done, acc="", last="")
        last = [time.perf_counter()]

        def on_round(m: dict[str, Any]) -> None:
            now = time.perf_counter()
            acc = m.get("test_acc")
            text = f"acc {acc:.4f}" if isinstance(acc, float) else bar.tasks[task].fields["acc"]
            bar.update(task, completed=m["round"], acc=text, last=f"{now - last[0]:.2f}s/round")
            last[0] = now

        summary = sim.run(on_round, callbacks=callbacks)
    summary["out"] = None if out is None else str(out)
    return summary


__all__ = ["progress_columns", "run", "set_threads"]
