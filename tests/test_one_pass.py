"""A run reads each registry entry's parameters once: validated in one pass before any data
is loaded (:func:`fedshield.sim.builder.build_components`), then handed on as validated
values to the data loader, the partitioner, the model and the evaluators."""

from __future__ import annotations

import collections

import pytest

from fedshield import registry
from fedshield.config import validate
from fedshield.runner import run


@pytest.fixture
def parse_calls(monkeypatch):
    calls: collections.Counter[tuple[str, str]] = collections.Counter()
    original = registry.Entry.parse

    def counted(self, raw, where):
        calls[(self.name, where)] += 1
        return original(self, raw, where)

    monkeypatch.setattr(registry.Entry, "parse", counted)
    return calls


def test_each_entry_is_read_once_per_run(small_cfg, tmp_path, parse_calls) -> None:
    small_cfg["rounds"] = 1
    small_cfg["data"] |= {"partition": "dirichlet", "beta": 0.5}
    small_cfg["eval"] |= {"metrics": ["robust"],
                          "params": {"robust": {"pgd_steps": 2, "max_samples": 50}}}
    run(validate(small_cfg), tmp_path / "r", quiet=True)
    read = dict(parse_calls)
    for key in [("digits", "data.params"), ("dirichlet", "data"), ("mlp", "model.params"),
                ("robust", "eval.params.robust"), ("sgd", "client.params")]:  # fmt: skip
        assert key in read, (key, read)
    assert {k: n for k, n in read.items() if n > 1} == {}


def test_a_bad_value_is_still_one_line_naming_its_key(small_cfg) -> None:
    from fedshield.errors import ConfigError
    from fedshield.sim.builder import build_components

    small_cfg["data"] |= {"partition": "dirichlet", "beta": -1.0}
    with pytest.raises(ConfigError, match=r"data\.beta: Input should be greater than 0") as err:
        build_components(validate(small_cfg))
    assert "\n" not in str(err.value)
