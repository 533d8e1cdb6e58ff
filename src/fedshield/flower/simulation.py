"""``run_simulation(cfg, out)``: a fedshield config through Flower's simulation engine (Ray).

One virtual SuperNode per fedshield client (``num_supernodes = data.num_clients``; the
engine gives node ``i`` the node config ``partition-id=i``), the fedshield ServerApp in
the calling process, the ClientApp in Ray actors. Same outputs as the in-process
simulator (``metrics.jsonl``, ``summary.json``, ``checkpoint.pt``, ...), same metrics for
the same seed.
"""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from flwr.app import Context
from flwr.serverapp import Grid, ServerApp
from flwr.simulation import run_simulation as flwr_run_simulation

from fedshield.config import ExperimentConfig
from fedshield.errors import ConfigError
from fedshield.flower import client_app
from fedshield.flower.experiment import FlowerRunError, RoundCallback
from fedshield.flower.server_app import prepare, serve
from fedshield.sim.builder import build_components


def backend_config(
    device_type: str,
    client_cpus: float = 1.0,
    client_gpus: float | None = None,
    ray_cpus: int | None = None,
) -> dict[str, Any]:
    """Ray resources per virtual client. On CPU one core each, so as many actors train in
    parallel as Ray has CPUs (``ray_cpus``, default all cores); on CUDA a fifth of a GPU
    each unless told otherwise."""
    gpus = client_gpus if client_gpus is not None else (0.2 if device_type == "cuda" else 0.0)
    init: dict[str, Any] = {"logging_level": "ERROR", "log_to_driver": True}
    if ray_cpus is not None:
        init["num_cpus"] = ray_cpus
    return {"client_resources": {"num_cpus": client_cpus, "num_gpus": gpus}, "init_args": init}


def _print_round(m: dict[str, Any]) -> None:
    acc = f"  test_acc {m['test_acc']:.4f}" if "test_acc" in m else ""
    print(f"round {m['round']}{acc}", file=sys.stderr, flush=True)


def run_simulation(
    cfg: ExperimentConfig,
    out: Path | None,
    resume: bool = False,
    on_round: RoundCallback | None = None,
    **kwargs: Any,
) -> dict[str, Any]:
    """Run ``cfg`` on Flower's simulation engine and return the run summary.

    ``out=None`` writes nothing (metrics still reach ``on_round``). Keyword arguments as
    :func:`run_many`.
    """
    return run_many([(cfg, out)], resume, on_round, **kwargs)[0]


def run_many(
    runs: Sequence[tuple[ExperimentConfig, Path | None]],
    resume: bool = False,
    on_round: RoundCallback | None = None,
    *,
    quiet: bool = False,
    client_cpus: float = 1.0,
    client_gpus: float | None = None,
    ray_cpus: int | None = None,
    verbose: bool = False,
    components: Any = None,
) -> list[dict[str, Any]]:
    """Run several experiments, one after the other, in ONE Flower simulation session
    (one Ray start, one federation of ``data.num_clients`` virtual SuperNodes; every config
    must have the same ``data.num_clients``). Returns the summaries in order.

    ``client_cpus`` / ``client_gpus`` / ``ray_cpus``: Ray resources (see
    :func:`backend_config`); ``verbose`` keeps Flower's INFO log (default: warnings only);
    ``components``: the first run's, already built by the caller's checks (built once).
    """
    if not runs:
        return []
    sizes = {cfg.data.num_clients for cfg, _ in runs}
    if len(sizes) > 1:
        raise ConfigError(f"run_many needs one federation size, got data.num_clients={sizes}")
    for cfg, _ in runs[1:]:  # fail on a bad config before Ray starts, not mid-session
        build_components(cfg)
    first = prepare(runs[0][0], _path(runs[0][1]), resume, components)
    callback = on_round if on_round is not None else (None if quiet else _print_round)
    summaries: list[dict[str, Any]] = []
    server_app = ServerApp()

    @server_app.main()
    def _main(grid: Grid, context: Context) -> None:
        for i, (cfg, out) in enumerate(runs):
            sim = first if i == 0 else prepare(cfg, _path(out), resume)
            summaries.append(serve(grid, sim, callback))

    backend = backend_config(first.device.type, client_cpus, client_gpus, ray_cpus)
    _launch(server_app, sizes.pop(), backend, verbose)
    if len(summaries) != len(runs):
        raise FlowerRunError("the Flower simulation ended early (see its log above)")
    return summaries


def _path(out: Path | str | None) -> Path | None:
    return Path(out) if out is not None else None


class _DropDeprecation(logging.Filter):
    """Hide Flower's notice that the Python ``run_simulation`` API is deprecated: it is the
    in-process entry we need (``flwr run`` covers the CLI path, see docs/deployment.md)."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "`run_simulation` function is deprecated" not in record.getMessage()


def _launch(server_app: ServerApp, nodes: int, backend: dict[str, Any], verbose: bool) -> None:
    # Ray warns on every start that it will stop overriding CUDA_VISIBLE_DEVICES for
    # num_gpus=0 actors; we rely on neither behaviour, so take the future default quietly.
    os.environ.setdefault("RAY_ACCEL_ENV_VAR_OVERRIDE_ON_ZERO", "0")
    flwr_log = logging.getLogger("flwr")
    level, quiet_filter = flwr_log.level, _DropDeprecation()
    if not verbose:
        flwr_log.setLevel(logging.WARNING)
    flwr_log.addFilter(quiet_filter)
    try:
        flwr_run_simulation(
            server_app=server_app,
            client_app=client_app.app,
            num_supernodes=nodes,
            backend_config=backend,
            verbose_logging=verbose,
        )
    finally:
        flwr_log.setLevel(level)
        flwr_log.removeFilter(quiet_filter)
