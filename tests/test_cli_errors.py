"""Bad input gets one clear line naming the key, file or value, exit code 2."""

from __future__ import annotations

import json

import pytest
import tomli_w

from fedshield.cli import main
from fedshield.testing.cli import one_line_error


def _cfg(tmp_path, raw, name="c.toml") -> str:
    p = tmp_path / name
    p.write_text(tomli_w.dumps(raw))
    return str(p)


@pytest.mark.parametrize(
    ("override", "expected"),
    [
        ("data.dataset=cifar11", ["data.dataset", "did you mean 'cifar10'"]),
        ("model.name=resnet50", ["model.name", "unknown model 'resnet50'"]),
        ("server.aggregator_args.ff=2", ["server.aggregator_args.ff", "unknown key"]),
        ("run.device=CPU", ["run.device"]),
        ('run.device=""', ["run.device"]),
        ("run.device=xyz", ["run.device"]),
        ("client.lr=1e308", ["client.lr", "less than or equal to 10000"]),
        ("client.lr=inf", ["client.lr", "finite number"]),
        ("client.weight_decay=inf", ["client.weight_decay", "finite number"]),
        ("server.lr=inf", ["server.lr", "finite number"]),
        ("server.lr=1e308", ["server.lr"]),
        ("server.lr='0.1'", ["server.lr", "valid number"]),
        ("eval.every=true", ["eval.every", "valid integer"]),
        ("server.aggregatr=krum", ["server.aggregatr", "did you mean 'aggregator'"]),
        ("attack.name=minmax", ["attack.name", "did you mean 'min_max'"]),
        ("plugins=['no_such_module_xyz']", ["plugins", "no_such_module_xyz"]),
    ],
)
def test_bad_values_are_one_line_errors(tmp_path, capsys, small_cfg, override, expected) -> None:
    key, _, value = override.partition("=")
    argv = [
        "run",
        _cfg(tmp_path, small_cfg),
        "--set",
        f"{key}={value}",
        "--out",
        str(tmp_path / "o"),
    ]
    one_line_error(capsys, argv, *expected)
    assert not (tmp_path / "o" / "metrics.jsonl").exists()  # before any work


def test_aggregator_parameter_typo_suggests(tmp_path, capsys, small_cfg) -> None:
    small_cfg["server"] |= {"aggregator": "krum", "aggregator_args": {"ff": 1}}
    argv = ["run", _cfg(tmp_path, small_cfg), "--out", str(tmp_path / "o")]
    one_line_error(capsys, argv, "server.aggregator_args.ff", "did you mean 'f'")


def test_binary_and_empty_config_files(tmp_path, capsys) -> None:
    binary = tmp_path / "model.pt"
    binary.write_bytes(bytes(range(256)) * 4)
    one_line_error(capsys, ["run", str(binary)], "model.pt", "not a TOML text file")
    empty = tmp_path / "empty.toml"
    empty.write_text("# nothing here\n")
    one_line_error(capsys, ["run", str(empty)], "empty.toml", "empty", "rounds", "--preset")


def test_resume_of_a_missing_run_is_an_error(tmp_path, capsys, small_cfg) -> None:
    argv = ["run", _cfg(tmp_path, small_cfg), "--out", str(tmp_path / "nope"), "--resume"]
    one_line_error(capsys, argv, "--resume", "no run to resume", "nope")
    assert not (tmp_path / "nope").exists()


def test_summary_is_strict_json(tmp_path, small_cfg) -> None:
    small_cfg["rounds"] = 2
    out = tmp_path / "o"
    assert main(["run", _cfg(tmp_path, small_cfg), "--out", str(out), "-q"]) == 0

    def reject(token: str) -> None:
        raise ValueError(token)

    text = (out / "summary.json").read_text()
    json.loads(text, parse_constant=reject)  # NaN / Infinity would raise
    for line in (out / "metrics.jsonl").read_text().splitlines():
        json.loads(line, parse_constant=reject)


def test_a_plugin_from_a_temporary_module_through_the_cli(tmp_path, capsys, small_cfg) -> None:
    (tmp_path / "my_rules.py").write_text(
        '''
from pydantic import Field

from fedshield.aggregators.base import AGGREGATORS, Aggregator, check_updates
from fedshield.core.params import Params


class HalfMeanParams(Params):
    factor: float = Field(0.5, gt=0.0, le=1.0, description="scale of the mean")


@AGGREGATORS.register("half_mean_plugin", tags=["uses_weights", "reference_free"])
class HalfMean(Aggregator):
    """The weighted mean of the updates scaled by a constant factor."""

    params_schema = HalfMeanParams

    def __init__(self, factor: float = 0.5) -> None:
        self.factor = factor

    def aggregate(self, updates, weights=None, *, reference=None):
        w = check_updates(updates, weights)
        return self.factor * (w @ updates), {"agg/factor": self.factor}
'''
    )
    small_cfg |= {"plugins": ["my_rules.py"], "rounds": 2}
    small_cfg["server"] |= {"aggregator": "half_mean_plugin", "aggregator_args": {"factor": 0.25}}
    cfg = _cfg(tmp_path, small_cfg)
    out = tmp_path / "o"
    assert main(["run", cfg, "--out", str(out), "-q"]) == 0
    rec = json.loads((out / "metrics.jsonl").read_text().splitlines()[-1])
    assert rec["agg/factor"] == 0.25
    # its schema validates like a built-in one, with a did-you-mean
    small_cfg["server"]["aggregator_args"] = {"factr": 0.25}
    argv = ["run", _cfg(tmp_path, small_cfg, "bad.toml"), "--out", str(tmp_path / "p")]
    one_line_error(capsys, argv, "server.aggregator_args.factr", "did you mean 'factor'")


def test_plugin_files_of_the_same_name_in_two_places_both_load(tmp_path) -> None:
    """A module per plugin *path*: `a/my_rules.py` and `b/my_rules.py` register different
    components in one process (a sweep, a test session), and loading one twice is a no-op."""
    from fedshield.aggregators.base import AGGREGATORS
    from fedshield.plugins import load_plugins

    for sub, name in (("a", "same_stem_rule_a"), ("b", "same_stem_rule_b")):
        (tmp_path / sub).mkdir()
        (tmp_path / sub / "my_rules.py").write_text(
            "from fedshield.aggregators.base import AGGREGATORS\n"
            "from fedshield.aggregators.mean import Mean\n"
            f"AGGREGATORS.register({name!r}, tags=['uses_weights', 'reference_free'])"
            "(type('R', (Mean,), {'__doc__': 'A test rule.'}))\n"
        )
        load_plugins([str(tmp_path / sub / "my_rules.py")])
        load_plugins([str(tmp_path / sub / "my_rules.py")])
    assert {"same_stem_rule_a", "same_stem_rule_b"} <= set(AGGREGATORS.names())
    # they are the user's, not the package's (grids over "every built-in rule" skip them)
    assert not {"same_stem_rule_a", "same_stem_rule_b"} & set(AGGREGATORS.package_names())
    assert "median" in AGGREGATORS.package_names()
