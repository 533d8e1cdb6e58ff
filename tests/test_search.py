"""The searched attacker and the searched defense (docs/cross-round.md, "Searched attacker"),
on a tiny digits setting (20 clients, S = 10, an mlp of 8 hidden units, 3 rounds)."""

from __future__ import annotations

import copy
import json
import tomllib
from pathlib import Path
from typing import Any

import pytest
import tomli_w

from fedshield.cli import main
from fedshield.config import validate
from fedshield.runner import run
from fedshield.search.attack_search import MENU, STEALTH, search_attack
from fedshield.search.defense_search import search_defense
from fedshield.search.trials import Defense, Trials, experiment, quiet_logs, refusal

#: The shipped recommend config (the quiet grid's setting), made tiny: 20 clients, an mlp of
#: 8 hidden units, 2 local steps, 3 rounds.
BASE: dict[str, Any] = tomllib.loads(
    (Path(__file__).resolve().parents[1] / "bench/recommend-digits.toml").read_text()
)
BASE.update(seed=1, rounds=3)
BASE["data"]["num_clients"] = 20
BASE["model"]["params"]["hidden"] = 8
BASE["client"]["local_steps"] = 2
MEDIAN = Defense((), "median", ("step_bound", "reputation"))
#: Bucketing halves the rows; Multi-Krum's f then needs more than it leaves.
REFUSED = Defense(("bucketing",), "multikrum", ())


@pytest.fixture(scope="module")
def trials() -> Trials:
    return Trials(copy.deepcopy(BASE), 3)


def test_stealth_parameters_reproduce_the_stealth_run(trials: Trials) -> None:
    # The family at stealth's parameters is the menu's stealth end to end.
    raw = experiment(BASE, MEDIAN, STEALTH, 1, 3)
    raw["attack"] = {**raw["attack"], "name": "stealth", "params": {}}
    with quiet_logs():
        menu = float(run(validate(raw, "test"), None, quiet=True)["final_test_acc"])
    assert trials.accuracy(MEDIAN, STEALTH, 1) == menu


def test_attack_search_is_at_least_as_strong_as_the_menu(trials: Trials) -> None:
    found = search_attack(trials, MEDIAN, [1, 2], n_trials=len(MENU) + 2, seed=0)
    menu = [
        (trials.accuracy(MEDIAN, p, 1) + trials.accuracy(MEDIAN, p, 2)) / 2 for p in MENU.values()
    ]
    assert found.acc <= min(menu)
    assert len(found.trials) == len(MENU) + 2
    done = [t for t in found.trials if t["state"] == "complete"]
    best = min(done, key=lambda t: t["acc"])
    assert best["params"] == found.params
    assert set(STEALTH) <= set(found.params) <= set(STEALTH) | {"tau"}
    # the objective is the tuning seeds' mean of the recorded runs
    mean = sum(trials.accuracy(MEDIAN, found.params, s) for s in (1, 2)) / 2
    assert found.acc == pytest.approx(mean, abs=1e-12)


def test_defense_search_prunes_what_the_builder_refuses(trials: Trials) -> None:
    why = refusal(BASE, REFUSED)
    assert why is not None and "multikrum" in why
    assert refusal(BASE, MEDIAN) is None
    found = search_defense(trials, [STEALTH], [1], n_trials=2, start=[REFUSED, MEDIAN])
    assert [r["name"] for r in found.refused] == [REFUSED.name]
    assert found.refused[0]["reason"] == why
    assert [s["name"] for s in found.scored] == [MEDIAN.name]
    assert found.defense == MEDIAN and found.score == trials.accuracy(MEDIAN, STEALTH, 1)


def test_recommend_command_writes_the_choice_and_its_attack(tmp_path: Path) -> None:
    conf = tmp_path / "tiny.toml"
    conf.write_text(tomli_w.dumps({**BASE, "server": {**BASE["server"], **MEDIAN.server()}}))
    out = tmp_path / "rec.json"
    code = main(
        [
            "recommend", str(conf), "--budget-minutes", "0.5", "--tuning-seeds", "1",
            "--held-out-seeds", "7", "--attack-trials", "2", "--defense-trials", "2",
            "--out", str(out), "-q",
        ]
    )  # fmt: skip
    assert code == 0
    res = json.loads(out.read_text())
    assert {"commit", "config_sha256", "choice", "held_out", "pool", "steps"} <= set(res)
    worst = res["held_out"]["worst"]
    assert worst["params"] in res["pool"] and res["held_out"]["seeds"] == [7]
    assert worst["gap"] == min(a["gap"] for a in res["held_out"]["attacks"])
    assert res["steps"] and res["steps"][0]["attack"]["trials"]


