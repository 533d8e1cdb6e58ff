"""Bad sweep input (grid files, --grid, -j) is one clear line, exit 2, before any run."""

from __future__ import annotations

import pytest
import tomli_w

from fedshield.cli import main
from fedshield.errors import ConfigError
from fedshield.sweep import LocalBackend, expand, read_grid
from fedshield.testing.cli import one_line_error


def _write(path, data: dict) -> str:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(tomli_w.dumps(data))
    return str(path)


def _grid(tmp_path, small_cfg, **spec) -> str:
    """A one-run grid on a one-round base config (a few seconds if it does run)."""
    _write(tmp_path / "base.toml", small_cfg | {"rounds": 1})
    return _write(tmp_path / "grid.toml", {"name": "g", "file": "base.toml", **spec})


def test_every_variant_is_checked_before_the_first_run(tmp_path, capsys, small_cfg) -> None:
    """Krum with f=9 on 10 clients per round is impossible: the second variant's error
    comes before the first variant trains, naming that variant."""
    small_cfg["data"]["num_clients"] = 10
    small_cfg["server"]["clients_per_round"] = 10
    variants = [
        {"name": "mean"},
        {"name": "krum", "set": ['server.aggregator="krum"', "server.aggregator_args.f=9"]},
    ]
    grid = _grid(tmp_path, small_cfg, variant=variants)
    out = tmp_path / "out"
    one_line_error(
        capsys, ["sweep", grid, "--out", str(out), "-q"], "grid run krum", "server.aggregator"
    )
    assert not out.exists()  # nothing trained, no folder written


def test_every_cell_and_seed_is_checked(tmp_path, small_cfg) -> None:
    small_cfg["server"] |= {"aggregator": "krum", "aggregator_args": {"f": 0}}
    _write(tmp_path / "base.toml", small_cfg)
    spec = {"file": "base.toml", "grid": {"server.aggregator_args.f": [0, 5]}}
    with pytest.raises(ConfigError, match=r"grid run f=5_seed=0: server\.aggregator='krum'"):
        expand(spec, tmp_path, seeds=[0, 1])
    spec["grid"]["data.dataset"] = ["digitz"]  # a name checked only by the registries
    spec["grid"]["server.aggregator_args.f"] = [0]
    with pytest.raises(ConfigError, match=r"grid run f=0_dataset=digitz: .*data\.dataset"):
        expand(spec, tmp_path)


def test_plugin_files_are_relative_to_the_base_config(tmp_path, small_cfg, monkeypatch) -> None:
    """`plugins = ["my_rules.py"]` in a grid's base config means the file next to that
    config, as for `fedshield run cfg.toml`, wherever the sweep is started from."""
    conf = tmp_path / "conf"
    conf.mkdir()
    (conf / "my_rules.py").write_text(
        "from fedshield.aggregators.base import AGGREGATORS\n"
        "from fedshield.aggregators.mean import Mean\n"
        "AGGREGATORS.register('sweep_inputs_rule', tags=['uses_weights', 'reference_free'])"
        "(type('R', (Mean,), {'__doc__': 'A test rule.'}))\n"
    )
    small_cfg |= {"plugins": ["my_rules.py"], "rounds": 1}
    small_cfg["server"]["aggregator"] = "sweep_inputs_rule"
    _write(conf / "cfg.toml", small_cfg)
    grid = _write(tmp_path / "grid.toml", {"name": "g", "file": "conf/cfg.toml"})
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    _, runs = expand(*read_grid(grid))
    assert runs[0].raw["plugins"] == [str((conf / "my_rules.py").resolve())]
    assert main(["sweep", grid, "--out", str(tmp_path / "out"), "-q"]) == 0
    assert (tmp_path / "out" / "g" / "summary.json").exists()


