"""Experiment tracking: TensorBoard and MLflow loggers as round-loop callbacks.

``run.loggers = ["tensorboard", "mlflow"]`` adds, after the built-in callbacks of
:mod:`fedshield.sim.callbacks`, one logger per entry. Each one writes, locally and without a
server:

* every round: the numeric values of the round's record — exactly what metrics.jsonl holds
  (``round`` is the step; wall times stay in timing.jsonl, as there);
* at the start: the resolved config (TensorBoard: a text summary ``config``; MLflow: one
  param per dotted key);
* at the end: the plots and run files (TensorBoard: the plots as images and the config +
  final accuracy as HParams; MLflow: ``config.toml``, ``summary.json``, ``report.md``,
  ``privacy.json`` and the plots as artifacts).

Where: TensorBoard event files in ``<run dir>/tensorboard`` (``tensorboard --logdir
<run dir>``); MLflow in a SQLite store ``<run dir>/mlflow.db`` with artifacts in
``<run dir>/mlartifacts`` (``mlflow ui --backend-store-uri sqlite:///<run dir>/mlflow.db``),
or the store ``run.mlflow_uri`` names. A resumed run continues the same MLflow run (its id
is kept in ``<run dir>/mlflow_run_id``) and does not log a round twice; TensorBoard's
``purge_step`` drops the points of rounds that are replayed. A run killed before its first
checkpoint starts over at round 1: TensorBoard removes the earlier session's files and
MLflow deletes the earlier session's run and starts a new one. A run killed between writing a
round to metrics.jsonl and logging it (SIGKILL) would leave that round out of the tracker:
on resume every logger first backfills, from the records metrics.jsonl kept, the rounds it
lacks (MLflow: those after its last logged step; TensorBoard: all of them, after purging
from the first), so both hold exactly what metrics.jsonl holds.

Both libraries are imported only when used (extra ``track``): a missing one is a
:class:`ConfigError` naming the logger and the extra. W&B is not supported (not a
dependency of fedshield).
"""

from __future__ import annotations

import importlib.util
import json
import math
import re
import time
from pathlib import Path
from typing import Any

from fedshield.errors import ConfigError
from fedshield.sim.callbacks import Callback, RunView

#: Run files logged as artifacts at the end, when present.
ARTIFACTS = ("config.toml", "summary.json", "report.md", "privacy.json")
#: Plot files (written by the run's finish step).
PLOTS = ("test_acc.png", "test_loss.png")


def scalars(record: dict[str, Any]) -> dict[str, float]:
    """The loggable values of a record: finite numbers (not booleans), ``round`` excluded."""
    out = {}
    for k, v in record.items():
        if k == "round" or isinstance(v, bool) or not isinstance(v, int | float):
            continue
        if math.isfinite(v):
            out[k] = float(v)
    return out


def flat_config(cfg: Any) -> dict[str, str]:
    """The resolved config as ``{"section.key": "value"}`` (lists and tables as JSON)."""
    out: dict[str, str] = {}

    def walk(node: Any, prefix: str) -> None:
        if isinstance(node, dict) and node:
            for k, v in node.items():
                walk(v, f"{prefix}{k}.")
        else:
            out[prefix[:-1]] = node if isinstance(node, str) else json.dumps(node)

    walk(cfg.model_dump(mode="json", exclude_none=True), "")
    return out


def _require(logger: str, module: str) -> None:
    if importlib.util.find_spec(module) is None:
        raise ConfigError(
            f"run.loggers: {logger!r} needs the {module} package: pip install 'fedshield[track]'"
        )


class _Logger(Callback):
    """Opens lazily (on the first hook that runs), so it also works where a backend calls
    only ``after_round``."""

    def __init__(self) -> None:
        self._open = False

    def start(self, sim: RunView, first_round: int) -> None:
        raise NotImplementedError

    def _ensure(self, sim: RunView, first_round: int) -> None:
        if not self._open:
            self._open = True
            self.start(sim, first_round)

    def on_run_start(self, sim: RunView) -> None:
        self._ensure(sim, sim.state.round)


