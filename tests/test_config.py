import pytest

from fedshield import config
from fedshield.errors import ConfigError


def test_unknown_key_names_path(small_cfg):
    small_cfg["client"]["lr_typo"] = 0.1
    with pytest.raises(ConfigError, match=r"client\.lr_typo: unknown key"):
        config.validate(small_cfg)


def test_wrong_type_and_range_name_path(small_cfg):
    small_cfg["client"]["lr"] = "fast"
    with pytest.raises(ConfigError, match=r"client\.lr"):
        config.validate(small_cfg)
    small_cfg["client"]["lr"] = -1.0
    with pytest.raises(ConfigError, match=r"client\.lr: Input should be greater than 0"):
        config.validate(small_cfg)


def test_literal_lists_allowed_values(small_cfg):
    small_cfg["server"]["weighting"] = "size"
    with pytest.raises(ConfigError, match=r"server\.weighting.*'samples' or 'uniform'"):
        config.validate(small_cfg)


def test_more_clients_per_round_than_clients(small_cfg):
    small_cfg["server"]["clients_per_round"] = 7
    with pytest.raises(ConfigError, match="clients_per_round=7 exceeds data.num_clients=6"):
        config.validate(small_cfg)


def test_attack_params_without_an_attack_are_refused(small_cfg, capsys):
    """``attack.params`` with ``attack.name`` left 'none' trained with no attack."""
    small_cfg["attack"] = {"params": {"target": 1}}
    with pytest.raises(ConfigError, match=r"attack\.params = \{'target': 1\} but attack\.name"):
        config.validate(small_cfg)
    small_cfg["attack"] = {"name": "backdoor", "params": {"target": 1}, "fraction": 0.2}
    config.validate(small_cfg)
    from fedshield.cli import main

    assert main(["run", "--preset", "demo", "--set", "attack.params.target=1"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "attack.params" in err and "attack.name = 'none'" in err


def test_overrides_parse_toml_values(small_cfg):
    raw = config.apply_overrides(
        small_cfg, ["client.lr=0.5", "server.aggregator=krum", "data.params.size=[1, 2]"]
    )
    assert raw["client"]["lr"] == 0.5
    assert raw["server"]["aggregator"] == "krum"
    assert raw["data"]["params"]["size"] == [1, 2]
    assert small_cfg["client"]["lr"] == 0.1  # the input is not modified
    with pytest.raises(ConfigError, match="expected KEY=VALUE"):
        config.apply_overrides(small_cfg, ["client.lr"])


def test_malformed_toml_names_file(tmp_path):
    f = tmp_path / "bad.toml"
    f.write_text("rounds = = 3\n")
    with pytest.raises(ConfigError, match=r"bad\.toml: malformed TOML"):
        config.load(f)


def test_dump_round_trips(small_cfg):
    cfg = config.validate(small_cfg)
    import tomllib

    assert config.validate(tomllib.loads(config.dump(cfg))) == cfg


@pytest.mark.parametrize("name", config.preset_names())
def test_every_preset_validates(name):
    cfg = config.load(preset=name)
    from fedshield.sim.builder import build_components

    build_components(cfg)  # names, method params and aggregator feasibility


def test_unknown_preset_suggests():
    with pytest.raises(ConfigError, match="unknown preset 'dem'.*did you mean 'demo'"):
        config.load(preset="dem")
