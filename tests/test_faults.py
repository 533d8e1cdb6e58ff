"""[faults]: availability, dropout, deadlines and partial work in the simulator.

Each model on worked examples (probabilities within a binomial tolerance, a trace honoured
exactly, deadline × speed → which clients are late and how many steps they finish), then
through the round loop: determinism, resume equality, batched == sequential, a round in
which nobody answers, the attackers' exemption, and config errors naming the key or file.
"""

from __future__ import annotations

import copy
import json
import math
from typing import Any

import numpy as np
import pytest
import tomli_w
import torch

from fedshield import config
from fedshield.cli import main
from fedshield.core.seeds import sample_available, sample_cohort
from fedshield.errors import ConfigError
from fedshield.faults import FAULT_MODELS, FaultEnv, RoundFaults
from fedshield.faults.deadline import completed_steps
from fedshield.faults.diurnal import diurnal_probability
from fedshield.faults.plan import FaultPlan, build_models
from fedshield.sim.builder import build, build_components
from fedshield.sim.engine import Simulator


def model(name: str, **params: Any):
    return FAULT_MODELS.build(name, **params)


def within_binomial(count: int, n: int, p: float, sigmas: float = 4.0) -> bool:
    return abs(count - n * p) <= sigmas * math.sqrt(n * p * (1 - p)) + 1e-9


# --- the models on worked examples --------------------------------------------------------


@pytest.mark.parametrize("p", [0.1, 0.5, 0.9])
def test_availability_probability_is_respected_over_many_rounds(p):
    env, rounds = FaultEnv(seed=3, num_clients=40), 300
    m = model("availability", p=p)
    online = np.stack([m.available(t, env) for t in range(1, rounds + 1)])  # [T, M]
    assert within_binomial(int(online.sum()), online.size, p)
    for k in range(env.num_clients):  # every client, not only the population
        assert within_binomial(int(online[:, k].sum()), rounds, p, sigmas=4.5), k
    assert model("availability", p=0.0).available(1, env).sum() == 0
    assert model("availability", p=1.0).available(1, env).all()


def test_diurnal_profile_tracks_its_sinusoid():
    assert diurnal_probability(5, 0.5, 0.4, 20.0, np.zeros(1))[0] == pytest.approx(0.9)
    assert diurnal_probability(15, 0.5, 0.4, 20.0, np.zeros(1))[0] == pytest.approx(0.1)
    assert diurnal_probability(5, 0.9, 0.4, 20.0, np.zeros(1))[0] == 1.0  # clipped
    env = FaultEnv(seed=0, num_clients=4000)
    m = model("diurnal", mean=0.5, amplitude=0.4, period=20.0)
    for rnd, p in ((5, 0.9), (10, 0.5), (15, 0.1)):
        assert within_binomial(int(m.available(rnd, env).sum()), 4000, p), rnd
    # phase_spread = 1: the clients' phases cover the cycle, so every round averages ~ mean
    spread = model("diurnal", mean=0.5, amplitude=0.4, period=20.0, phase_spread=1.0)
    for rnd in (5, 15):
        assert abs(spread.available(rnd, env).mean() - 0.5) < 0.05


def test_dropout_probability_is_respected_and_skips_exempt_clients():
    env = FaultEnv(seed=1, num_clients=30)
    m = model("dropout", p=0.25)
    dropped = 0
    for rnd in range(1, 201):
        out = RoundFaults(30, tuple(range(30)), exempt=frozenset({0, 1}))
        m.respond(rnd, env, out)
        assert not out.dropped & {0, 1}
        dropped += len(out.dropped)
    assert within_binomial(dropped, 200 * 28, 0.25)


def _trace_plan(tmp_path, rows, suffix=".csv", **kw):
    path = tmp_path / f"trace{suffix}"
    if suffix == ".csv":
        path.write_text("# clients x rounds\n" + "\n".join(",".join(map(str, r)) for r in rows))
    else:
        path.write_text(json.dumps(rows))
    models = build_models(["trace"], {"trace": {"path": str(path)}})
    return FaultPlan(models, FaultEnv(seed=0, num_clients=len(rows)), **kw)


