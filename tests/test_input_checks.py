"""Reproducers of the bad-input contract: one line ``error: ...`` naming the
key, exit status 2, before any work — and a diverged run never ends as a silent exit 0."""

from __future__ import annotations

import json
import signal
from pathlib import Path

import pytest
import tomli_w

from fedshield.cli import build_parser, main
from fedshield.testing.cli import one_line_error


def _cfg(tmp_path: Path, raw: dict, name: str = "c.toml") -> str:
    p = tmp_path / name
    p.write_text(tomli_w.dumps(raw))
    return str(p)


@pytest.fixture
def no_data(monkeypatch):
    """Fail the test if any data is loaded or the experiment built."""
    import fedshield.sim.builder as builder

    def refuse(*a, **k):
        raise AssertionError("data was loaded before the input was checked")

    monkeypatch.setattr(builder, "build", refuse)
    monkeypatch.setattr(builder, "load_dataset", refuse)


# -- non-finite values inside parameter tables ---------------------------------------------
@pytest.mark.parametrize(
    "override", ["server.aggregator_args.c=nan", "attack.params.sigma=inf", "client.params.mu=-inf"]
)
def test_a_non_finite_parameter_is_one_line_before_the_run_dir(
    tmp_path, capsys, no_data, override
) -> None:
    """The run-dir check wrote the config back as TOML before the component schemas saw it:
    ``TypeError: Object of type 'NoneType' is not TOML serializable``, exit 1."""
    out = tmp_path / "o"
    argv = ["run", "--preset", "brdrag-digits-cpu", "--set", override, "--out", str(out)]
    one_line_error(capsys, argv, override.split("=")[0], "finite number")
    assert not out.exists()


def test_the_library_runner_checks_components_before_the_run_dir(tmp_path, no_data) -> None:
    """`runner.run` with a config built in Python (no TOML on the way) refuses a bad
    component parameter with its schema's message, not a TOML error from the run dir."""
    from fedshield import config, runner
    from fedshield.errors import ConfigError

    cfg = config.load(preset="brdrag-digits-cpu")
    cfg.server.aggregator_args = {"c": float("nan")}
    with pytest.raises(ConfigError, match=r"server\.aggregator_args\.c: Input should be a finite"):
        runner.run(cfg, tmp_path / "o")
    assert not (tmp_path / "o").exists()


