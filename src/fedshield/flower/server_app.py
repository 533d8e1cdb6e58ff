"""The fedshield ServerApp (``flwr run``) and the server side shared with the simulation.

``flwr run`` passes the run config of ``[tool.flwr.app.config]`` (pyproject.toml) and
``--run-config`` overrides; the keys are:

* ``preset``: a bundled preset name (default ``demo``), or
* ``config``: path of an experiment TOML on the SuperLink host (wins over ``preset``);
* ``overrides``: ``KEY=VALUE`` items separated by spaces, as ``fedshield run --set``;
* ``out``: output directory on the SuperLink host (default ``runs/<name>-flower``);
* ``resume``: continue the run in ``out`` from its checkpoint;
* ``round-timeout``: seconds to wait for a round's replies (default 3600); a sampled client
  whose row has not arrived by then is a missing row (``sys/dropped``), as is one whose
  SuperNode or ClientApp Flower reports lost.

Outputs are the simulator's: ``config.toml``, ``metrics.jsonl``, ``timing.jsonl``,
``checkpoint.pt``, ``summary.json`` (with ``dropped``: the missing rows by client and
reason), plots and ``report.md``.
"""

from __future__ import annotations

import shlex
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from flwr.app import Context, UserConfig
from flwr.serverapp import Grid, ServerApp

from fedshield import config as config_mod
from fedshield.config import ExperimentConfig
from fedshield.errors import ConfigError
from fedshield.flower.experiment import FedshieldStrategy, RoundCallback
from fedshield.sim.builder import build
from fedshield.sim.engine import Simulator
from fedshield.sim.faults import response_models
from fedshield.threads import set_threads

app = ServerApp()


@dataclass(frozen=True)
class ServerSettings:
    cfg: ExperimentConfig
    out: Path
    resume: bool = False
    round_timeout: float = 3600.0


def settings_from_run_config(run_config: UserConfig) -> ServerSettings:
    """Resolve the experiment from the Flower run config (see the module docstring)."""
    path = str(run_config.get("config", "") or "") or None
    preset = str(run_config.get("preset", "") or "") or None
    overrides = shlex.split(str(run_config.get("overrides", "") or ""))
    cfg = config_mod.load(path, preset=None if path else preset, overrides=overrides)
    out = str(run_config.get("out", "") or "") or f"runs/{cfg.name}-flower"
    return ServerSettings(
        cfg=cfg,
        out=Path(out).expanduser().resolve(),
        resume=bool(run_config.get("resume", False)),
        round_timeout=float(run_config.get("round-timeout", 3600.0)),
    )


def prepare(
    cfg: ExperimentConfig, out: Path | None, resume: bool = False, components: Any = None
) -> Simulator:
    """Build the server side (data, model, components, output dir) before any node is
    contacted, so a bad config or an occupied ``out`` fails in seconds; ``components``:
    those the caller's checks built for ``cfg`` (not built again)."""
    set_threads(cfg.run.threads, default=None)
    injected = response_models(cfg)
    if injected:  # availability filters the nodes asked; a node's own silence is the dropout
        raise ConfigError(
            f"faults.models: {', '.join(injected)} inject in-process dropouts; on Flower the "
            f"nodes' real missing replies are the dropouts (availability models apply)"
        )
    if cfg.faults is not None and cfg.faults.invite == "population":
        raise ConfigError(
            "faults.invite='population' marks simulated offline invitees; on Flower a node "
            "that is offline is one that does not answer (leave faults.invite unset)"
        )
    return Simulator(build(cfg, components), out, resume=resume)


def serve(
    grid: Grid,
    sim: Simulator,
    on_round: RoundCallback | None = None,
    round_timeout: float = 3600.0,
) -> dict[str, Any]:
    """Run the experiment of ``sim`` over ``grid``; write outputs; return the summary."""
    strategy = FedshieldStrategy(sim, on_round)
    sim.start()  # the run's callbacks (loggers, privacy accounting), as Simulator.run does
    t0 = time.perf_counter()
    strategy.run(grid, timeout=round_timeout)
    return sim.finish(time.perf_counter() - t0, {"dropped": strategy.missing.summary()})


def log_rounds(total: int) -> RoundCallback:
    """A round callback that logs ``fedshield round t/T acc … (x.x s)`` through Flower's
    logger, so ``flwr run --stream`` and ``flwr log`` show the run's live metrics."""
    from logging import INFO

    from flwr.common.logger import log

    from fedshield.progress import format_round

    def on_round(m: dict[str, Any], wall_s: float) -> None:
        log(INFO, "fedshield round %d/%d %s (%.1f s)", m["round"], total, format_round(m), wall_s)

    return on_round


@app.main()
def main(grid: Grid, context: Context) -> None:
    """Entry point of ``flwr run``: one fedshield experiment on the connected SuperNodes."""
    s = settings_from_run_config(context.run_config)
    sim = prepare(s.cfg, s.out, s.resume)
    serve(grid, sim, log_rounds(s.cfg.rounds), round_timeout=s.round_timeout)