def kept_records(sim: RunView, first_round: int) -> list[dict[str, Any]]:
    """The records of earlier sessions a resumed run kept from metrics.jsonl (the rounds
    before ``first_round``), for backfilling a tracker."""
    return [r for r in getattr(sim, "records", []) if int(r.get("round", 0)) < first_round]


class TensorBoardLogger(_Logger):
    """TensorBoard event files in ``<run dir>/tensorboard`` (torch's ``SummaryWriter``)."""

    def start(self, sim: RunView, first_round: int) -> None:
        assert sim.out is not None
        from torch.utils.tensorboard import SummaryWriter

        # purge_step: TensorBoard hides points of an earlier session at steps ≥ this one;
        # from the first kept round, which is then logged again from metrics.jsonl (a
        # round killed before its logger ran is filled in).
        # A run killed before its first checkpoint starts over at round 1 (its
        # rounds were logged twice, steps [1, 2, 1, 2, 3, ...]): purge from 1 then too.
        history = kept_records(sim, first_round)
        logdir = sim.out / "tensorboard"
        earlier = first_round > 1 or (logdir.is_dir() and any(logdir.iterdir()))
        purge = history[0]["round"] if history else first_round if earlier else None
        if first_round == 1 and earlier:
            # Starting over: the earlier session's files hold only rounds replayed now, and
            # a purge marker cannot order them when both sessions' file names carry the
            # same second and process (the reader then shows steps 1, 2, 3, 4, 1, 2).
            for old in logdir.glob("events.out.tfevents.*"):
                old.unlink()
            purge = None
        self.writer = SummaryWriter(log_dir=str(logdir), purge_step=purge)
        self.writer.add_text("config", "```toml\n" + sim.config_text + "\n```", first_round)
        for record in history:
            self._log(record)
        self.writer.flush()

    def _log(self, record: dict[str, Any]) -> None:
        rnd = int(record["round"])
        for k, v in scalars(record).items():
            self.writer.add_scalar(k, v, global_step=rnd)

    def after_round(self, sim: RunView, record: dict[str, Any], timing: dict[str, Any]) -> None:
        self._ensure(sim, int(record["round"]))
        self._log(record)
        self.writer.flush()

    def on_run_end(self, sim: RunView, summary: dict[str, Any]) -> None:
        assert sim.out is not None
        self._ensure(sim, sim.state.round)
        import matplotlib.image

        step = int(summary.get("rounds", 0))
        for name in PLOTS:
            path = sim.out / name
            if path.exists():
                img = matplotlib.image.imread(str(path))[..., :3]
                self.writer.add_image(name[:-4], img, step, dataformats="HWC")
        final = {
            f"hparam/{k}": float(summary[k])
            for k in ("final_test_acc", "best_test_acc")
            if isinstance(summary.get(k), int | float)
        }
        self.writer.add_hparams(flat_config(sim.cfg), final, run_name=".", global_step=step)
        self.writer.close()
        self._open = False


_MLFLOW_KEY = re.compile(r"[^\w\-. :/]")


def mlflow_key(key: str) -> str:
    """``key`` with the characters MLflow refuses in names replaced by ``_``."""
    return _MLFLOW_KEY.sub("_", key)