@pytest.mark.parametrize("suffix", [".csv", ".json"])
def test_trace_is_honoured_exactly_and_repeats(tmp_path, suffix):
    rows = [[1, 0, 1], [0, 0, 1], [1, 1, 0], [1, 0, 0], [0, 1, 1]]
    plan = _trace_plan(tmp_path, rows, suffix)
    for rnd in range(1, 8):  # 3 columns: rounds 4..6 read them again
        col = (rnd - 1) % 3
        expected = tuple(k for k in range(5) if rows[k][col])
        assert plan.available(rnd) == expected, rnd
        cohort, online = plan.cohort(rnd, 2)
        assert set(cohort) <= set(expected) and online == len(expected)
        assert len(cohort) == min(2, len(expected))


def test_fixed_attackers_are_always_online_unless_they_fail(tmp_path):
    rows = [[0, 0], [1, 0], [0, 1]]
    assert _trace_plan(tmp_path, rows, exempt=(0,)).available(2) == (0, 2)
    assert _trace_plan(tmp_path, rows, exempt=(0,), attackers_fail=True).available(2) == (2,)


def test_sampling_from_the_available_clients():
    for seed in range(20):  # all available: the plain cohort stream, unchanged
        assert sample_available(seed, 4, tuple(range(30)), 7) == sample_cohort(seed, 4, 30, 7)
    pool = (1, 4, 9, 16, 25)
    cohort = sample_available(0, 1, pool, 3)
    assert len(cohort) == 3 and set(cohort) <= set(pool)
    assert sample_available(0, 1, pool, 8) == pool  # fewer than S: all of them
    assert sample_available(0, 1, (), 3) == ()


def test_deadline_times_speed_decides_who_is_late_and_their_steps():
    """Five clients of 10 steps at speeds 2, 1, 0.5, 0.25, 0.05: round times 5, 10, 20, 40,
    200 against D = 1 × median(10) = 10. Clients 2, 3, 4 are late; 2 finishes
    ⌊10·10/20⌋ = 5 steps, 3 finishes 2, 4 finishes 0 (dropped)."""
    env = FaultEnv(seed=0, num_clients=5, full_steps=lambda k: 10)
    m = model("deadline", deadline=1.0)
    m.prepare(env)
    m._speed = np.array([2.0, 1.0, 0.5, 0.25, 0.05])
    out = RoundFaults(5, (0, 1, 2, 3, 4))
    m.respond(1, env, out)
    assert out.late == {2, 3, 4} and out.steps == {2: 5, 3: 2}
    assert out.answering() == (0, 1, 2, 3) and out.local_steps(2, 10) == 5
    assert out.metrics()["faults/partial"] == 2 and out.metrics()["faults/late"] == 3
    drop = model("deadline", deadline=1.0, late="drop")
    drop.prepare(env)
    drop._speed = m._speed
    out = RoundFaults(5, (0, 1, 2, 3, 4))
    drop.respond(1, env, out)
    assert out.late == {2, 3, 4} and not out.steps and out.answering() == (0, 1)
    # A half-depth tier does half the compute per step: client 2 (speed 0.5) is on time.
    tiered = FaultEnv(0, 5, full_steps=lambda k: 10, cost=lambda k: 0.5 if k == 2 else 1.0)
    t = model("deadline", deadline=1.0)
    t.prepare(tiered)
    t._speed = m._speed
    out = RoundFaults(5, (0, 1, 2, 3, 4))
    t.respond(1, tiered, out)
    assert out.late == {3, 4}
    assert completed_steps(10, 5.0, 10.0) == 10 and completed_steps(7, 21.0, 10.0) == 3


def test_deadline_speeds_are_lognormal_per_client_and_fixed_for_the_run():
    env = FaultEnv(seed=5, num_clients=4000, full_steps=lambda k: 10)
    m = model("deadline", speed_sigma=0.5)
    m.prepare(env)
    logv = np.log(m.speeds(1, env))
    assert abs(logv.mean()) < 0.05 and abs(logv.std() - 0.5) < 0.05
    assert np.array_equal(m.speeds(1, env), m.speeds(9, env))  # no jitter: one speed a run
    j = model("deadline", speed_sigma=0.5, jitter=0.3)
    j.prepare(env)
    assert not np.array_equal(j.speeds(1, env), j.speeds(2, env))


# --- through the round loop ---------------------------------------------------------------


