"""The recommended configuration per threat model (docs/cross-round.md, "Recommended
configuration"): chosen from the measured cells, stated at build time, and the docs' table is its
rendering."""

from __future__ import annotations

from pathlib import Path

from fedshield import config
from fedshield.crossround import recommended as rec
from fedshield.crossround.recommended import ThreatModel
from fedshield.sim.builder import build_components

ROOT = Path(__file__).resolve().parents[1]


def cell(name: str, attack: str, acc: float, seed: int = 1, clients: int = 100) -> dict:
    return {
        "config": name,
        "attack": attack,
        "clients": clients,
        "cohort": 10,
        "seed": seed,
        "acc": acc,
    }


DATA = {
    "cells": [
        *(
            cell(n, "none", 0.9, s)
            for n in ("median-guarded", "cc-momentum", "brdrag")
            for s in (1, 2)
        ),
        cell("median-guarded", "stealth", 0.80, 1),
        cell("median-guarded", "stealth", 0.70, 2),  # mean 0.75: −15 points
        cell("median-guarded", "ipm", 0.88, 1),
        cell("cc-momentum", "ipm", 0.89, 1),
        cell("cc-momentum", "stealth", 0.85, 1),
        cell("cc-momentum", "stealth", 0.83, 2),  # mean 0.84: −6 points, its worst
        cell("brdrag", "stealth", 0.89, 1),  # −1 point, but needs root data
        cell("brdrag", "ipm", 0.9, 1),
        cell("main", "none", 0.9),
        cell("main", "stealth", 0.9),  # the baseline is never recommended
    ]
}


def test_worst_case_is_the_least_seed_mean_gap_to_the_clean_twin():
    w = rec.worst_case("median-guarded", DATA)
    assert w is not None and (w.attack, w.seeds, w.cells) == ("stealth", 2, 2)
    assert abs(w.gap - (-0.15)) < 1e-12 and abs(w.acc - 0.75) < 1e-12
    assert abs(rec.worst_case("cc-momentum", DATA).gap + 0.06) < 1e-12
    assert rec.worst_case("cc-momentum", DATA).cells == 2
    assert rec.worst_case("brdrag-guarded", DATA) is None  # nothing measured


def test_the_recommendation_is_the_usable_candidate_with_the_best_worst_case():
    no_root = ThreatModel(root=False, mode="fixed", faults=False)
    root = ThreatModel(root=True, mode="fixed", faults=False)
    assert rec.recommend(no_root, DATA).name == "cc-momentum"
    assert rec.recommend(root, DATA).name == "brdrag"
    assert rec.recommend(no_root, {"cells": []}).name == rec.FALLBACK[False]
    # a candidate measured on fewer cells is not compared: cc-momentum without its ipm cell
    fewer = {
        "cells": [c for c in DATA["cells"] if (c["config"], c["attack"]) != ("cc-momentum", "ipm")]
    }
    assert rec.recommend(no_root, fewer).name == "median-guarded"


def test_differences_name_each_key_the_configured_server_changes():
    conf = rec.CONFIGURATIONS["median-guarded"]
    same = conf.server()
    assert rec.differences(conf, same) == []
    other = {**same, "aggregator": "krum", "round_defenses": ["step_bound"]}
    assert rec.differences(conf, other) == [
        "server.aggregator='krum' (recommended 'median')",
        "server.round_defenses=['step_bound'] (recommended "
        "['collusion', 'consistency', 'step_bound', 'reputation'])",
    ]


def test_a_built_run_states_the_recommendation_for_its_threat_model():
    raw = {
        "name": "t",
        "rounds": 1,
        "data": {"dataset": "digits", "num_clients": 20},
        "model": {"name": "mlp", "params": {"hidden": 8}},
        # opted out of the default round defenses: the line names what the run lacks
        "server": {"aggregator": "median", "clients_per_round": 10, "round_defenses": []},
        "attack": {"name": "noise", "fraction": 0.3},
    }
    comp = build_components(config.validate(raw))
    said = comp.budget.recommended
    want = rec.recommend(ThreatModel(root=False, mode="fixed", faults=False))
    assert said["name"] == want.name and said["threat_model"].startswith("no root data")
    assert "server.round_defenses=[]" in said["line"]
    assert comp.budget.as_dict()["recommended"]["name"] == want.name


def test_the_docs_table_is_the_rendering_of_the_stored_measurement():
    text = (ROOT / "docs" / "cross-round.md").read_text()
    assert rec.markdown_table() in text, "paste rec.markdown_table() into docs/cross-round.md"


def test_a_pre_aggregator_is_part_of_the_configuration():
    conf = rec.CONFIGURATIONS["median-guarded"]
    assert rec.differences(conf, {**conf.server(), "pre_aggregators": ["nnm"]}) == [
        "server.pre_aggregators=['nnm'] (recommended [])"
    ]
    nnm = rec.Configuration("n", False, "fedavg", "median", ("collusion",), ("nnm",))
    assert nnm.server()["pre_aggregators"] == ["nnm"] and "nnm → median" in nnm.describe()
    assert rec.differences(nnm, nnm.server()) == []