class MLflowLogger(_Logger):
    """An MLflow run (``MlflowClient``, no server): SQLite store under the run dir unless
    ``run.mlflow_uri`` names another; experiment = the name of the folder holding the run
    dir (a sweep's runs form one experiment), run name = the config's ``name``."""

    def start(self, sim: RunView, first_round: int) -> None:
        assert sim.out is not None
        from mlflow.exceptions import MlflowException
        from mlflow.tracking import MlflowClient

        out = sim.out.resolve()
        uri = sim.cfg.run.mlflow_uri or f"sqlite:///{out / 'mlflow.db'}"
        try:
            self.client = MlflowClient(tracking_uri=uri)
            self.run_id = self._run(out, sim, fresh=first_round <= 1)
        except MlflowException as err:
            raise ConfigError(f"run.mlflow_uri={uri!r}: {err.message}") from None
        self.logged_upto = self._last_step() if first_round > 1 else 0
        self._params(sim)
        for record in kept_records(sim, first_round):  # killed before they were logged
            if int(record["round"]) > self.logged_upto:
                self._log(record)

    def _run(self, out: Path, sim: RunView, fresh: bool) -> str:
        """The MLflow run of ``out``: the one of an earlier session when the run resumes
        from a checkpoint; a new one when it starts at round 1 (a resume of a run killed
        before its first checkpoint starts over, so the earlier session's run, whose
        rounds are replayed, is deleted: they used to be logged twice)."""
        id_file = out / "mlflow_run_id"
        if id_file.exists():
            run_id = id_file.read_text().strip()
            try:
                self.client.get_run(run_id)
                if fresh:
                    self.client.delete_run(run_id)
                else:
                    self.client.update_run(run_id, status="RUNNING")
                    return run_id
            except Exception:
                pass
        name = out.parent.name or "fedshield"
        exp = self.client.get_experiment_by_name(name)
        if exp is None:
            artifacts: str | None = (out / "mlartifacts").as_uri()
            if sim.cfg.run.mlflow_uri is not None:
                artifacts = None  # a store of the user's own: its default artifact root
            exp_id = self.client.create_experiment(name, artifact_location=artifacts)
        else:
            exp_id = exp.experiment_id
        tags = {"fedshield.out": str(out), "fedshield.seed": str(sim.cfg.seed)}
        run = self.client.create_run(exp_id, run_name=sim.cfg.name, tags=tags)
        from fedshield.sim.checkpoint import atomic_write_text

        atomic_write_text(id_file, run.info.run_id + "\n")
        return run.info.run_id

    def _last_step(self) -> int:
        """The last round this run already logged (a resumed session skips up to it)."""
        keys = self.client.get_run(self.run_id).data.metrics
        steps = [m.step for k in keys for m in self.client.get_metric_history(self.run_id, k)]
        return max(steps, default=0)

    def _params(self, sim: RunView) -> None:
        from mlflow.entities import Param

        have = self.client.get_run(self.run_id).data.params
        params = {mlflow_key(k): v[:6000] for k, v in flat_config(sim.cfg).items()}
        new = [Param(k, v) for k, v in params.items() if k not in have]
        for i in range(0, len(new), 100):  # MLflow's batch limit for params
            self.client.log_batch(self.run_id, params=new[i : i + 100])
        for k, v in params.items():  # values changed on resume (rounds, run.*): as tags
            if k in have and have[k] != v:
                self.client.set_tag(self.run_id, f"resumed.{k}", v)

    def after_round(self, sim: RunView, record: dict[str, Any], timing: dict[str, Any]) -> None:
        rnd = int(record["round"])
        self._ensure(sim, rnd)
        if rnd > self.logged_upto:
            self._log(record)

    def _log(self, record: dict[str, Any]) -> None:
        from mlflow.entities import Metric

        rnd = int(record["round"])
        ts = int(time.time() * 1000)
        metrics = [Metric(mlflow_key(k), v, ts, rnd) for k, v in scalars(record).items()]
        for i in range(0, len(metrics), 1000):
            self.client.log_batch(self.run_id, metrics=metrics[i : i + 1000])
        self.logged_upto = rnd

    def on_run_end(self, sim: RunView, summary: dict[str, Any]) -> None:
        assert sim.out is not None
        self._ensure(sim, sim.state.round)
        for name in (*ARTIFACTS, *PLOTS):
            path = sim.out / name
            if path.exists():
                self.client.log_artifact(self.run_id, str(path))
        self.client.set_terminated(self.run_id, "FINISHED")
        self._open = False


_LOGGERS: dict[str, tuple[type[_Logger], str]] = {
    "tensorboard": (TensorBoardLogger, "tensorboard"),
    "mlflow": (MLflowLogger, "mlflow"),
}


def logger_callbacks(cfg: Any) -> list[Callback]:
    """One logger per ``run.loggers`` entry (checked importable now, imported when used)."""
    out: list[Callback] = []
    for name in dict.fromkeys(cfg.run.loggers):
        cls, module = _LOGGERS[name]
        _require(name, module)
        out.append(cls())
    return out


__all__ = [
    "MLflowLogger",
    "TensorBoardLogger",
    "flat_config",
    "logger_callbacks",
    "mlflow_key",
    "scalars",
]
