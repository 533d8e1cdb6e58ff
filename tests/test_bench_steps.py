"""``fedshield bench`` under ``[faults]`` and its steps table: lockstep
training honours dropouts and late clients exactly as run-by-run training does, and each
cell's largest one-round step is divided by its clean twin's median step."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from fedshield.bench import runner
from fedshield.bench.command import bench_names, read_bench
from fedshield.bench.plan import plan
from fedshield.bench.select import select
from fedshield.bench.spec import parse_spec
from fedshield.bench.steps import step_ratio, step_rows
from fedshield.errors import ConfigError

BASE = {
    "name": "t",
    "base": "brdrag-digits-cpu",
    "rounds": 3,
    "shares": [0.3],
    "attack_modes": ["fixed"],
    "defenses": ["median"],
    "attacks": [{"name": "scaling", "params": {"k": 1.0}, "label": "clean"},
                {"name": "noise", "params": {"sigma": 100.0}}],
    "clean": "clean",
    "faults": {"drop0": [], "drop60": ['faults.models=["dropout"]',
                                       "faults.params.dropout.p=0.6"],
               "late": ['faults.models=["deadline"]', "faults.params.deadline.deadline=0.5"]},
}  # fmt: skip


def test_lockstep_honours_faults_like_run_by_run() -> None:
    """The lockstep trainer used to train every sampled client, so a bench's dropout
    column equalled its no-dropout column; now it trains who answers, late ones partly."""
    p = plan(parse_spec(BASE), Path("."))
    raws = [r.raw for r in p.runs]
    batched = runner.run_group(raws, lockstep=True)
    alone = runner.run_group(raws, lockstep=False)
    for b, a in zip(batched, alone):
        assert b["test_acc"] == pytest.approx(a["test_acc"], abs=1e-9)
        assert b["step_max"] == pytest.approx(a["step_max"], rel=1e-6)  # float32 sums
    by = {r.id: b for r, b in zip(p.runs, batched)}
    ids = [r.id for r in p.runs if r.attack == "clean"]
    steps = {r.split("__")[4]: by[r]["step_median"] for r in ids}
    assert len(set(steps.values())) == 3, steps  # dropout and deadlines change the run


def test_step_ratio_divides_by_the_clean_twin() -> None:
    p = plan(parse_spec(BASE | {"faults": {"none": []}}), Path("."))
    res = {r.id: {"status": "ok", "test_acc": 0.5, "val_acc": 0.5, "step_max": 4.0,
                  "step_median": 2.0 if r.attack == "clean" else 9.0} for r in p.runs}  # fmt: skip
    noisy = next(r for r in p.runs if r.attack == "noise")
    assert step_ratio(noisy, res, "clean") == 2.0  # 4 / the clean twin's 2, not its own 9
    rows = step_rows(p, select(p, res), res)
    assert [(r[1], r[7]) for r in rows] == [("clean", 2.0), ("noise", 2.0)]
    res[noisy.id]["step_max"] = None  # a result file from before steps were recorded
    assert step_ratio(noisy, res, "clean") is None


def test_step_stats_of_a_run() -> None:
    assert runner.step_stats([1.0, 3.0, 2.0]) == {
        "step_max": 3.0, "step_median": 2.0, "steps_applied": 3}  # fmt: skip
    # skipped rounds (θ kept) are not the clean scale
    assert runner.step_stats([0.0, 0.0, 4.0, 0.0, 2.0])["step_median"] == 3.0
    assert runner.step_stats([0.0, 0.0])["step_median"] is None
    none = {"step_max": None, "step_median": None, "steps_applied": None}
    assert runner.step_stats([1.0, math.inf]) == none and runner.step_stats([]) == none


def test_clean_must_name_an_attack() -> None:
    with pytest.raises(ConfigError, match=r"bench.clean: 'none' is not an attack key"):
        parse_spec(BASE | {"clean": "none"})


def test_the_fixed_mode_benches_plan_their_grid() -> None:
    assert {"robustness-fixed-digits-cpu", "robustness-fixed-digits-quick"} <= set(bench_names())
    spec, where = read_bench(name="robustness-fixed-digits-cpu")
    p = plan(spec, where)
    # 8 defenses (6 rules, median + cache / step_bound) × 4 attacks × 3 S/M × 3 dropouts
    # × 2 modes × 3 seeds, none infeasible
    assert len(p.runs) == 8 * 4 * 3 * 3 * 2 * 3 and not p.infeasible
    assert {r.raw["data"]["num_clients"] for r in p.runs} == {20, 50, 100}
    drops = {r.setting.fault: r.raw.get("faults", {}).get("params") for r in p.runs}
    assert drops == {"drop0": None, "drop30": {"dropout": {"p": 0.3}},
                     "drop60": {"dropout": {"p": 0.6}}}  # fmt: skip
    cross = {r.defense: r.raw["server"].get("round_defenses") for r in p.runs}
    assert cross["median+cache"] == ["cache"] and cross["median+step_bound"] == ["step_bound"]
