"""The bench's placement search (docs/security.md §6b): an attack's ``search`` grid runs in
full against each defense, the defense's candidate is chosen against the attacker's best
placement on validation, and a cell reports the attacker's best placement on test, named."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from fedshield.bench.plan import plan
from fedshield.bench.render import worst_text
from fedshield.bench.select import select
from fedshield.bench.spec import parse_spec
from fedshield.errors import ConfigError

STEALTH = {"name": "stealth", "search": {"h": [0.25, 0.9]}}
BASE = {
    "name": "t",
    "base": "brdrag-digits-cpu",
    "rounds": 2,
    "shares": [0.3],
    "defenses": ["median"],
    "attacks": ["ipm", STEALTH],
}


def test_empty_search_is_refused_by_the_spec() -> None:
    with pytest.raises(ConfigError, match=r"search\.h: needs at least one candidate"):
        parse_spec(BASE | {"attacks": [{"name": "stealth", "search": {"h": []}}]})


@pytest.mark.parametrize(
    ("search", "needle"),
    [
        ({"hh": [0.5]}, r"bench.attacks\[stealth\].search.hh: not a parameter of attack "
                        r"'stealth' \(did you mean 'h'\?\)"),
        ({"h": [0.5, 1.5]}, r"bench.attacks\[stealth\].search.h: 1.5: attack.params.h"),
    ],
)  # fmt: skip
def test_search_errors_name_the_key(search: dict[str, Any], needle: str) -> None:
    spec = parse_spec(BASE | {"attacks": [{"name": "stealth", "search": search}]})
    with pytest.raises(ConfigError, match=needle):
        plan(spec, Path("."), check=False)


def test_every_placement_is_a_run_of_its_own() -> None:
    p = plan(parse_spec(BASE), Path("."), check=False)
    ids = sorted(r.id for r in p.runs)
    assert ids == [
        "median__ipm__w0.3__base__none__per_round__t0__s0",
        "median__stealth__w0.3__base__none__per_round__t0__p0__s0",
        "median__stealth__w0.3__base__none__per_round__t0__p1__s0",
    ]
    placed = {r.placement: r for r in p.runs if r.attack == "stealth"}
    assert placed[0].raw["attack"]["params"] == {"h": 0.25}
    assert placed[1].raw["attack"]["params"] == {"h": 0.9}
    assert placed[1].placement_label == "h=0.9"


def _fake(p: Any, val: dict[tuple[int, str, Any], float], test: dict[tuple[int, str, Any], float]):
    return {
        r.id: {"status": "ok", "val_acc": val[r.tune, r.attack, r.placement],
               "test_acc": test[r.tune, r.attack, r.placement]}  # fmt: skip
        for r in p.runs
    }


def test_the_cell_is_the_attackers_best_placement_and_names_it() -> None:
    spec = parse_spec(BASE | {"tune": {"server.lr": [1.0, 0.5]}})
    p = plan(spec, Path("."), check=False)
    # lr 1.0: stealth's best placement on validation (h = 0.9: 0.3) is the worst case;
    # lr 0.5: its best is 0.5 (h = 0.25) → lr 0.5 is chosen although its h = 0.9 mean is
    # higher than lr 1.0's h = 0.25. On test the attacker's best at lr 0.5 is h = 0.25.
    val = {
        (0, "ipm", None): 0.8, (0, "stealth", 0): 0.9, (0, "stealth", 1): 0.3,
        (1, "ipm", None): 0.7, (1, "stealth", 0): 0.5, (1, "stealth", 1): 0.6,
    }  # fmt: skip
    test = {k: v - 0.1 for k, v in val.items()}
    (choice,) = select(p, _fake(p, val, test))
    assert choice.tune == 1 and choice.val_worst == 0.5
    cell = choice.cells["stealth"]
    assert (cell.placement, cell.placement_index) == ("h=0.25", 0)
    assert cell.mean == pytest.approx(0.4)
    assert worst_text(choice) == "0.400 (stealth h=0.25)"
    assert choice.cells["ipm"].placement == ""


def test_the_quiet_bench_searches_every_quiet_attack() -> None:
    from fedshield.bench.command import read_bench

    spec, where = read_bench(name="quiet-fixed-digits-quick")
    quiet = {a.name: a for a in spec.attacks if a.search}
    assert set(quiet) == {"stealth", "opportunist", "cache_poison"}
    p = plan(spec, where)
    # 9 defenses × (5 plain attacks + 4 + 2 + 2 + 2 + 4 placements) × 2 S/M, fixed mode,
    # none infeasible
    assert len(p.runs) == 9 * 19 * 2 and not p.infeasible
    labels = {a.label or a.name for a in spec.attacks}
    assert {"stealth_jitter", "stealth_evade"} <= labels
    assert {r.raw["attack"]["mode"] for r in p.runs} == {"fixed"}


def test_a_searched_bench_folder_reads_back_every_placement(tmp_path: Path) -> None:
    """bench.json keeps each run's placement: a folder of a searched bench is read back
    (resume, ``--render``) with the run ids it was written with (it was refused as
    "damaged" before any run of the quiet bench started)."""
    from fedshield.bench.folder import read_manifest, write_manifest

    p = plan(parse_spec(BASE), Path("."), check=False)
    shas = {r.id: f"sha-{r.id}" for r in p.runs}
    write_manifest(p, tmp_path, shas, ["fedshield", "bench"], only=False)
    back, back_shas, _ = read_manifest(tmp_path)
    assert [r.id for r in back.runs] == [r.id for r in p.runs]
    assert back_shas == shas
    labels = {r.id: r.placement_label for r in p.runs}
    assert {r.id: r.placement_label for r in back.runs} == labels


def test_the_plan_prints_each_build_time_warning_once(caplog: pytest.LogCaptureFixture) -> None:
    """Every run's components are checked, and a defense's build-time statement is the same
    for each of its attacks and placements: it is printed once, not once per run."""
    spec = parse_spec(BASE | {"attack_modes": ["fixed"],
                              "heterogeneity": {"S10of50": ["data.num_clients=50"]}})  # fmt: skip
    with caplog.at_level("WARNING"):
        p = plan(spec, Path("."))
    assert len(p.runs) == 3
    budget = [r for r in caplog.records if "byzantine budget" in r.getMessage()]
    assert len(budget) == 1, [r.getMessage() for r in caplog.records]
