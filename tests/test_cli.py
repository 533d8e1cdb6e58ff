import json
import subprocess
import sys
from pathlib import Path

import pytest
import tomli_w

from fedshield.cli import main

REPO = Path(__file__).resolve().parents[1]


def _cfg_file(tmp_path, raw, name="c.toml"):
    p = tmp_path / name
    p.write_text(tomli_w.dumps(raw))
    return str(p)


def _one_line_error(capsys, argv, expected):
    code = main(argv)
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2
    assert len(err) == 1, err
    assert err[0].startswith("error: ") and expected in err[0], err[0]


def test_malformed_toml(tmp_path, capsys):
    p = tmp_path / "bad.toml"
    p.write_text("[data\nnum_clients = 3\n")
    _one_line_error(capsys, ["run", str(p)], "bad.toml: malformed TOML")


def test_unknown_key(tmp_path, capsys, small_cfg):
    small_cfg["server"]["aggregatr"] = "krum"
    _one_line_error(
        capsys, ["run", _cfg_file(tmp_path, small_cfg)], "server.aggregatr: unknown key"
    )


def test_missing_dataset_directory(tmp_path, capsys, small_cfg):
    small_cfg["data"].update(dataset="cifar10", root=str(tmp_path / "nowhere"), download=False)
    argv = ["run", _cfg_file(tmp_path, small_cfg), "--out", str(tmp_path / "o")]
    _one_line_error(capsys, argv, f"{tmp_path / 'nowhere' / 'cifar10'}")


def test_missing_dataset_message_names_switch(tmp_path, capsys, small_cfg):
    small_cfg["data"].update(dataset="mnist", root=str(tmp_path / "nowhere"), download=False)
    main(["run", _cfg_file(tmp_path, small_cfg), "--out", str(tmp_path / "o")])
    assert 'set data.download = "auto"' in capsys.readouterr().err


def test_impossible_partition(tmp_path, capsys, small_cfg):
    small_cfg["data"]["num_clients"] = 5000
    argv = ["run", _cfg_file(tmp_path, small_cfg), "--out", str(tmp_path / "o")]
    _one_line_error(capsys, argv, "num_clients=5000 exceeds the 1437 training samples")


def test_unknown_aggregator_suggests(tmp_path, capsys, small_cfg):
    small_cfg["server"]["aggregator"] = "meen"
    argv = ["run", _cfg_file(tmp_path, small_cfg), "--out", str(tmp_path / "o")]
    _one_line_error(capsys, argv, "did you mean 'mean'")


def test_run_set_and_report(tmp_path, capsys, small_cfg):
    cfg = _cfg_file(tmp_path, small_cfg)
    assert main(["run", cfg, "--out", str(tmp_path / "a"), "-q"]) == 0
    argv = ["run", cfg, "--set", "client.lr=0.02", "--set", "name=slow"]
    assert main([*argv, "--out", str(tmp_path / "b"), "-q"]) == 0
    assert "lr = 0.02" in (tmp_path / "b" / "config.toml").read_text()
    assert (
        main(["report", str(tmp_path / "a"), str(tmp_path / "b"), "--out", str(tmp_path / "r")])
        == 0
    )
    table = (tmp_path / "r" / "comparison.md").read_text()
    assert "| t |" in table and "| slow |" in table
    assert (tmp_path / "r" / "accuracy.png").stat().st_size > 1000
    summary = json.loads((tmp_path / "a" / "summary.json").read_text())
    assert summary["rounds"] == 4 and 0 <= summary["final_test_acc"] <= 1


def test_list_shows_registries(capsys):
    assert main(["list"]) == 0
    out = capsys.readouterr().out
    for name in ("demo", "mnist5k", "dirichlet", "cnn_small", "mean", "sgd", "fedavg"):
        assert name in out


@pytest.mark.slow
def test_cli_subprocess_error_exit_code(tmp_path):
    proc = subprocess.run(
        [sys.executable, "-m", "fedshield", "run", str(tmp_path / "absent.toml")],
        capture_output=True,
        text=True,
        env={"PYTHONPATH": str(REPO / "src"), "PATH": "/usr/bin:/bin"},
    )
    assert proc.returncode == 2
    assert proc.stderr.strip() == f"error: {tmp_path / 'absent.toml'}: config file not found"
