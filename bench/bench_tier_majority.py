"""A tier majority (docs/security.md §2) under a rule the build-time check would refuse (the
numbers in ``fedshield.sim.majorities`` and docs/security.md).

Early-exit ViT on digits (patch 2, dim 32, 3 blocks), 10 clients with depths
[3, 1, 3, 2, 1, 2, 3, 1, 2, 1]: the fixed attackers of seed 0, clients {0, 2}, are 2 of the 3
full-depth clients; lr 0.005 × 3 local steps, S = 10, ``rounds`` rounds. For each rule the
attacked run (``sign_flip``, 20 %, fixed) and its clean twin, side by side, with their
ratio. The refusal is bypassed here (the point is to measure what it refuses):
``state_groups`` is replaced by a no-op for this process only.

    PYTHONPATH=src OMP_NUM_THREADS=1 python bench/bench_tier_majority.py --rules median fltrust
"""

from __future__ import annotations

import argparse
import copy
from typing import Any

from fedshield import config as cfgmod
from fedshield.sim import builder
from fedshield.sim.engine import Simulator

DEPTHS = [3, 1, 3, 2, 1, 2, 3, 1, 2, 1]


def tier_config(rule: str, attack: str | None, rounds: int, root: int) -> dict[str, Any]:
    raw = cfgmod.read_preset("eevit-digits-cpu")
    raw["rounds"] = rounds
    raw["data"] |= {"num_clients": 10, "root_size": root}
    raw["model"]["params"] |= {"embed_dim": 32, "depth": 3}
    raw["client"] |= {"lr": 0.005, "local_steps": 3}
    raw["client"].pop("local_epochs")
    raw["client"]["params"] |= {"depths": DEPTHS, "schedule_rounds": rounds}
    raw["server"] |= {"clients_per_round": 10, "aggregator": rule}
    raw["eval"] = {"every": rounds, "batch_size": 500}
    raw["run"] = {"threads": 1, "progress": False}
    raw.pop("checkpoint", None)
    if attack is not None:
        raw["attack"] = {"name": attack, "fraction": 0.2, "mode": "fixed"}
    return raw


def final_acc(raw: dict[str, Any]) -> float:
    sim = Simulator(builder.build(cfgmod.validate(copy.deepcopy(raw))))
    return float(sim.run()["final_test_acc"])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rules", nargs="+", default=["median", "fltrust"])
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--root", type=int, default=100, help="data.root_size (FLTrust, BR-DRAG)")
    args = ap.parse_args()
    builder.state_groups = lambda *a, **k: None  # type: ignore[assignment]  # measure, not refuse
    print("rule        clean  attacked  attacked/clean")
    for rule in args.rules:
        root = args.root if rule in ("fltrust", "brdrag") else 0
        clean = final_acc(tier_config(rule, None, args.rounds, root))
        attacked = final_acc(tier_config(rule, "sign_flip", args.rounds, root))
        print(f"{rule:10s}  {clean:.3f}  {attacked:.3f}     {attacked / max(clean, 1e-9):.2f}")


if __name__ == "__main__":
    main()
