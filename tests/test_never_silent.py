"""Results that were wrong (or refused too late) while everything said
ok — one test per reproducer, each failing on the code before the fix."""

from __future__ import annotations

import copy
import logging
import math

import numpy as np
import pytest
import torch
from torch import nn

from fedshield.core.client_metrics import robust_metric, robust_metrics
from fedshield.testing import fuzz


@pytest.fixture(autouse=True)
def _quiet():
    logging.disable(logging.WARNING)
    yield
    logging.disable(logging.NOTSET)


def _replay(pair: fuzz.Pair, edit) -> dict:
    pair.sim.state = copy.deepcopy(pair.start)
    pair.sim.records = []
    ups = [fuzz._clone(u) for u in pair.honest]
    edit(ups)
    return pair.sim.end_round(pair.plan, ups, apply_update_attack=False)


# -- 7. what clients report is untrusted ---------------------------------------------------
def test_robust_metric_is_the_float64_median_with_non_finite_as_inf():
    assert robust_metric([1.0, 2.0, 1.7e308, 1.7e308, 3.0]) == 3.0
    assert robust_metric([1.0, "x", [1], True, None]) == 1.0
    assert robust_metric(["x"]) is None
    assert math.isnan(robust_metric([1.0, math.nan, math.inf, 2.0]))  # half diverged
    assert robust_metric([1.0, 2.0, math.nan]) == 2.0  # a minority cannot
    assert robust_metric([torch.tensor(4.0), np.float32(2.0)]) == 3.0
    assert robust_metrics([{"a": 1.0, "n": 5}, {"a": 1e308, "n": 7}, {"a": 1e308}], ["n"]) == {
        "a": 1e308
    }


def test_two_clients_reporting_a_huge_finite_loss_do_not_stop_the_run():
    """Two ``train/loss = 1.7e308`` overflowed the mean to inf and the run
    stopped as "diverged" after round 1."""
    pair = fuzz.make_pair("fedavg", "median")
    honest = sorted(float(u.metrics["train/loss"]) for u in pair.honest[2:])

    def edit(ups):
        ups[0].metrics = {"train/loss": 1.7e308}
        ups[1].metrics = {"train/loss": 1.7e308}

    m = _replay(pair, edit)
    assert math.isfinite(m["train/loss"]) and honest[0] <= m["train/loss"] <= honest[-1]
    assert not pair.sim.diverged(m)


