"""Experiment trackers (fedshield.sim.tracking), read back with each library's own reader:
TensorBoard's EventAccumulator and MLflow's MlflowClient."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest

from fedshield import config
from fedshield.errors import ConfigError
from fedshield.sim.outputs import plot_curves
from fedshield.sim.tracking import MLflowLogger, TensorBoardLogger, flat_config, logger_callbacks

RECORDS = [
    {"round": 1, "byz/count": 0, "train/loss": 2.25, "test_acc": 0.5, "privacy/epsilon": 1.5},
    {"round": 2, "byz/count": 0, "train/loss": 1.75, "agg/x@1": 3.0, "skip": None},
    {"round": 3, "byz/count": 1, "train/loss": 1.5, "test_acc": 0.75, "bad": float("nan")},
]


def _cfg(**run):
    raw = {"name": "trk", "rounds": 3, "run": {"progress": False, **run}}
    return config.validate(raw)


def _sim(out: Path, cfg, first_round: int = 1):
    return SimpleNamespace(
        out=out, cfg=cfg, config_text=config.dump(cfg), state=SimpleNamespace(round=first_round)
    )


def _drive(logger, sim, records, summary=None):
    logger.on_run_start(sim)
    for r in records:
        logger.after_round(sim, dict(r), {"round": r["round"], "wall_s": 1.0})
    if summary is not None:
        plot_curves(RECORDS, sim.out, "trk")
        (sim.out / "config.toml").write_text(sim.config_text)
        logger.on_run_end(sim, summary)


def _expected(records) -> dict[str, list[tuple[int, float]]]:
    want: dict[str, list[tuple[int, float]]] = {}
    for r in records:
        for k, v in r.items():
            if k != "round" and isinstance(v, float | int) and v == v:
                want.setdefault(k, []).append((r["round"], float(v)))
    return want


def _same(got, want, key=""):
    """(step, value) series equal: same steps, values equal to float32 precision."""
    assert [st for st, _ in got] == [st for st, _ in want], key
    assert [v for _, v in got] == pytest.approx([v for _, v in want], rel=1e-6), key


def test_tensorboard_logs_metrics_config_and_plots(tmp_path):
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    cfg = _cfg(loggers=["tensorboard"])
    sim = _sim(tmp_path, cfg)
    _drive(TensorBoardLogger(), sim, RECORDS, {"rounds": 3, "final_test_acc": 0.75})
    acc = EventAccumulator(str(tmp_path / "tensorboard"), size_guidance={"tensors": 0})
    acc.Reload()
    want = _expected(RECORDS)
    for key, points in want.items():
        _same([(e.step, e.value) for e in acc.Scalars(key)], points, key)
    assert "skip" not in acc.Tags()["scalars"] and "bad" not in acc.Tags()["scalars"]
    (text,) = acc.Tensors("config/text_summary")
    assert 'name = "trk"' in text.tensor_proto.string_val[0].decode()
    assert {"test_acc", "test_loss"} <= set(acc.Tags()["images"])


def test_tensorboard_resume_purges_replayed_rounds(tmp_path):
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    cfg = _cfg(loggers=["tensorboard"])
    first = [dict(r, **{"train/loss": 9.0}) for r in RECORDS]  # a crashed session's values
    _drive(TensorBoardLogger(), _sim(tmp_path, cfg), first)
    _drive(TensorBoardLogger(), _sim(tmp_path, cfg, first_round=2), RECORDS[1:])
    acc = EventAccumulator(str(tmp_path / "tensorboard"))
    acc.Reload()
    got = [(e.step, e.value) for e in acc.Scalars("train/loss")]
    assert got == [(1, 9.0), (2, 1.75), (3, 1.5)]


def test_mlflow_logs_metrics_params_artifacts_and_resumes(tmp_path, monkeypatch):
    pytest.importorskip("mlflow")
    from mlflow.tracking import MlflowClient

    # A file store keeps this test fast (the default SQLite store is covered end to end).
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
    uri = (tmp_path / "store").as_uri()
    cfg = _cfg(loggers=["mlflow"], mlflow_uri=uri)
    out = tmp_path / "sweep" / "run"
    out.mkdir(parents=True)
    _drive(MLflowLogger(), _sim(out, cfg), RECORDS[:2])
    # resumed from a checkpoint after round 1: round 2 is replayed, round 3 is new
    _drive(MLflowLogger(), _sim(out, cfg, first_round=2), RECORDS[1:], {"rounds": 3})
    client = MlflowClient(tracking_uri=uri)
    run_id = (out / "mlflow_run_id").read_text().strip()
    run = client.get_run(run_id)
    assert run.info.status == "FINISHED" and run.info.run_name == "trk"
    assert client.get_experiment(run.info.experiment_id).name == "sweep"
    for key, points in _expected(RECORDS).items():
        name = key.replace("@", "_")
        _same(sorted((m.step, m.value) for m in client.get_metric_history(run_id, name)), points)
    assert run.data.params == {k: v for k, v in flat_config(cfg).items()}
    files = {a.path for a in client.list_artifacts(run_id)}
    assert {"config.toml", "test_acc.png", "test_loss.png"} <= files


def test_missing_tracker_package_is_a_config_error(monkeypatch):
    import fedshield.sim.tracking as tracking

    real = tracking.importlib.util.find_spec
    monkeypatch.setattr(
        tracking.importlib.util, "find_spec", lambda n: None if n == "mlflow" else real(n)
    )
    with pytest.raises(ConfigError, match=r"run.loggers: 'mlflow' needs .*fedshield\[track\]"):
        logger_callbacks(_cfg(loggers=["tensorboard", "mlflow"]))


def test_unknown_logger_names_the_key():
    with pytest.raises(ConfigError, match=r"run.loggers.0.*wandb"):
        _cfg(loggers=["wandb"])


@pytest.mark.slow
def test_run_with_both_loggers_writes_what_metrics_jsonl_holds(tmp_path, small_cfg):
    pytest.importorskip("mlflow")
    pytest.importorskip("tensorboard")
    from mlflow.tracking import MlflowClient
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from fedshield.sim.builder import build
    from fedshield.sim.engine import Simulator

    small_cfg["rounds"] = 2
    small_cfg["run"]["loggers"] = ["tensorboard", "mlflow"]
    cfg = config.validate(small_cfg)
    out = tmp_path / "run"
    Simulator(build(cfg), out).run()
    rows = [json.loads(line) for line in (out / "metrics.jsonl").open()]
    want = _expected(rows)
    acc = EventAccumulator(str(out / "tensorboard"))
    acc.Reload()
    assert set(acc.Tags()["scalars"]) >= set(want)
    client = MlflowClient(tracking_uri=f"sqlite:///{out.resolve() / 'mlflow.db'}")
    run_id = (out / "mlflow_run_id").read_text().strip()
    for key, points in want.items():
        _same([(e.step, e.value) for e in acc.Scalars(key)], points, key)
        _same(sorted((m.step, m.value) for m in client.get_metric_history(run_id, key)), points)
    files = {a.path for a in client.list_artifacts(run_id)}
    assert {"config.toml", "summary.json", "report.md", "test_acc.png"} <= files


@pytest.mark.slow
def test_trackers_are_complete_after_a_kill_and_resume(tmp_path, small_cfg, monkeypatch):
    """A run killed after a round reached metrics.jsonl and its checkpoint but
    before the loggers ran left that round out of TensorBoard and MLflow on --resume."""
    pytest.importorskip("mlflow")
    pytest.importorskip("tensorboard")
    from mlflow.tracking import MlflowClient
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from fedshield.sim.builder import build
    from fedshield.sim.engine import Simulator

    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
    uri = (tmp_path / "store").as_uri()
    small_cfg["rounds"] = 3
    small_cfg["run"] |= {"loggers": ["tensorboard", "mlflow"], "mlflow_uri": uri}
    cfg = config.validate(small_cfg)
    out = tmp_path / "run"

    class Killed(BaseException):
        """SIGKILL between the checkpoint and the loggers of round 2."""

    real = TensorBoardLogger.after_round

    def dying(self, sim, record, timing):
        if record["round"] == 2:
            raise Killed
        real(self, sim, record, timing)

    monkeypatch.setattr(TensorBoardLogger, "after_round", dying)
    with pytest.raises(Killed):
        Simulator(build(cfg), out).run()
    monkeypatch.setattr(TensorBoardLogger, "after_round", real)
    rows = [json.loads(line) for line in (out / "metrics.jsonl").open()]
    assert [r["round"] for r in rows] == [1, 2]  # round 2 is on disk, not in the trackers
    Simulator(build(cfg), out, resume=True).run()
    rows = [json.loads(line) for line in (out / "metrics.jsonl").open()]
    want = _expected(rows)
    assert {r["round"] for r in rows} == {1, 2, 3}
    acc = EventAccumulator(str(out / "tensorboard"))
    acc.Reload()
    client = MlflowClient(tracking_uri=uri)
    run_id = (out / "mlflow_run_id").read_text().strip()
    for key, points in want.items():
        _same([(e.step, e.value) for e in acc.Scalars(key)], points, key)
        history = client.get_metric_history(run_id, key.replace("@", "_"))
        _same(sorted((m.step, m.value) for m in history), points, key)


@pytest.mark.slow
def test_a_run_killed_before_its_first_checkpoint_logs_every_round_once(
    tmp_path, small_cfg, monkeypatch
):
    """Killed after round 2 with checkpoint.every = 3, the resumed run starts
    over at round 1 and the trackers held test_acc at steps [1, 2, 1, 2, 3, 4]."""
    pytest.importorskip("mlflow")
    pytest.importorskip("tensorboard")
    from mlflow.tracking import MlflowClient
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from fedshield.sim.builder import build
    from fedshield.sim.engine import Simulator

    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
    uri = (tmp_path / "store").as_uri()
    small_cfg["rounds"] = 4
    small_cfg["checkpoint"] = {"every": 3}
    small_cfg["run"] |= {"loggers": ["tensorboard", "mlflow"], "mlflow_uri": uri}
    cfg = config.validate(small_cfg)
    out = tmp_path / "run"

    class Killed(BaseException):
        """SIGKILL after both trackers logged round 2, before the first checkpoint."""

    real = MLflowLogger.after_round

    def dying(self, sim, record, timing):
        real(self, sim, record, timing)
        if record["round"] == 2:
            raise Killed

    monkeypatch.setattr(MLflowLogger, "after_round", dying)
    with pytest.raises(Killed):
        Simulator(build(cfg), out).run()
    monkeypatch.setattr(MLflowLogger, "after_round", real)
    assert not (out / "checkpoint.pt").exists()
    first_id = (out / "mlflow_run_id").read_text().strip()
    Simulator(build(cfg), out, resume=True).run()
    rows = [json.loads(line) for line in (out / "metrics.jsonl").open()]
    assert [r["round"] for r in rows] == [1, 2, 3, 4]
    want = _expected(rows)
    acc = EventAccumulator(str(out / "tensorboard"))
    acc.Reload()
    client = MlflowClient(tracking_uri=uri)
    run_id = (out / "mlflow_run_id").read_text().strip()
    for key, points in want.items():
        _same([(e.step, e.value) for e in acc.Scalars(key)], points, key)
        history = client.get_metric_history(run_id, key.replace("@", "_"))
        _same(sorted((m.step, m.value) for m in history), points, key)
    assert [e.step for e in acc.Scalars("test_acc")] == [1, 2, 3, 4]
    assert client.get_run(first_id).info.lifecycle_stage == "deleted" and run_id != first_id
