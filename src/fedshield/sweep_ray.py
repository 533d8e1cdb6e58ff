"""Sweeps on Ray: one Ray task per run, on this machine or a Ray cluster.

``fedshield sweep GRID --backend ray [--address ADDR] [--cpus-per-run C] [--gpus-per-run G]``

* Each run is a Ray task with resources ``num_cpus=C``, ``num_gpus=G``: Ray's scheduler
  starts as many runs at once as the cluster's resources allow, on any node, and gives a
  GPU run its own ``CUDA_VISIBLE_DEVICES``. The run uses ``C`` torch threads (``run.threads``
  wins when set), so its numbers equal those of a local run with as many threads.
* ``--address``: ``auto`` (the cluster this machine belongs to, ``ray start``), a head
  node ``HOST:6379``, or ``ray://HOST:10001`` (Ray Client). Without it a Ray instance is
  started on this machine for the sweep and stopped after it. An already initialised Ray
  (``ray.init()`` in your process) is used as it is.
* The fedshield package of this process is shipped to the cluster's workers
  (``runtime_env={"py_modules": [...]}``) when connecting to a cluster, so every node runs
  the same code; its dependencies (torch, ...) must be installed on every node.
* Outputs: a task writes ``<out>/<run name>/`` on the node it runs on, so on several nodes
  ``--out`` must be a directory every node mounts at the same path (NFS, a cluster file
  system). Each task checks that it sees the driver's ``<out>`` (a token file) and fails
  clearly otherwise.
* Resume is the local sweep's: finished runs are kept (not even submitted), unfinished ones
  continue from their checkpoints; a task Ray retries after a node failure does the same.
"""

from __future__ import annotations

import math
import os
import secrets
import socket
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

from fedshield.errors import ConfigError, FedshieldError
from fedshield.sweep import RunTask, run_one

TOKEN_FILE = ".fedshield-sweep-token"


def _task(
    raw: dict[str, Any], out: str, threads: int, token: str, fn: Callable[..., Any] = run_one
) -> dict[str, Any]:
    """The body of one Ray task (runs on a worker)."""
    seen = Path(out).parent / TOKEN_FILE
    if not seen.exists() or seen.read_text() != token:
        raise ConfigError(
            f"sweep output {Path(out).parent} is not the driver's on node "
            f"{socket.gethostname()}: with Ray on several nodes, --out must be a directory "
            "every node mounts at the same path (NFS, a cluster file system)"
        )
    return fn(raw, out, threads)


class RayBackend:
    """One Ray task per run with ``cpus``/``gpus`` resources each; ``task`` runs one
    (default :func:`fedshield.sweep.run_one`; ``fedshield bench`` passes its own)."""

    def __init__(
        self,
        address: str | None = None,
        cpus: float = 1.0,
        gpus: float = 0.0,
        task: Callable[..., dict[str, Any]] = run_one,
    ) -> None:
        if cpus <= 0:
            raise ConfigError(f"--cpus-per-run={cpus}: must be > 0")
        if gpus < 0:
            raise ConfigError(f"--gpus-per-run={gpus}: must be >= 0")
        self.address, self.cpus, self.gpus, self.task = address, cpus, gpus, task

    def _init(self) -> bool:
        """Connect to (or start) Ray; True when this call started the connection."""
        import ray

        if ray.is_initialized():
            return False
        # Ray warns that it will stop overriding CUDA_VISIBLE_DEVICES for num_gpus=0
        # tasks; CPU runs rely on neither behaviour, so take the future default quietly.
        os.environ.setdefault("RAY_ACCEL_ENV_VAR_OVERRIDE_ON_ZERO", "0")
        kwargs: dict[str, Any] = {"logging_level": "ERROR", "include_dashboard": False}
        if self.address is not None:
            import fedshield

            kwargs["runtime_env"] = {"py_modules": [str(Path(fedshield.__file__).parent)]}
        try:
            ray.init(address=self.address, **kwargs)
        except (ConnectionError, ValueError) as err:  # ValueError: not an address at all
            msg = f"--address {self.address}: no Ray cluster there ({err})"
            raise FedshieldError(msg) from None
        return True

    def _check_feasible(self) -> None:
        """Fail now, not hang: Ray waits forever for a task no node can hold."""
        import ray

        nodes = [n["Resources"] for n in ray.nodes() if n.get("Alive")]
        for key, flag, need in (
            ("CPU", "--cpus-per-run", self.cpus),
            ("GPU", "--gpus-per-run", self.gpus),
        ):
            most = max((r.get(key, 0.0) for r in nodes), default=0.0)
            if need > most:
                raise ConfigError(
                    f"{flag}={need:g}: no node of the Ray cluster has that many "
                    f"{key}s (the largest has {most:g})"
                )

    def map(self, tasks: Sequence[RunTask]) -> Iterator[tuple[str, dict[str, Any]]]:
        if not tasks:
            return
        import ray

        token = secrets.token_hex(16)
        parents = {Path(t.out).parent for t in tasks}
        for parent in parents:
            parent.mkdir(parents=True, exist_ok=True)
            (parent / TOKEN_FILE).write_text(token)
        started = self._init()
        try:
            self._check_feasible()
        except ConfigError:
            if started:
                ray.shutdown()
            raise
        threads = max(1, math.floor(self.cpus))
        remote = ray.remote(_task).options(num_cpus=self.cpus, num_gpus=self.gpus)
        pending = {remote.remote(t.raw, t.out, threads, token, self.task): t.name for t in tasks}
        try:
            while pending:
                done, _ = ray.wait(list(pending), num_returns=1)
                for ref in done:
                    name = pending.pop(ref)
                    yield name, _get(ref)
        finally:
            for ref in pending:  # a failed or interrupted sweep: stop the other runs
                ray.cancel(ref, force=True)
            if started:
                ray.shutdown()
            for parent in parents:
                (parent / TOKEN_FILE).unlink(missing_ok=True)


def _get(ref: Any) -> dict[str, Any]:
    import ray

    try:
        return ray.get(ref)
    except ray.exceptions.RayTaskError as err:
        # A fedshield error in a run (bad data path on a node, ...) reads as it would
        # locally: one line, no Ray traceback.
        if isinstance(err.cause, FedshieldError):
            raise err.cause from None
        raise


__all__ = ["RayBackend"]