def raw_cfg(faults: dict[str, Any], **sections: Any) -> dict[str, Any]:
    raw: dict[str, Any] = {
        "name": "faults",
        "seed": 4,
        "rounds": 4,
        "data": {"dataset": "digits", "num_clients": 10, "partition": "dirichlet", "beta": 0.5},
        "model": {"name": "mlp", "params": {"hidden": 16}},
        "client": {"lr": 0.1, "batch_size": 16, "local_steps": 6},
        "server": {"clients_per_round": 5},
        "eval": {"every": 2},
        "checkpoint": {"every": 1},
        "run": {"progress": False, "vectorize": False},
        "faults": faults,
    }
    for key, value in sections.items():
        raw[key] = {**raw.get(key, {}), **value} if isinstance(value, dict) else value
    return raw


ALL_KINDS = {
    "models": ["availability", "dropout", "deadline"],
    "params": {
        "availability": {"p": 0.8},
        "dropout": {"p": 0.2},
        "deadline": {"deadline": 1.0, "speed_sigma": 0.8},
    },
}


def simulate(raw: dict[str, Any], out=None, resume=False) -> Simulator:
    sim = Simulator(build(config.validate(copy.deepcopy(raw))), out, resume=resume)
    sim.run()
    return sim


def test_every_fault_kind_happens_and_is_counted():
    raw = raw_cfg(ALL_KINDS, rounds=8)
    sim = simulate(raw)
    recs = sim.records
    assert all(r["faults/available"] <= 10 for r in recs)
    assert sum(r["faults/available"] < 10 for r in recs) > 0
    assert sum(r["faults/dropped"] for r in recs) > 0
    assert sum(r["faults/partial"] for r in recs) > 0
    for r in recs:  # what arrived = the cohort minus the dropped and late-dropped
        lost = r["faults/dropped"] + r["faults/late"] - r["faults/partial"]
        assert r["sys/kept"] == r["faults/sampled"] - lost
        assert r["byz/share_kept"] == 0.0


def test_faults_are_deterministic_and_resume_equals_uninterrupted(tmp_path):
    raw = raw_cfg(ALL_KINDS, attack={"name": "noise", "fraction": 0.2})
    simulate(raw, tmp_path / "full")
    simulate(raw, tmp_path / "again")
    simulate({**raw, "rounds": 2}, tmp_path / "resumed")
    simulate(raw, tmp_path / "resumed", resume=True)
    full = (tmp_path / "full" / "metrics.jsonl").read_text()
    assert full == (tmp_path / "again" / "metrics.jsonl").read_text()
    assert full == (tmp_path / "resumed" / "metrics.jsonl").read_text()
    assert '"faults/partial"' in full
    summary = json.loads((tmp_path / "full" / "summary.json").read_text())["faults"]
    records = [json.loads(line) for line in full.splitlines()]
    assert summary["dropped"] == sum(r["faults/dropped"] for r in records)
    assert summary["max_byz_share_kept"] == max(r["byz/share_kept"] for r in records)
    assert "- **faults**: mean_available " in (tmp_path / "full" / "report.md").read_text()


def test_partial_work_is_the_first_steps_of_the_full_run():
    """A late client's upload is exactly the upload of the same client trained for the
    steps it finished (the first batches of its usual stream)."""
    raw = raw_cfg({"models": ["deadline"], "params": {"deadline": {"speed_sigma": 1.0}}})
    sim = Simulator(build(config.validate(raw)))
    plan = sim.begin_round(1)
    assert plan.faults is not None and plan.faults.steps, "no partial client in round 1"
    ups = {u.client_id: u for u in sim.train_cohort(plan)}
    for k, steps in plan.faults.steps.items():
        assert 1 <= steps < 6
        short = copy.deepcopy(raw)
        del short["faults"]
        short["client"]["local_steps"] = steps
        ref = Simulator(build(config.validate(short)))
        want = ref.train_client(k, plan.payload, 1, False, {})
        assert torch.equal(ups[k].delta, want.delta), k
        assert ups[k].metrics == want.metrics