#: The attacker searched against two candidates, on held-out seeds 11 and 12
HUNTED = {
    "cells": [
        cell("cc-momentum", "none", 0.9, 11),
        cell("cc-momentum", "none", 0.8, 12),
        cell("cc-momentum", "searched", 0.5, 11),
        cell("cc-momentum", "searched", 0.6, 12),  # mean 0.55 vs 0.85: −30 points
        cell("cc-momentum", "none", 0.9, 11, clients=50),
        cell("cc-momentum", "searched", 0.8, 11, clients=50),  # −10: not the worst
        cell("brdrag", "none", 0.9, 11),
        cell("brdrag", "searched", 0.88, 11),
    ]
}


def test_the_searched_attackers_worst_case_is_stated_beside_the_menus(monkeypatch):
    w = rec.searched_worst("cc-momentum", HUNTED)
    assert w is not None and (w.attack, w.clients, w.seeds) == ("searched", 100, 2)
    assert abs(w.gap + 0.30) < 1e-12
    assert rec.searched_worst("median-guarded", HUNTED) is None  # never searched
    table = rec.markdown_table(DATA, HUNTED)
    assert "| searched attacker |" in table.splitlines()[0]
    no_root = next(r for r in table.splitlines() if r.startswith("| no | fixed | no |"))
    assert "`cc-momentum`" in no_root and no_root.endswith(f"| {w.describe()} |")
    assert "| not searched |" not in no_root
    # the build-time lines read the stored measurement
    monkeypatch.setattr(rec, "searched", lambda: HUNTED)
    monkeypatch.setattr(rec, "measured", lambda: DATA)
    threat = ThreatModel(root=False, mode="fixed", faults=False)
    server = rec.CONFIGURATIONS["cc-momentum"].server()
    assert f"against an attacker searched for it: {w.describe()}" in rec.statement(threat, server)
    assert "-30.0 against an attacker searched for it" in rec.short_statement(threat, server)


def test_cells_of_another_grid_never_pair_with_the_quiet_grids() -> None:
    """A grid's cells (``data``) pair only with that grid's clean twins, even on the same
    seeds and S/M; the worst case names its grid, and the table lists each searched grid."""
    mnist = "mnist5k/cnn_small, 20 rounds"
    hunted = {
        "cells": [
            cell("cc-momentum", "none", 0.9, 11),
            cell("cc-momentum", "searched", 0.8, 11),  # digits: −10
            {**cell("cc-momentum", "none", 0.6, 11), "data": mnist},
            {**cell("cc-momentum", "searched", 0.55, 11), "data": mnist},  # mnist: −5
        ]
    }
    digits = rec.searched_worst("cc-momentum", hunted, rec.DIGITS)
    other = rec.searched_worst("cc-momentum", hunted, mnist)
    assert digits is not None and abs(digits.gap + 0.10) < 1e-12
    assert other is not None and abs(other.gap + 0.05) < 1e-12 and other.data == mnist
    both = rec.searched_worst("cc-momentum", hunted)  # the worst over both grids
    assert both is not None and (both.gap, both.data, both.cells) == (digits.gap, rec.DIGITS, 2)
    assert rec.searched_grids("cc-momentum", hunted) == [rec.DIGITS, mnist]
    table = rec.markdown_table(DATA, hunted).splitlines()
    row = next(r for r in table if "| no | fixed | no |" in r)
    assert row.endswith(f"| {digits.describe()}; {other.describe()} |")
    assert f"on {mnist}:" in other.describe() and " on " not in digits.describe()


def test_the_stored_recommend_run_is_the_mnist_grid_of_the_searched_measurement() -> None:
    """``bench_search.py --write-from`` reads a ``fedshield recommend`` result as its own
    grid: the stored cells of MNIST/cnn_small are docs/results/recommend-mnist.json's choice,
    clean and against the worst attack it met on the held-out seeds."""
    import importlib.util
    import json

    spec = importlib.util.spec_from_file_location("bench_search", ROOT / "bench/bench_search.py")
    assert spec is not None and spec.loader is not None
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    res = json.loads((ROOT / "docs/results/recommend-mnist.json").read_text())
    cells: list = []
    bench.recommend_cells(res, cells, [], [])
    assert {c["config"] for c in cells} == {"nnm-median"}
    stored = [c for c in rec.searched()["cells"] if c.get("data") == cells[0]["data"]]
    assert stored == cells
    w = rec.searched_worst("nnm-median", on=cells[0]["data"])
    assert w is not None
    assert round(100 * w.gap, 1) == round(100 * res["held_out"]["worst"]["gap"], 1)
