"""A class majority as a whole run, held (docs/security.md §2): FedCART, a class
whose 2 holders include the fixed attacker is stated per class in
``summary["byzantine"]["groups"]`` (the rule may be owned on its prototype) with a warning,
and its prototype is held to honest scale (tests/test_majorities.py). A tier
majority (2 of the 3 full-depth clients attacking) is refused at build time
(tests/test_majorities.py).
"""

from __future__ import annotations

import logging
from typing import Any

import pytest

from fedshield import config as cfgmod
from fedshield.sim.builder import build
from fedshield.sim.engine import Simulator

pytestmark = [pytest.mark.slow, pytest.mark.filterwarnings("ignore")]


def class_config(attack: str | None, rounds: int = 2) -> dict[str, Any]:
    """FedCART on digits, 10 clients of 2 label shards each (so a class has 2-3 holders),
    the robust ``median`` as its rule, 1 fixed attacker (seed 0: client 2)."""
    raw = {
        "name": "fedcart-class-majority", "seed": 0, "rounds": rounds,
        "data": {"dataset": "digits", "num_clients": 10, "partition": "shards",
                 "shards_per_client": 2},
        "model": {"name": "dual_head", "params": {"backbone": "mlp", "hidden": 16}},
        "client": {"algorithm": "fedcart", "lr": 0.1, "batch_size": 32, "local_steps": 3,
                   "params": {"steps": 2}},
        "server": {"algorithm": "fedcart", "aggregator": "median", "clients_per_round": 10,
                   "params": {"match_iters": 10, "retrain_steps": 20, "num_virtual": 10}},
        "eval": {"every": rounds},
        "run": {"progress": False, "threads": 1},
    }  # fmt: skip
    if attack is not None:
        raw["attack"] = {"name": attack, "fraction": 0.1, "mode": "fixed"}
    return raw


def test_a_class_held_by_two_clients_one_attacking_is_flagged_at_build_time(caplog) -> None:
    with caplog.at_level(logging.WARNING, logger="fedshield"):
        sim = Simulator(build(cfgmod.validate(class_config("sign_flip"))))
    (bad,) = sim.exp.byzantine
    holders = {c: [k for k, d in enumerate(sim.exp.clients) if int((d.y == c).sum())]
               for c in range(10)}  # fmt: skip
    owned = sorted(c for c, h in holders.items() if len(h) == 2 and bad in h)
    assert owned, holders  # the setting: a class whose 2 holders include the attacker
    summary = sim.run()
    stated = {g["group"]: g for g in summary["byzantine"]["groups"]}
    for c in owned:  # each such class is stated, with its holders and possible attackers
        g = stated[f"class {c}"]
        assert g["holders"] == 2 and g["attackers"] >= 1 and "may own" in g["does"]
        assert any(f"class {c}" in r.getMessage() for r in caplog.records)
