"""The quiet-attack reproducer (docs/security.md §6b) at small size: against the median behind
``server.round_defenses = ["step_bound", "reputation"]`` with fixed attackers, the stealth
attack stays inside every published radius — no upload flagged, no client suspended, no
step clipped — and still costs the run most of its accuracy; an opportunist whose cohorts
never hold the median's breakdown count + 1 is indistinguishable from honest clients."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from fedshield import config
from fedshield.sim.builder import build
from fedshield.sim.engine import Simulator

#: digits, MLP 32, Dirichlet 0.5, S/M = 10/20, 30 % fixed attackers (6; 2–3 per cohort at
#: this seed), 8 rounds of sgd lr 0.3 × 5 steps: ~7 s of CPU per run.
RAW: dict[str, Any] = {
    "name": "quiet",
    "seed": 3,
    "rounds": 8,
    "data": {
        "dataset": "digits",
        "num_clients": 20,
        "partition": "dirichlet",
        "beta": 0.5,
        "min_size": 5,
    },
    "model": {"name": "mlp", "params": {"hidden": 32}},
    "client": {"lr": 0.3, "batch_size": 16, "local_steps": 5},
    "server": {
        "aggregator": "median",
        "clients_per_round": 10,
        "weighting": "uniform",
        "round_defenses": ["step_bound", "reputation"],
    },
    "eval": {"every": 8},
    "run": {"progress": False, "threads": 1},
}


def _run(attack: str | None) -> list[dict[str, Any]]:
    raw = copy.deepcopy(RAW)
    if attack is not None:
        raw["attack"] = {"name": attack, "fraction": 0.3, "mode": "fixed"}
    sim = Simulator(build(config.validate(raw)), None)
    sim.run()
    return sim.records


def _total(records: list[dict[str, Any]], key: str) -> float:
    return sum(r.get(key, 0.0) for r in records)


@pytest.fixture(scope="module")
def clean() -> list[dict[str, Any]]:
    return _run(None)


def test_stealth_passes_step_bound_and_reputation_and_costs_accuracy(clean) -> None:
    records = _run("stealth")
    assert max(r["byz/count"] for r in records) < 5  # the median's own breakdown holds
    assert _total(records, "defense/reputation/flagged") == 0.0
    assert _total(records, "defense/reputation/suspended") == 0.0
    assert _total(records, "defense/step_bound/clipped_blocks") == 0.0
    # measured 0.236 vs 0.503 clean (seed 3)
    assert records[-1]["test_acc"] < clean[-1]["test_acc"] - 0.15


def test_an_opportunist_below_the_breakdown_count_is_the_clean_run(clean) -> None:
    records = _run("opportunist")
    assert max(r["byz/count"] for r in records) < 5
    assert records[-1]["test_acc"] == clean[-1]["test_acc"]
    assert _total(records, "defense/reputation/flagged") == 0.0


#: The same run behind the defenses that read rows by more than a radius: collusion's
#: near-identical test and consistency's cosine with the applied step, then the reproducer's pair.
GUARDED = ["collusion", "consistency", "step_bound", "reputation"]


def _guarded_run(params: dict[str, Any] | None) -> list[dict[str, Any]]:
    raw = copy.deepcopy(RAW)
    raw["server"]["round_defenses"] = GUARDED
    if params is not None:
        raw["attack"] = {"name": "stealth", "params": params, "fraction": 0.3, "mode": "fixed"}
    sim = Simulator(build(config.validate(raw)), None)
    sim.run()
    return sim.records


def test_stealth_that_reads_collusion_and_consistency_passes_them_and_costs_accuracy() -> None:
    """``evade = true``: no copy left out by collusion, no upload flagged by consistency or
    reputation, no client suspended, no step clipped; the plain copies (jitter 0) are left
    out by collusion. Measured (seed 3): 0.278 evading, 0.386 plain, 0.503 clean."""
    evading = _guarded_run({"evade": True})
    for key in (
        "defense/collusion/duplicates",
        "defense/collusion/suspended",
        "defense/consistency/flagged",
        "defense/consistency/suspended",
        "defense/reputation/flagged",
        "defense/reputation/suspended",
        "defense/step_bound/clipped_blocks",
    ):
        assert _total(evading, key) == 0.0, key
    plain = _guarded_run({})
    assert _total(plain, "defense/collusion/duplicates") > 0.0
    clean = _guarded_run(None)
    assert evading[-1]["test_acc"] < clean[-1]["test_acc"] - 0.15
    assert evading[-1]["test_acc"] < plain[-1]["test_acc"]