class _Placement(Trials):
    """Accuracy = h / 10 on every seed, no training: a stand-in to test the search."""

    def accuracy(self, defense: Defense, attack: dict[str, Any] | None, seed: int) -> float:
        self.runs += 1
        return 1.0 if attack is None else float(attack["h"]) / 10.0


def test_halving_stops_a_trial_behind_after_its_first_seed() -> None:
    fake = _Placement(BASE, 3)
    found = search_attack(fake, MEDIAN, [1, 2, 3, 4], n_trials=24, seed=1)
    states = [t["state"] for t in found.trials]
    assert "pruned" in states and states.count("complete") >= len(MENU)
    # a pruned trial ran fewer seeds than the four a completed one runs
    assert fake.runs < 4 * len(states)
    assert found.acc == min(t["acc"] for t in found.trials if t["state"] == "complete")
    assert found.acc < min(p["h"] for p in MENU.values()) / 10.0  # TPE went below the menu


def test_recommend_refuses_what_it_cannot_search(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    conf = tmp_path / "c.toml"
    args = ["recommend", str(conf), "--budget-minutes", "1", "-q"]
    for change, said in (
        ({"attack": {"name": "none"}}, "attack.fraction = 0"),
        ({"server": {**BASE["server"], "algorithm": "brdrag"}}, "server.algorithm = 'brdrag'"),
        ({}, "must not share a seed"),
    ):
        conf.write_text(tomli_w.dumps({**BASE, **change}))
        seeds = ["--tuning-seeds", "1", "--held-out-seeds", "1,2"] if not change else []
        assert main([*args, *seeds]) == 2
        assert said in capsys.readouterr().err


def test_a_root_referenced_defense_runs_its_own_rule_on_a_root_set(trials: Trials) -> None:
    # BR-DRAG named as a search defense: the base's median is dropped (BR-DRAG aggregates by
    # its own rule), a root set is given (the builder refuses BR-DRAG without one), and the
    # composition round-trips through its [server] keys.
    brdrag = Defense((), None, ("collusion",), algorithm="brdrag")
    assert brdrag.needs_root and not MEDIAN.needs_root
    raw = experiment(BASE, brdrag, STEALTH, 1, 3)
    assert raw["server"]["algorithm"] == "brdrag" and "aggregator" not in raw["server"]
    assert raw["data"]["root_size"] == 100
    assert "root_size" not in experiment(BASE, MEDIAN, STEALTH, 1, 3)["data"]
    assert Defense.of(raw["server"]) == brdrag
    assert refusal(BASE, brdrag) is None
    acc = trials.accuracy(brdrag, STEALTH, 1)
    assert 0.0 <= acc <= 1.0


def test_known_attacks_are_tried_right_after_the_menu(trials: Trials) -> None:
    # an attack found against another defense is the attacker's next first try
    other = {**STEALTH, "centre": "mean", "h": 1.5, "spread": "simplex", "sleep": 1}
    found = search_attack(trials, MEDIAN, [1, 2], n_trials=len(MENU) + 1, known=[other])
    assert [t["params"] for t in found.trials] == [*MENU.values(), other]
    done = [t["acc"] for t in found.trials if t["state"] == "complete"]
    assert found.acc == min(done)
    # an attack already on the menu is not tried twice
    again = search_attack(trials, MEDIAN, [1], n_trials=len(MENU), known=[STEALTH])
    assert [t["params"] for t in again.trials] == list(MENU.values())


def test_recommend_reads_attacks_found_before(tmp_path: Path) -> None:
    from fedshield.errors import ConfigError
    from fedshield.search.command import known_attacks

    other = {**STEALTH, "h": 0.4, "spread": "simplex"}
    plain = tmp_path / "plain.json"
    plain.write_text(json.dumps([other]))
    assert known_attacks(str(plain)) == [other]
    bench = tmp_path / "bench.json"
    bench.write_text(json.dumps({"searches": {"nnm-median": {"params": other, "acc": 0.6}}}))
    assert known_attacks(str(bench)) == [other]
    rec = tmp_path / "rec.json"
    rec.write_text(json.dumps({"pool": [STEALTH, other]}))
    assert known_attacks(str(rec)) == [STEALTH, other]
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps([other, {**other, "centre": "nowhere"}]))
    with pytest.raises(ConfigError, match="attack 1: centre"):
        known_attacks(str(bad))
    with pytest.raises(ConfigError, match="expected a list"):
        known_attacks(str(_write(tmp_path / "e.json", {})))


def _write(path: Path, data: Any) -> Path:
    path.write_text(json.dumps(data))
    return path
