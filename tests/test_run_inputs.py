"""`fedshield run` / `fedshield report` with bad input: one line ``error: ...`` naming the
key, file or value, exit code 2, before any work (no data loaded, no file touched)."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest
import tomli_w
import torch

from fedshield import config
from fedshield.cli import main
from fedshield.errors import ConfigError, DataError
from fedshield.sim import checkpoint
from fedshield.testing.cli import one_line_error


def _cfg(tmp_path: Path, raw: dict, name: str = "c.toml") -> str:
    p = tmp_path / name
    p.write_text(tomli_w.dumps(raw))
    return str(p)


@pytest.fixture
def no_build(monkeypatch):
    """Fail the test if the experiment is built (data loaded) at all."""
    import fedshield.sim.builder as builder

    def refuse(*a, **k):
        raise AssertionError("the experiment was built before the input was checked")

    monkeypatch.setattr(builder, "build", refuse)


# -- 1. seed bounds ------------------------------------------------------------------------
def test_seed_beyond_64_bits_is_a_config_error(tmp_path, capsys, no_build) -> None:
    argv = ["run", "--preset", "demo", "--set", "seed=18446744073709551616"]
    one_line_error(capsys, [*argv, "--out", str(tmp_path / "o")], "seed", "less than")
    assert not (tmp_path / "o").exists()


def test_seed_bounds(small_cfg) -> None:
    assert config.validate(dict(small_cfg, seed=2**63 - 1)).seed == 2**63 - 1
    for bad in (2**63, -1):
        with pytest.raises(ConfigError, match="seed"):
            config.validate(dict(small_cfg, seed=bad))


# -- 2. corrupt checkpoints ----------------------------------------------------------------
@pytest.fixture(scope="module")
def finished_run(tmp_path_factory) -> tuple[Path, dict]:
    """A real one-round run (tiny digits MLP) to resume from."""
    base = tmp_path_factory.mktemp("run")
    raw = {
        "name": "t",
        "rounds": 1,
        "data": {"dataset": "digits", "num_clients": 4},
        "model": {"name": "mlp", "params": {"hidden": 16}},
        "client": {"lr": 0.1, "batch_size": 16, "local_steps": 2},
        "server": {"clients_per_round": 2},
        "checkpoint": {"every": 1},
        "run": {"progress": False},
    }
    assert main(["run", _cfg(base, raw), "--out", str(base / "r"), "-q"]) == 0
    return base / "r", raw


class _Planted:
    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (os.makedirs, (str(self.marker),))  # code run by a full unpickler


def _bad_checkpoints(good: bytes, marker: Path) -> dict[str, tuple[object, str]]:
    return {
        "garbage": (b"\x80\x02garbage bytes\x00\xff", "corrupt checkpoint"),
        "empty": (b"", "empty or cut short"),
        "truncated": (good[: len(good) // 2], "corrupt checkpoint"),
        "empty-dict": ({}, "no 'config' or 'state' entry"),
        "list": ([1, 2], "holds a list"),
        "bad-state": ({"config": "name = 'x'", "state": []}, "'state' is not a dict"),
        "bad-tensor": (
            {"config": "", "state": {"round": 2, "params": 1, "buffers": 2}},
            "no 'state.server_state' entry",
        ),
        "planted-pickle": ({"config": _Planted(marker)}, "refused"),
    }


@pytest.mark.parametrize(
    "case",
    [
        "garbage",
        "empty",
        "truncated",
        "empty-dict",
        "list",
        "bad-state",
        "bad-tensor",
        "planted-pickle",
    ],
)
def test_corrupt_checkpoint_on_resume(tmp_path, capsys, finished_run, no_build, case) -> None:
    run_dir, raw = finished_run
    out = tmp_path / "r"
    shutil.copytree(run_dir, out)
    marker = tmp_path / "pwned"
    content, expected = _bad_checkpoints((run_dir / "checkpoint.pt").read_bytes(), marker)[case]
    ckpt = out / "checkpoint.pt"
    if isinstance(content, bytes):
        ckpt.write_bytes(content)
    else:
        torch.save(content, ckpt)
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    argv = ["run", _cfg(tmp_path, dict(raw, rounds=2)), "--out", str(out), "--resume"]
    one_line_error(capsys, argv, str(ckpt), expected)
    assert not marker.exists()  # the planted code did not run
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before  # nothing lost


def test_resuming_a_real_run_still_works_and_reads_the_checkpoint_once(
    tmp_path,
    finished_run,
    monkeypatch,
) -> None:
    run_dir, raw = finished_run
    out = tmp_path / "r"
    shutil.copytree(run_dir, out)
    loads = []
    real_load = torch.load

    def counting_load(*a, **k):
        loads.append(k.get("weights_only"))
        return real_load(*a, **k)

    monkeypatch.setattr(torch, "load", counting_load)
    argv = ["run", _cfg(tmp_path, dict(raw, rounds=2)), "--out", str(out), "--resume", "-q"]
    assert main(argv) == 0
    assert loads == [True]
    rounds = [json.loads(x)["round"] for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert rounds == [1, 2]


def test_load_checkpoint_names_a_missing_file(tmp_path) -> None:
    with pytest.raises(DataError, match="checkpoint not found"):
        checkpoint.load_checkpoint(tmp_path / "checkpoint.pt")


# -- 3. --out is an existing file ----------------------------------------------------------
@pytest.mark.parametrize("sub", ["", "sub"])
def test_run_out_is_a_file(tmp_path, capsys, small_cfg, no_build, sub) -> None:
    afile = tmp_path / "afile"
    afile.write_text("keep me")
    out = afile / sub if sub else afile
    argv = ["run", _cfg(tmp_path, small_cfg), "--out", str(out)]
    one_line_error(capsys, argv, f"--out {out}", "not a directory")
    assert afile.read_text() == "keep me"


def test_report_out_is_a_file(tmp_path, capsys) -> None:
    run = _fake_run(tmp_path)
    afile = tmp_path / "afile"
    afile.write_text("keep me")
    one_line_error(capsys, ["report", str(run), "--out", str(afile)], "--out", "not a directory")
    assert afile.read_text() == "keep me"


# -- 4. malformed summary.json -------------------------------------------------------------
def _fake_run(tmp_path: Path) -> Path:
    run = tmp_path / "r1"
    run.mkdir()
    lines = [{"round": r, "test_acc": 0.1 * r, "test_loss": 1.0 / r} for r in (1, 2)]
    (run / "metrics.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    return run


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("{bad", "malformed JSON"),
        ("[1,2]", "expected a JSON object, got list"),
        ("{}", "no string 'name'"),
        ('{"name": "x", "final": 3}', "'final' is not a JSON object"),
    ],
)
def test_report_with_a_malformed_summary(tmp_path, capsys, text, expected) -> None:
    run = _fake_run(tmp_path)
    (run / "summary.json").write_text(text)
    argv = ["report", str(run), "--out", str(tmp_path / "rep")]
    one_line_error(capsys, argv, str(run / "summary.json"), expected)
    assert not (tmp_path / "rep").exists()


def test_report_with_a_record_that_is_not_an_object(tmp_path, capsys) -> None:
    run = _fake_run(tmp_path)
    with (run / "metrics.jsonl").open("a") as f:
        f.write("[3]\n")
    argv = ["report", str(run), "--out", str(tmp_path / "rep")]
    one_line_error(capsys, argv, str(run / "metrics.jsonl"), "line 3")


# -- 5. broken plugin files ----------------------------------------------------------------
@pytest.mark.parametrize(
    ("source", "expected"),
    [
        ("def broken(:\n    pass\n", ["syntax error", "line 1"]),
        ("raise RuntimeError('plugin boom')\n", ["RuntimeError: plugin boom"]),
        (
            "from fedshield.aggregators.base import AGGREGATORS\n"
            "from fedshield.aggregators.mean import Mean\n"
            "AGGREGATORS.register('mean')(type('M', (Mean,), {}))\n",
            ["aggregator 'mean' registered twice", "choose another"],
        ),
    ],
    ids=["syntax", "raises", "builtin-name"],
)
def test_broken_plugin_file(tmp_path, capsys, small_cfg, source, expected) -> None:
    name = f"bad_plugin_{abs(hash(source))}.py"  # a module of its own per case
    (tmp_path / name).write_text(source)
    argv = ["run", _cfg(tmp_path, small_cfg | {"plugins": [name]}), "--out", str(tmp_path / "o")]
    one_line_error(capsys, argv, "plugins", name, *expected)
    assert not (tmp_path / "o").exists()


# -- 6. a directory as config, malformed --set keys ----------------------------------------
def test_config_path_is_a_directory(tmp_path, capsys) -> None:
    one_line_error(capsys, ["run", str(tmp_path)], str(tmp_path), "is a directory")


@pytest.mark.parametrize("item", ["=3", ".=3", "data..beta=1", "data.=1", " =1"])
def test_malformed_set_key(tmp_path, capsys, small_cfg, no_build, item) -> None:
    argv = ["run", _cfg(tmp_path, small_cfg), "--set", item, "--out", str(tmp_path / "o")]
    one_line_error(capsys, argv, f"--set {item!r}", "malformed key")


def test_a_run_already_there_or_a_resume_with_another_config_fails_before_the_build(
    tmp_path, small_cfg, capsys, monkeypatch
) -> None:
    """Both were found after the data and model were built (6 s on a preset)."""
    out = tmp_path / "run"
    small_cfg |= {"rounds": 1}
    cfg = _cfg(tmp_path, small_cfg)
    assert main(["run", cfg, "--out", str(out), "-q"]) == 0
    import fedshield.sim.builder as builder

    def refuse(*a, **k):
        raise AssertionError("the experiment was built before the input was checked")

    monkeypatch.setattr(builder, "build", refuse)
    before = {p.name: p.read_bytes() for p in out.iterdir() if p.is_file()}
    one_line_error(capsys, ["run", cfg, "--out", str(out)], "already holds a run")
    other = _cfg(tmp_path, small_cfg | {"seed": 3}, "other.toml")
    for backend in ("sim", "flower"):
        argv = ["run", other, "--out", str(out), "--resume", "--backend", backend]
        one_line_error(capsys, argv, "--resume with a different config (changed: seed)")
    assert {p.name: p.read_bytes() for p in out.iterdir() if p.is_file()} == before