def test_a_majority_of_diverged_reports_is_still_a_divergence():
    pair = fuzz.make_pair("fedavg", "median")

    def edit(ups):
        for u in ups[: len(ups) // 2 + 1]:
            u.metrics = {"train/loss": float("nan")}

    m = _replay(pair, edit)
    assert math.isnan(m["train/loss"])


def _flower_app(loss_of):
    from flwr.app import Array, ArrayRecord, Message, MetricRecord, RecordDict
    from flwr.clientapp import ClientApp

    app = ClientApp()

    @app.train()
    def _train(msg: Message, context) -> Message:
        k = int(context.node_config["partition-id"])
        arrays = {
            n: Array(a.numpy() + np.float32(0.01 * (k + 1)))
            for n, a in msg.content["arrays"].items()
        }
        metrics = {"num-examples": 1000 if k < 2 else 10, "train_loss": loss_of(k)}
        content = RecordDict({"arrays": ArrayRecord(arrays), "metrics": MetricRecord(metrics)})
        return Message(content, reply_to=msg)

    return app


def test_flower_native_strategy_takes_the_median_of_client_metrics():
    """Flower's default weighted mean of ``train_loss``: two clients with 1.7e308 and
    1000 samples each made it inf; the strategies' default is now the median."""
    pytest.importorskip("flwr")
    from flwr.app import ArrayRecord

    from fedshield.flower import strategies as S
    from fedshield.flower.local import LocalGrid

    torch.manual_seed(0)
    start = ArrayRecord(nn.Linear(3, 2).state_dict())
    strategy = S.Median()
    grid = LocalGrid(5, _flower_app(lambda k: 1.7e308 if k < 2 else float(k)))
    result = strategy.start(grid, start, num_rounds=1)
    # the median of (2, 3, 4, 1.7e308, 1.7e308): the largest honest value, not inf
    assert result.train_metrics_clientapp[1]["train_loss"] == 4.0


# -- 8. state read back: one checker --------------------------------------------------------
def _saved_run(tmp_path, server: str = "fedavg", aggregator: str = "centered_clipping"):
    import tomli_w

    from fedshield import config
    from fedshield.runner import run

    raw = fuzz.base_config(server, aggregator)
    raw |= {"rounds": 2}
    raw["eval"] = {"every": 1}
    raw["checkpoint"] = {"every": 1}
    path = tmp_path / "cfg.toml"
    path.write_text(tomli_w.dumps(raw))
    out = tmp_path / "run"
    run(config.load(path), out)
    return path, out


def _resume_after(tmp_path, capsys, tamper, server="fedavg", aggregator="centered_clipping"):
    from fedshield.cli import main

    path, out = _saved_run(tmp_path, server, aggregator)
    ckpt = torch.load(out / "checkpoint.pt", weights_only=True)
    tamper(ckpt, out)
    torch.save(ckpt, out / "checkpoint.pt")
    (out / "summary.json").unlink(missing_ok=True)
    code = main(["run", str(path), "--out", str(out), "--resume", "--set", "rounds=3"])
    err = capsys.readouterr().err.strip().splitlines()
    return code, err


def _theta_1e30(ckpt, out):
    ckpt["state"]["params"] = torch.full_like(ckpt["state"]["params"], 1e30)


@pytest.mark.parametrize("metrics", ["deleted", "edited"])
def test_a_1e30_theta_is_refused_without_a_trustworthy_metrics_log(tmp_path, capsys, metrics):
    """θ = 1e30 with metrics.jsonl deleted or its norms edited to match
    resumed and diverged; the checkpoint now records its own norms."""

    def tamper(ckpt, out):
        _theta_1e30(ckpt, out)
        log = out / "metrics.jsonl"
        if metrics == "deleted":
            log.unlink()
        else:
            import json

            norm = float(ckpt["state"]["params"].double().norm())
            rows = [json.loads(x) for x in log.read_text().splitlines()]
            for r in rows:
                r["sys/theta_norm"] = norm
            log.write_text("".join(json.dumps(r) + "\n" for r in rows))

    code, err = _resume_after(tmp_path, capsys, tamper)
    assert code == 2 and len(err) == 1 and "state.params has norm" in err[0], err
    assert "checkpoint.pt" in err[0]


def test_an_old_checkpoint_without_norms_or_metrics_is_bounded(tmp_path, capsys):
    def tamper(ckpt, out):
        _theta_1e30(ckpt, out)
        del ckpt["norms"]
        (out / "metrics.jsonl").unlink()

    code, err = _resume_after(tmp_path, capsys, tamper)
    assert code == 2 and len(err) == 1 and "no run reaches such a state" in err[0], err


def test_a_round_counter_beyond_the_runs_rounds_is_refused(tmp_path, capsys):
    """``round = 10^15`` resumed with exit 0 and ran no round."""

    def tamper(ckpt, out):
        ckpt["state"]["round"] = 10**15
        ckpt["norms"]["round"] = 10**15

    code, err = _resume_after(tmp_path, capsys, tamper)
    assert code == 2 and len(err) == 1 and "state.round is 1000000000000000" in err[0], err
    assert "2 rounds" in err[0]


def test_a_later_state_key_of_the_wrong_shape_is_refused(tmp_path, capsys):
    """DRAG's r appears after round 1; a wrong shape was waved through and froze every
    round. It is now checked against DRAG's declaration (θ-shaped)."""

    def tamper(ckpt, out):
        ckpt["state"]["server_state"]["ref"] = torch.zeros(3)

    code, err = _resume_after(tmp_path, capsys, tamper, "drag", "drag")
    assert code == 2 and len(err) == 1 and "server_state['ref'] has shape (3,)" in err[0], err


def test_an_undeclared_state_key_is_refused(tmp_path, capsys):
    def tamper(ckpt, out):
        ckpt["state"]["server_state"]["bogus"] = torch.zeros(3)

    code, err = _resume_after(tmp_path, capsys, tamper)
    assert code == 2 and len(err) == 1 and "'bogus'" in err[0], err


def _server_names() -> list[str]:
    from fedshield.algorithms.server import SERVER_ALGORITHMS

    return sorted(SERVER_ALGORITHMS.names())


@pytest.mark.parametrize("server", _server_names())
def test_every_server_state_key_a_round_creates_is_declared(server):
    """The class, not the instances: after two rounds of every server algorithm (with the
    client part it needs), every server- and client-state key is declared
    (:meth:`ServerAlgorithm.state_spec`, :meth:`ClientAlgorithm.state_spec`) with its
    shape and dtype."""
    from fedshield.core.state_check import check_table

    pair = None
    for agg in ("drag", "brdrag", "mean", "median"):
        pair = fuzz.make_pair(server, agg)
        if pair is not None:
            break
    if pair is None:
        pytest.skip(f"{server}: no fuzz pair builds")
    sim = pair.sim
    sim.end_round(pair.plan, [fuzz._clone(u) for u in pair.honest], apply_update_attack=False)
    sim.run_round(2)
    spec = sim.comp.server.state_spec(sim.state.params)
    check_table("state", sim.state.server_state, spec)
    client_spec = sim.comp.client.state_spec(sim.state.params)  # SCAFFOLD's h_m, FedDyn's
    for k, table in sim.state.client_states.items():
        check_table(f"client {k}", table, client_spec)


def test_a_meta_device_delta_is_a_screened_rejection():
    """An in-process client's meta-device delta aborted the round."""
    pair = fuzz.make_pair("fedavg", "median")

    def edit(ups):
        ups[0].delta = torch.empty_like(ups[0].delta, device="meta")
        ups[1].buffers = torch.empty_like(ups[1].buffers, device="meta")

    m = _replay(pair, edit)
    assert m["sys/rejected/delta_device"] == 1 and m["sys/rejected/buffers_device"] == 1
    assert bool(torch.isfinite(pair.sim.state.params).all())


def _flower_resumed(strategy_fn, state):
    from flwr.app import ArrayRecord

    from fedshield.flower.local import LocalGrid

    torch.manual_seed(0)
    start = ArrayRecord(nn.Linear(3, 2).state_dict())
    strategy = strategy_fn()
    strategy.state = state
    return strategy.start(LocalGrid(3, _flower_app(float)), start, num_rounds=1)


def test_flower_strategy_state_is_scale_and_shape_checked_keys_created_later_included():
    """FedACG resumed with m = 1e30 stepped θ by 1.8e31; DRAG's ``ref`` (a key
    created after round 1) of a wrong shape was not checked and froze every round."""
    pytest.importorskip("flwr")
    from fedshield.errors import ConfigError
    from fedshield.flower import strategies as S

    d = 3 * 2 + 2
    with pytest.raises(ConfigError, match=r"strategy.state\['m'\] has norm .* no run reaches"):
        _flower_resumed(S.FedACG, {"m": torch.full((d,), 1e30)})
    with pytest.raises(ConfigError, match=r"strategy.state\['ref'\] has shape \(3,\)"):
        _flower_resumed(S.DRAG, {"ref": torch.zeros(3)})
    with pytest.raises(ConfigError, match="has a key 'bogus'"):
        _flower_resumed(S.FedACG, {"bogus": torch.zeros(d)})
    result = _flower_resumed(S.FedACG, {"m": torch.full((d,), 0.01)})  # a sane state runs
    assert 1 in result.train_metrics_clientapp


# -- 9. checked before data, in one line; a kill at any moment leaves a run to resume -----
def _cfg_file(tmp_path, raw, name="c.toml") -> str:
    import tomli_w

    p = tmp_path / name
    p.write_text(tomli_w.dumps(raw))
    return str(p)


@pytest.mark.parametrize(
    ("partition", "min_size", "expected"),
    [
        ("flwr_dirichlet", 400, "data.min_size=400 × data.num_clients=6 exceeds"),
        ("flwr_iid", 400, "data.min_size=400 × data.num_clients=6 exceeds"),
        ("flwr_linear", 100, "gives the smallest of data.num_clients=6 clients at most"),
    ],
)
def test_flower_partitioners_check_min_size_before_data(
    tmp_path, capsys, small_cfg, partition, min_size, expected
):
    """``flwr_*`` partitioners skipped the min_size × clients check; the error
    came after loading, under Flower's warnings, and spoke of "alpha"."""
    pytest.importorskip("flwr_datasets")
    from fedshield.testing.cli import one_line_error

    small_cfg["data"] |= {"partition": partition, "min_size": min_size}
    out = tmp_path / "o"
    argv = ["run", _cfg_file(tmp_path, small_cfg), "--out", str(out)]
    line = one_line_error(capsys, argv, expected)
    assert "alpha" not in line and not out.exists()  # before any work


def test_an_evaluator_that_cannot_run_is_refused_before_training(tmp_path, capsys, small_cfg):
    """AutoAttack on 2 classes was refused only after the whole run trained."""
    from fedshield.testing.cli import one_line_error

    small_cfg["data"] = {
        "dataset": "synthetic",
        "params": {"num_classes": 2},
        "num_clients": 4,
        "partition": "iid",
    }
    small_cfg["eval"] |= {"metrics": ["robust"]}
    out = tmp_path / "o"
    argv = ["run", _cfg_file(tmp_path, small_cfg), "--out", str(out)]
    one_line_error(capsys, argv, "eval.params.robust.autoattack", "needs >= 4 classes", "has 2")
    assert not out.exists()


@pytest.mark.parametrize("path", ["./no_such_folder", "~/no_such_folder_xyz", "{tmp}/gone"])
def test_a_missing_hf_folder_is_an_error_naming_it(tmp_path, capsys, small_cfg, path):
    """``hf:<missing folder>`` was taken for a Hub name."""
    from fedshield.testing.cli import one_line_error

    path = path.format(tmp=tmp_path)
    small_cfg["data"] |= {"dataset": f"hf:{path}"}
    argv = ["run", _cfg_file(tmp_path, small_cfg), "--out", str(tmp_path / "o")]
    one_line_error(capsys, argv, "no folder", path.lstrip("./~").split("/")[-1], "Hub name")


def test_an_empty_config_path_is_a_clear_error(capsys):
    from fedshield.testing.cli import one_line_error

    line = one_line_error(capsys, ["run", ""], "config path is empty")
    assert "is a directory" not in line


def test_a_kill_during_start_up_leaves_a_run_that_resume_continues(
    tmp_path, capsys, small_cfg, monkeypatch
):
    """Most random kills landed during start-up (loading data), and
    ``--resume`` then said "no run to resume"."""
    import json

    from fedshield.cli import main
    from fedshield.sim import builder

    class Killed(BaseException):
        pass

    def killed(*a, **k):
        raise Killed

    path, out = _cfg_file(tmp_path, small_cfg), tmp_path / "o"
    with monkeypatch.context() as m:
        m.setattr(builder, "build", killed)
        with pytest.raises(Killed):
            main(["run", path, "--out", str(out), "-q"])
    assert (out / "config.toml").exists() and not (out / "metrics.jsonl").exists()
    assert main(["run", path, "--out", str(out), "--resume", "-q"]) == 0
    rounds = [json.loads(x)["round"] for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert rounds == [1, 2, 3, 4]
    capsys.readouterr()
    nothing = tmp_path / "never"
    assert main(["run", path, "--out", str(nothing), "--resume"]) == 2
    assert "nothing was started" in capsys.readouterr().err


def test_resume_of_a_finished_run_says_so_without_a_progress_bar(tmp_path, capsys, small_cfg):
    from fedshield.cli import main

    path, out = _cfg_file(tmp_path, small_cfg), tmp_path / "o"
    assert main(["run", path, "--out", str(out), "-q"]) == 0
    capsys.readouterr()
    assert main(["run", path, "--out", str(out), "--resume"]) == 0
    got = capsys.readouterr()
    text = got.out + got.err
    assert "already finished (4 rounds)" in text and "0/4" not in text


# -- 10. discoverability ---------------------------------------------------------------------
def test_fedshield_list_shows_every_registry(capsys):
    """``fedshield list`` had no pre-aggregators kind although the README says
    it lists every registry; now every module-level Registry of fedshield is one of its
    kinds (found by walking the package, not by a hand-kept list)."""
    import importlib
    import pkgutil
    import sys

    import fedshield
    from fedshield.cli import LIST_KINDS, _registries, main
    from fedshield.registry import Registry

    for mod in pkgutil.walk_packages(fedshield.__path__, "fedshield."):
        skip = mod.name.endswith("__main__") or mod.name.startswith("fedshield.sweep_ray")
        if not skip:  # __main__ would run the CLI; the Ray sweep registers nothing
            importlib.import_module(mod.name)
    found = {
        id(v): f"{name}.{attr}"
        for name, module in list(sys.modules.items())
        if name.startswith("fedshield.")
        for attr, v in vars(module).items()
        if isinstance(v, Registry)
    }
    listed = {id(r) for r in _registries().values()}
    assert not [where for i, where in found.items() if i not in listed]
    assert set(_registries()) <= set(LIST_KINDS)
    assert main(["list", "pre-aggregators"]) == 0
    out = capsys.readouterr().out
    assert "nnm" in out and "bucketing" in out


def test_verbose_help_of_list_and_report_does_not_promise_round_events(capsys):
    from fedshield.cli import build_parser

    for cmd in ("list", "report"):
        with pytest.raises(SystemExit):
            build_parser().parse_args([cmd, "--help"])
        text = " ".join(capsys.readouterr().out.split())
        assert "round-level events (rejected" not in text and "no effect here" in text


def test_flwr_dirichlet_says_what_it_equals():
    """It equals Flower's DirichletPartitioner only with fedshield's shuffle
    and derived seed, said only in a docstring; `fedshield list` shows the entry's help."""
    from fedshield.data import PARTITIONERS

    entry = PARTITIONERS.entry("flwr_dirichlet")
    assert "shuffled by fedshield's partition stream" in entry.help
    assert "derived" in entry.schema.model_fields["beta"].description


def test_eval_metrics_empty_alone_works_on_an_eevit_preset(caplog):
    """On eevit presets ``eval.metrics = []`` also needed ``eval.params = {}``."""
    from fedshield import config
    from fedshield.errors import ConfigError
    from fedshield.sim.builder import build_components

    cfg = config.load(preset="eevit-digits-cpu", overrides=["eval.metrics=[]"])
    assert cfg.eval.params  # the preset's parameters are still there
    logging.disable(logging.NOTSET)
    with caplog.at_level(logging.WARNING, logger="fedshield"):
        build_components(cfg)
    assert "is ignored" in caplog.text
    typo = config.load(preset="eevit-digits-cpu", overrides=["eval.params.routng={}"])
    with pytest.raises(ConfigError, match="routng"):
        build_components(typo)


def test_a_kill_in_the_first_second_leaves_a_run_that_resume_continues(tmp_path, small_cfg):
    """A SIGKILL while the command was still importing torch or checking the
    config (its first seconds) left no file, and ``--resume`` said "no run to resume". The
    command line is marked in ``--out`` as soon as it is read: killed the moment the marker
    appears (before the config is even loaded), the same command with ``--resume`` trains
    every round."""
    import json
    import os
    import signal
    import subprocess
    import sys
    import time

    path, out = _cfg_file(tmp_path, small_cfg), tmp_path / "o"
    argv = [sys.executable, "-m", "fedshield", "run", path, "--out", str(out), "-q"]
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 60
        while not (out / ".starting").exists() and proc.poll() is None:
            assert time.monotonic() < deadline, "the start marker never appeared"
            time.sleep(0.005)
        os.kill(proc.pid, signal.SIGKILL)
    finally:
        proc.wait(timeout=60)
    assert proc.returncode == -signal.SIGKILL  # killed, not finished
    assert not (out / "metrics.jsonl").exists()
    from fedshield.cli import main

    assert main([*argv[3:], "--resume"]) == 0  # the same command, in this process
    rounds = [json.loads(x)["round"] for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert rounds == [1, 2, 3, 4]
    assert not (out / ".starting").exists()  # config.toml took its place


def test_refused_input_leaves_no_start_marker(tmp_path, capsys, small_cfg):
    """The early marker is undone when the input is refused: bad input leaves nothing."""
    from fedshield.cli import main

    small_cfg["rounds"] = -1
    out = tmp_path / "new" / "o"
    assert main(["run", _cfg_file(tmp_path, small_cfg), "--out", str(out)]) == 2
    assert "rounds" in capsys.readouterr().err
    assert not (tmp_path / "new").exists()
    keep = tmp_path / "mine"
    keep.mkdir()
    (keep / "notes.txt").write_text("my file")
    assert main(["run", _cfg_file(tmp_path, small_cfg), "--out", str(keep)]) == 2
    assert sorted(p.name for p in keep.iterdir()) == ["notes.txt"]