@pytest.mark.numerics  # batched vs sequential: rerun under other float kernels by `make test`
def test_batched_equals_sequential_under_faults():
    raw = raw_cfg(ALL_KINDS, attack={"name": "sign_flip", "fraction": 0.2})
    raw["server"]["aggregator"] = "median"
    seq = simulate(raw)
    raw["run"]["vectorize"] = True
    vec = simulate(raw)
    assert vec._vectorized is not None and seq._vectorized is None
    assert sum(r["faults/partial"] for r in seq.records) > 0
    for a, b in zip(seq.records, vec.records, strict=True):
        assert a.keys() == b.keys()
        for key, value in a.items():
            assert b[key] == pytest.approx(value, rel=1e-4, abs=1e-6), (a["round"], key)
    torch.testing.assert_close(vec.state.params, seq.state.params, rtol=1e-4, atol=1e-6)


def test_a_round_nobody_answers_keeps_theta_and_the_run_goes_on(tmp_path):
    rows = [[1, 0, 1, 1]] * 10  # round 2: every client offline
    (tmp_path / "t.csv").write_text("\n".join(",".join(map(str, r)) for r in rows))
    raw = raw_cfg({"models": ["trace"], "params": {"trace": {"path": str(tmp_path / "t.csv")}}})
    sim = Simulator(build(config.validate(raw)))
    thetas = [sim.state.params.clone()]
    for rnd in range(1, 5):
        sim.record(sim.run_round(rnd), 0.0)
        thetas.append(sim.state.params.clone())
    r2 = sim.records[1]
    assert r2["faults/available"] == 0 and r2["faults/sampled"] == 0 and r2["sys/skipped"] == 1
    assert torch.equal(thetas[2], thetas[1])
    assert not torch.equal(thetas[3], thetas[2]) and not torch.equal(thetas[1], thetas[0])
    # every sampled client dropping: the same
    sim = simulate(raw_cfg({"models": ["dropout"], "params": {"dropout": {"p": 1.0}}}))
    assert all(r["faults/dropped"] == 5 and r["sys/skipped"] == 1 for r in sim.records)
    assert torch.equal(sim.state.params, sim.initial[0])


def test_attackers_always_answer_unless_they_fail():
    faults = {"models": ["dropout"], "params": {"dropout": {"p": 1.0}}}
    attack = {"name": "noise", "fraction": 0.3}
    server = {"over_select": 1}  # S = 5 invited (no over-selection for the dead rounds)
    sim = simulate(raw_cfg(faults, attack=attack, server=server))
    for r in sim.records:  # only the attackers' rows arrive: the worst case
        assert r["sys/kept"] == r["byz/count"] and r["faults/dropped"] == 5 - r["byz/count"]
        if r["byz/count"]:
            assert r["byz/share_kept"] == 1.0
    sim = simulate(raw_cfg({**faults, "attackers_fail": True}, attack=attack, server=server))
    assert all(r["sys/kept"] == 0 and r["faults/dropped"] == 5 for r in sim.records)


def test_fewer_available_than_s_samples_all_of_them(caplog):
    raw = raw_cfg({"models": ["availability"], "params": {"availability": {"p": 0.3}}})
    sim = simulate(raw)
    for r in sim.records:
        assert r["faults/sampled"] == min(5, r["faults/available"])
    assert "fewer than clients_per_round=5; sampling all of them" in caplog.text


def test_no_fault_happening_is_the_plain_run():
    plain = raw_cfg({})
    del plain["faults"]
    nothing = raw_cfg(
        {"models": ["availability", "dropout"], "params": {"availability": {"p": 1.0},
                                                         "dropout": {"p": 0.0}}}
    )  # fmt: skip
    a, b = simulate(plain), simulate(nothing)
    assert torch.equal(a.state.params, b.state.params)
    assert "faults/available" not in a.records[0] and b.records[0]["faults/available"] == 10


def test_depth_tiers_set_the_step_cost():
    """eevit tiers: a client's step costs the share of parameters its tier trains."""
    from fedshield.sim.faults import fault_env

    raw = raw_cfg(
        {"models": ["deadline"]},
        model={"name": "eevit", "params": {"patch_size": 4, "embed_dim": 16, "num_heads": 2,
                                           "depth": 4}},
        client={"algorithm": "multi_exit", "params": {"depths": [1, 4]}},
        server={"algorithm": "fedavg", "aggregator": "mean"},
    )  # fmt: skip
    exp = build(config.validate(raw))
    env = fault_env(exp)
    shallow, deep = env.cost(0), env.cost(1)
    assert 0 < shallow < deep == 1.0


