"""One experiment, run end to end: threads, build, the round loop with a progress bar.

Used by ``fedshield run``, by sweeps (each run of a grid) and by library users::

    from fedshield import config, runner
    result = runner.run(config.load(preset="demo"), Path("runs/demo"))
    result["final_test_acc"]   # the summary, as summary.json holds it
    result.history             # one record per round, as metrics.jsonl holds them
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rich.console import Console

from fedshield import threads
from fedshield.progress import RoundProgress
from fedshield.results.store import store_run
from fedshield.sim.rundir import check_out_dir


def set_threads(cfg: Any) -> None:
    """``run.threads`` torch threads, 1 when unset, at most ``$FEDSHIELD_MAX_THREADS``
    (:func:`fedshield.threads.set_threads`)."""
    threads.set_threads(cfg.run.threads)


def check_run_dir(cfg: Any, out: Path, resume: bool) -> None:
    """Before any work: ``out`` can hold this run (not a file; a run there needs
    ``--resume``; a resumed checkpoint is readable and holds this config)."""
    from fedshield import config as config_mod
    from fedshield.sim import rundir

    check_out_dir(out)
    text = config_mod.dump(cfg)
    rundir.check_run_dir(out, resume, text)
    rundir.mark_started(out, resume, text)  # from here on a kill leaves a run to --resume


def check_inputs(cfg: Any, out: Path | None, resume: bool) -> Any:
    """Every check before any work, in order: the components (names, parameter schemas,
    tags, sizes the dataset declares, device; :func:`fedshield.sim.builder.build_components`)
    and then the run directory, which writes the config back as TOML and so must only
    see a validated one. Returns the components, for :func:`run` to reuse."""
    from fedshield.sim.builder import build_components

    components = build_components(cfg)
    if out is not None:
        check_run_dir(cfg, out, resume)
    return components


class RunResult(dict[str, Any]):
    """What :func:`run` returns: the run's summary (this dict, as ``summary.json`` holds it,
    plus ``out``) and :attr:`history`, one record per round (what ``metrics.jsonl`` holds,
    the rounds of earlier sessions of a resumed run included). A dict, so code that reads
    ``runner.run(...)["final_test_acc"]`` keeps working."""

    history: list[dict[str, Any]]

    def __init__(self, summary: dict[str, Any], history: list[dict[str, Any]]) -> None:
        super().__init__(summary)
        self.history = history

    @property
    def summary(self) -> dict[str, Any]:
        """The summary as a plain dict."""
        return dict(self)


def run(
    cfg: Any,
    out: Path | None,
    *,
    resume: bool = False,
    quiet: bool = False,
    console: Console | None = None,
    callbacks: list[Any] | None = None,
    components: Any = None,
    store: Path | None = None,
) -> RunResult:
    """Build and run one experiment (``out=None``: in memory, no files); returns its
    summary with the per-round history (:class:`RunResult`). Bad input is a
    :class:`~fedshield.errors.FedshieldError` raised before any data is loaded.
    ``components``: what :func:`check_inputs` returned for this ``cfg`` and ``out`` (the
    CLI checks first), so they are built — and the run's statement logged — once.
    ``store`` (default ``$FEDSHIELD_STORE``): the run store that gets the finished run's
    record (:mod:`fedshield.results.store`)."""
    from fedshield.sim.builder import build
    from fedshield.sim.engine import Simulator

    if components is None:
        components = check_inputs(cfg, out, resume)
    set_threads(cfg)
    sim = Simulator(build(cfg, components), out, resume=resume)
    show = cfg.run.progress and not quiet
    if out is not None and sim.state.round > cfg.rounds:  # --resume of a finished run
        show = False
        if not quiet:
            (console or Console(stderr=True)).print(
                f"{cfg.name}: already finished ({cfg.rounds} rounds) in {out}; nothing to "
                "train (the summary is written again)",
                highlight=False,
            )
    with RoundProgress(cfg.name, cfg.rounds, console=console, enabled=show) as bar:
        summary = sim.run(bar.on_round, callbacks=callbacks)
    summary["out"] = None if out is None else str(out)
    store_run(sim.config_text, sim.records, summary, "fedshield.runner.run", store)
    return RunResult(summary, list(sim.records))


__all__ = ["RunResult", "check_inputs", "check_out_dir", "check_run_dir", "run", "set_threads"]