# -- a run whose loss turns non-finite ------------------------------------------------------
def test_the_dod_scale_c_is_bounded_by_the_method(capsys) -> None:
    """``c = 1e18`` made BR-DRAG's step explode (exit 0, train/loss 8e32): λ = c(1 − cos) is
    meant to lie in [0, 2] (DRAG paper), so c > 1 is refused before anything runs."""
    argv = ["run", "--preset", "brdrag-digits-cpu", "-q"]
    assert main([*argv, "--set", "server.aggregator_args.c=1e18"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "server.aggregator_args.c" in err[0]
    assert "less than or equal to 1" in err[0]


_EXPLODE = """
from fedshield.aggregators.base import AGGREGATORS
from fedshield.aggregators.mean import Mean


@AGGREGATORS.register("explode_1e30", tags=["uses_weights", "reference_free"])
class Explode(Mean):
    \"\"\"The mean times 1e30: a finite θ whose logits overflow (a diverging method).\"\"\"

    def aggregate(self, updates, weights=None, *, reference=None):
        agg, diag = super().aggregate(updates, weights, reference=reference)
        return agg * 1e30, diag
"""


def test_a_diverged_run_stops_with_status_3_and_says_so(tmp_path, small_cfg, capsys) -> None:
    (tmp_path / "explode_stop.py").write_text(_EXPLODE.replace("explode_1e30", "explode_stop"))
    small_cfg |= {"rounds": 4, "plugins": ["explode_stop.py"]}
    small_cfg["server"] |= {"aggregator": "explode_stop"}
    out = tmp_path / "o"
    assert main(["run", _cfg(tmp_path, small_cfg), "--out", str(out), "-q"]) == 3
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("error: run 't' diverged:") and "non-finite" in err[-1]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["status"] == "diverged"
    # stopped at the diverged round (run.on_nonfinite = "stop"), files consistent with it
    assert summary["rounds"] == summary["diverged_round"] < 4
    lines = (out / "metrics.jsonl").read_text().splitlines()
    assert json.loads(lines[-1])["round"] == summary["rounds"]


def test_a_diverged_run_can_continue_and_stays_marked(tmp_path, small_cfg, capsys) -> None:
    (tmp_path / "explode.py").write_text(_EXPLODE)
    small_cfg |= {"rounds": 3, "plugins": ["explode.py"]}
    small_cfg["server"] |= {"aggregator": "explode_1e30"}
    small_cfg["run"] |= {"on_nonfinite": "continue"}
    out = tmp_path / "o"
    assert main(["run", _cfg(tmp_path, small_cfg), "--out", str(out), "-q"]) == 3
    summary = json.loads((out / "summary.json").read_text())
    assert summary["status"] == "diverged" and summary["diverged_round"] == 1
    assert summary["rounds"] == 3  # continued to the last round
    assert "diverged" in capsys.readouterr().err
    small_cfg["server"] |= {"aggregator": "mean"}
    ok = _cfg(tmp_path, small_cfg, "ok.toml")
    assert main(["run", ok, "--out", str(tmp_path / "ok"), "-q"]) == 0
    assert json.loads((tmp_path / "ok" / "summary.json").read_text())["status"] == "ok"


# -- run names --------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("name", "why"),
    [("", "is empty"), ("../escaped", "path separator"), ("..", "only dots"), (" a", "spaces")],
)
def test_run_names_are_folder_names(tmp_path, capsys, monkeypatch, no_data, name, why) -> None:
    """``name = ""`` wrote the run to ``./-2``, ``name = "../escaped"`` outside ``runs/``."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "runs").mkdir()
    argv = ["run", "--preset", "demo", "--set", f"name={json.dumps(name)}"]
    one_line_error(capsys, argv, "name", why)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["runs"]
    assert not any((tmp_path / "runs").iterdir())


def test_sweep_labels_from_path_values_stay_folder_names(tmp_path, small_cfg) -> None:
    from fedshield.sweep import expand

    (tmp_path / "base.toml").write_text(tomli_w.dumps(small_cfg))
    spec = {"name": "g", "file": "base.toml", "grid": {"data.root": ["/data/a", "b\\c"]}}
    _, runs = expand(spec, tmp_path)
    assert [r.name for r in runs] == ["root=_data_a", "root=b_c"]


# -- sizes on bundled data, before loading ----------------------------------------------------
@pytest.mark.parametrize(
    ("sets", "expected"),
    [
        (["data.root_size=1437"], ["data.root_size=1437", "leaves no training data", "1437"]),
        (["data.min_size=100"], ["data.min_size=100", "exceeds", "'digits' has 1437"]),
        (
            ['data.partition="shards"', "data.shards_per_client=100"],
            ["data.shards_per_client=100", "2000 shards exceeds"],
        ),
        (["data.num_clients=2000", "server.clients_per_round=10"], ["num_clients=2000"]),
    ],
    ids=["root", "min_size", "shards", "clients"],
)
def test_impossible_sizes_on_bundled_data_fail_before_loading(
    tmp_path, capsys, no_data, sets, expected
) -> None:
    argv = ["run", "--preset", "brdrag-digits-cpu", "--out", str(tmp_path / "o")]
    for s in sets:
        argv += ["--set", s]
    one_line_error(capsys, argv, *expected)


def test_min_size_holds_under_iid_too(tmp_path, capsys, no_data) -> None:
    """``data.min_size`` was silently ignored unless the partition was Dirichlet."""
    argv = ["run", "--preset", "demo", "--out", str(tmp_path / "o")]
    argv += ["--set", 'data.partition="iid"', "--set", "data.min_size=300"]
    one_line_error(capsys, argv, "data.min_size=300", "partition 'iid'", "about 200")


def test_min_size_is_checked_on_the_partition_itself() -> None:
    import numpy as np

    from fedshield.data import partition
    from fedshield.errors import ConfigError

    labels = np.repeat(np.arange(4), 25)  # 100 samples
    assert min(map(len, partition(labels, 10, "iid", 0, min_size=10))) == 10
    with pytest.raises(ConfigError, match="data.min_size=11: partition 'iid'"):
        partition(labels, 10, "iid", 0, min_size=11)
    with pytest.raises(ConfigError, match="data.min_size=30: partition 'shards'"):
        partition(labels, 5, "shards", 0, min_size=30, shards_per_client=2)


# -- an empty client, through the library ----------------------------------------------------
def test_local_update_refuses_a_client_without_data() -> None:
    """`local_update` on an empty dataset looped for ever (every epoch was empty)."""
    import torch

    from fedshield.algorithms.client.base import ClientContext, ClientRound, LocalSpec
    from fedshield.algorithms.client.sgd import LocalSGD
    from fedshield.core.context import Payload
    from fedshield.core.flat import get_buffers, get_params
    from fedshield.data import TensorData
    from fedshield.errors import ConfigError
    from fedshield.models import build_model

    model = build_model("mlp", (1, 8, 8), 10, hidden=8)
    empty = TensorData(torch.zeros(0, 1, 8, 8), torch.zeros(0, dtype=torch.int64))
    ctx = ClientContext(0, 1, torch.Generator().manual_seed(0), torch.device("cpu"))
    payload = Payload(get_params(model), get_buffers(model))

    def stuck(*_):
        raise TimeoutError("local_update did not return within 10 s")

    old = signal.signal(signal.SIGALRM, stuck)
    signal.alarm(10)
    try:
        with pytest.raises(ConfigError, match="0 samples cannot train"):
            client = LocalSGD(LocalSpec(lr=0.1, batch_size=4))
            client.local_update(model, ClientRound(payload, empty, {}, ctx))
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)


# -- report and sweep inputs ----------------------------------------------------------------
def test_report_on_records_without_test_loss(tmp_path, capsys) -> None:
    """A metrics.jsonl without ``test_loss`` gave a KeyError traceback."""
    run = tmp_path / "r1"
    run.mkdir()
    rows = [{"round": 1, "test_acc": 0.5}, {"round": 2, "test_acc": 0.75}]
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert main(["report", str(run), "--out", str(tmp_path / "rep")]) == 0
    assert "0.7500" in (tmp_path / "rep" / "comparison.md").read_text()
    assert capsys.readouterr().err == ""


@pytest.mark.parametrize("seeds", ["", ",", "1,,2", "a"])
def test_sweep_seeds_that_are_no_list_are_refused(tmp_path, capsys, monkeypatch, seeds) -> None:
    """``--seeds ''`` ran the whole grid without seeds."""
    import fedshield.sweep as sweep

    def refuse(*a, **k):
        raise AssertionError("the sweep started")

    monkeypatch.setattr(sweep, "run_sweep", refuse)
    argv = ["sweep", "--grid", "demo", "--seeds", seeds, "--out", str(tmp_path / "s")]
    one_line_error(capsys, argv, f"--seeds {seeds!r}", "e.g. 0,1,2")


def test_verbose_after_the_subcommand() -> None:
    """``fedshield run -v`` was refused (only ``fedshield -v run`` worked)."""
    parser = build_parser()
    for argv in (["run", "-v"], ["-v", "run"], ["sweep", "--grid", "demo", "--verbose"]):
        assert parser.parse_args(argv).verbose is True
    assert parser.parse_args(["run"]).verbose is False


def test_sweep_resume_and_the_interrupt_message(tmp_path, small_cfg, capsys, monkeypatch) -> None:
    """Ctrl-C in a sweep said "resume with --resume", which `sweep` did not accept."""
    import fedshield.sweep as sweep

    small_cfg |= {"rounds": 1}
    (tmp_path / "base.toml").write_text(tomli_w.dumps(small_cfg))
    grid = tmp_path / "grid.toml"
    grid.write_text(tomli_w.dumps({"name": "g", "file": "base.toml", "grid": {"seed": [0, 1]}}))
    out = tmp_path / "s"
    one_line_error(capsys, ["sweep", str(grid), "--out", str(out), "--resume"], "no sweep")
    real = sweep.run_sweep

    def interrupted(runs, out, **kw):
        real(runs[:1], out, **kw)  # the first run finishes, then Ctrl-C
        raise KeyboardInterrupt

    monkeypatch.setattr(sweep, "run_sweep", interrupted)
    assert main(["sweep", str(grid), "--out", str(out), "-q"]) == 130
    msg = capsys.readouterr().err
    assert "same sweep command again" in msg and "--resume" in msg
    monkeypatch.setattr(sweep, "run_sweep", real)
    before = (out / "seed=0" / "metrics.jsonl").read_text()
    assert main(["sweep", str(grid), "--out", str(out), "--resume", "-q"]) == 0
    assert (out / "seed=0" / "metrics.jsonl").read_text() == before  # kept, not re-run
    assert (out / "seed=1" / "summary.json").exists()


@pytest.mark.parametrize("value", ["[]", "{}", "3"])
def test_a_dual_head_backbone_that_is_no_name(tmp_path, capsys, no_data, value) -> None:
    """Found by the config fuzz (seed 1): a table or list as backbone was a TypeError."""
    argv = ["run", "--preset", "fedcart-cifar10lt-cpu", "--set", f"model.params.backbone={value}"]
    one_line_error(capsys, [*argv, "--out", str(tmp_path / "o")], "model.params.backbone")