@pytest.mark.parametrize("text", ["", "# only a comment\n\n"])
def test_an_empty_grid_file_is_an_error(tmp_path, capsys, text) -> None:
    empty = tmp_path / "g.toml"
    empty.write_text(text)
    with pytest.raises(ConfigError, match="g.toml: the grid file is empty"):
        read_grid(str(empty))
    out = tmp_path / "out"
    argv = ["sweep", str(empty), "--out", str(out), "-q", "--set", "rounds=1"]
    one_line_error(capsys, argv, str(empty), "empty")  # not the demo
    assert not out.exists()


def test_an_empty_base_config_file_is_an_error(tmp_path) -> None:
    (tmp_path / "base.toml").write_text("# nothing\n")
    with pytest.raises(ConfigError, match=r"base\.toml \(grid\.file\): the config is empty"):
        expand({"file": "base.toml"}, tmp_path)


def test_a_grid_name_typo_suggests(capsys) -> None:
    argv = ["sweep", "--grid", "brdrag-attacks-20-cp"]
    line = one_line_error(capsys, argv, "did you mean 'brdrag-attacks-20-cpu'", "known: ")
    assert "'brdrag-attacks-20-cp'" in line
    one_line_error(capsys, ["sweep", "--grid", "../demo"], "unknown grid '../demo'")


@pytest.mark.parametrize("jobs", ["0", "-3"])
def test_jobs_below_one_are_refused(tmp_path, capsys, small_cfg, jobs) -> None:
    grid = _grid(tmp_path, small_cfg)
    out = tmp_path / "out"
    one_line_error(capsys, ["sweep", grid, "--out", str(out), "-q", "-j", jobs], "-j", jobs)
    assert not out.exists()
    with pytest.raises(ConfigError, match="-j/--jobs"):
        LocalBackend(int(jobs))


def test_base_and_file_together_are_refused(tmp_path, capsys, small_cfg) -> None:
    grid = _grid(tmp_path, small_cfg, base="demo")
    out = tmp_path / "out"
    one_line_error(capsys, ["sweep", grid, "--out", str(out), "-q"], "base", "file", "grid")
    assert not out.exists()


@pytest.mark.parametrize(
    ("extra", "expected"),
    [
        ({"file": 3}, "grid.file"),
        ({"base": ["demo"]}, "grid.base"),
        ({"name": 7}, "grid.name"),
        ({"variant": []}, "grid.variant"),
        ({"variant": ["a"]}, "grid.variant"),
    ],
)
def test_grid_keys_of_the_wrong_type(tmp_path, small_cfg, extra, expected) -> None:
    _write(tmp_path / "base.toml", small_cfg)
    spec = {"file": "base.toml", **extra}
    if "base" in extra:
        del spec["file"]
    with pytest.raises(ConfigError, match=expected.replace(".", r"\.")):
        expand(spec, tmp_path)


def test_a_ray_sweep_leaves_the_device_check_to_its_workers() -> None:
    """A GPU grid started from a CPU-only head: refused locally, accepted for Ray, whose
    workers check run.device where the run goes."""
    from pathlib import Path

    import torch

    from fedshield.errors import ConfigError
    from fedshield.sweep import expand

    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    spec = {"name": "g", "base": "demo", "set": ['run.device="cuda"', "rounds=1"]}
    assert len(expand(spec, Path("."), local=False)[1]) == 1
    with pytest.raises(ConfigError, match="run.device"):
        expand(spec, Path("."))


def test_sweep_flag_errors_come_before_the_run_list_is_printed(tmp_path, capsys) -> None:
    from fedshield.cli import main

    grid = tmp_path / "g.toml"
    grid.write_text('name = "g"\nbase = "demo"\nset = "rounds=1"\n')
    cases = [
        (["sweep", "--grid", "demo", "-j", "0"], "-j/--jobs 0"),
        (["sweep", str(grid), "--set", "seed=1"], "grid.set: expected a list"),
    ]
    for argv, message in cases:
        assert main([*argv, "--out", str(tmp_path / "o")]) == 2
        cap = capsys.readouterr()
        assert message in cap.err and "runs →" not in cap.out
    assert not (tmp_path / "o").exists()