# --- config errors ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("faults", "expected"),
    [
        ({"modles": ["dropout"]}, "faults.modles: unknown key"),
        ({"models": ["dropot"]}, "faults.models[0]: unknown fault model 'dropot' (did you mean"),
        ({"models": ["dropout", "dropout"]}, "faults.models[1]: 'dropout' is listed twice"),
        ({"models": ["dropout"], "params": {"dropout": {"p": 1.5}}}, "faults.params.dropout.p"),
        ({"models": ["dropout"], "params": {"dropout": {"q": 0.5}}}, "faults.params.dropout.q"),
        ({"models": ["dropout"], "params": {"deadline": {}}}, "faults.params.deadline: no such"),
        ({"models": ["deadline"], "params": {"deadline": {"late": "wait"}}}, "deadline.late"),
        ({"models": ["trace"]}, "faults.params.trace.path: required"),
        ({"attackers_fail": 1}, "faults.attackers_fail"),
    ],
)
def test_bad_fault_config_names_the_key(faults, expected):
    with pytest.raises(ConfigError) as err:
        build_components(config.validate(raw_cfg(faults)))
    assert expected in str(err.value)


@pytest.mark.parametrize(
    ("text", "suffix", "why"),
    [
        (None, ".csv", "cannot read the trace file"),
        ("1,0\n1,0\n", ".csv", "2 client rows, expected data.num_clients=10"),
        ("1,0\n" * 9 + "1\n", ".csv", "client row 9 has 1 rounds, row 0 has 2"),
        ("1,0\n" * 9 + "1,2\n", ".csv", "'2' is not 0 or 1"),
        ('{"a": 1}', ".json", "expected a JSON list"),
        ("[[1, 0]" + ", [0.5, 1]" * 9 + "]", ".json", "0.5 is not 0 or 1"),
        ("[[1,", ".json", "Expecting"),
    ],
)
def test_bad_trace_file_is_one_error_naming_the_file(tmp_path, capsys, text, suffix, why):
    path = tmp_path / f"avail{suffix}"
    if text is not None:
        path.write_text(text)
    raw = raw_cfg({"models": ["trace"], "params": {"trace": {"path": str(path)}}})
    cfg_file = tmp_path / "c.toml"
    cfg_file.write_text(tomli_w.dumps(raw))
    assert main(["run", str(cfg_file), "--out", str(tmp_path / "run")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: faults.params.trace.path: "), err
    assert str(path) in err[0] and why in err[0], err[0]
    assert not (tmp_path / "run").exists()  # refused before any work


def test_central_dp_refuses_availability_but_not_dropouts():
    dp = {"central": {"clip": 1.0, "noise_multiplier": 1.0}}
    uniform = {"clients_per_round": 5, "weighting": "uniform"}
    raw = raw_cfg({"models": ["diurnal"]}, privacy=dp, server=uniform)
    with pytest.raises(ConfigError, match=r"faults.models: diurnal changes who can be sampled"):
        build_components(config.validate(raw))
    ok = raw_cfg({"models": ["dropout", "deadline"]}, privacy=dp, server=uniform)
    build_components(config.validate(ok))


def test_flower_samples_the_online_nodes_and_refuses_in_process_dropouts():
    pytest.importorskip("flwr")
    from fedshield.flower.local import LocalGrid
    from fedshield.flower.server_app import prepare, serve

    with pytest.raises(ConfigError, match=r"faults.models: dropout inject in-process"):
        prepare(config.validate(raw_cfg({"models": ["availability", "dropout"]})), None)
    raw = raw_cfg({"models": ["availability"], "params": {"availability": {"p": 0.5}}})
    raw["rounds"] = 2
    sim = prepare(config.validate(raw), None)
    serve(LocalGrid(10), sim)
    ref = simulate(raw)  # the same cohorts and the same θ as in process
    for a, b in zip(sim.records, ref.records, strict=True):
        assert a["faults/sampled"] == b["faults/sampled"] == b["sys/kept"]
        assert a["faults/available"] == b["faults/available"]
    torch.testing.assert_close(sim.state.params, ref.state.params, rtol=1e-5, atol=1e-6)


def test_the_faults_preset_builds():
    cfg = config.load(preset="demo-faults")
    assert cfg.faults is not None and set(cfg.faults.models) == {"diurnal", "dropout", "deadline"}
    build_components(cfg)
