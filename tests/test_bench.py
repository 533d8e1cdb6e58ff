"""``fedshield bench``: the grid file's validation, the protocol's selection, lockstep
training equal to run-by-run training, and a tiny end-to-end bench with resume."""

from __future__ import annotations

import json
import tomllib
from pathlib import Path
from typing import Any

import pytest

from fedshield.bench import runner
from fedshield.bench.command import read_bench
from fedshield.bench.plan import plan
from fedshield.bench.select import select
from fedshield.bench.spec import parse_spec
from fedshield.cli import main
from fedshield.errors import ConfigError

BASE = {
    "name": "t",
    "base": "brdrag-digits-cpu",
    "rounds": 2,
    "shares": [0.2],
    "defenses": ["median", "nnm+trimmed_mean"],
    "attacks": ["ipm", "alie"],
}


@pytest.mark.parametrize(
    ("change", "needle"),
    [
        ({"sharez": [0.2]}, "bench.sharez: unknown key (did you mean 'shares'?"),
        ({"shares": [0.2, 1.5]}, "bench: shares: a Byzantine share is in (0, 1), got 1.5"),
        ({"seeds": [0, 0]}, "seeds"),
        ({"attack_modes": ["sometimes"]}, "attack_modes.0"),
        ({"defenses": []}, "defenses"),
        ({"base": None}, "set exactly one of base"),
        ({"tune": {"declared_f": [0.5]}}, "declared_f: offsets to ⌊wS⌋ are integers"),
        ({"defenses": ["median", "median"]}, "'median' appears twice"),
        ({"heterogeneity": {"a/b": []}}, "label 'a/b'"),
    ],
)
def test_spec_errors_name_the_key(change: dict[str, Any], needle: str) -> None:
    raw = {k: v for k, v in (BASE | change).items() if v is not None}
    with pytest.raises(ConfigError) as err:
        parse_spec(raw)
    assert needle in str(err.value)


@pytest.mark.parametrize(
    ("change", "needle"),
    [
        ({"defenses": ["mediam"]}, "unknown defense rule 'mediam' (did you mean 'median'?)"),
        ({"defenses": ["nmm+median"]}, "unknown pre-aggregator 'nmm' (did you mean 'nnm'?)"),
        ({"attacks": ["ipn"]}, "bench.attacks[ipn]: unknown attack 'ipn' (did you mean 'ipm'?)"),
        ({"tune": {"server.lrr": [1.0]}}, "bench.tune.server.lrr"),
        ({"set": ["data.betta=0.1"]}, "betta"),
    ],
)
def test_plan_errors_name_the_component(change: dict[str, Any], needle: str) -> None:
    with pytest.raises(ConfigError) as err:
        plan(parse_spec(BASE | change), Path("."))
    assert needle in str(err.value)


def test_cli_bad_bench_is_one_error_line_exit_2(tmp_path: Path, capsys: Any) -> None:
    f = tmp_path / "b.toml"
    f.write_text('name = "x"\nbase = "brdrag-digits-cpu"\nshares = [2.0]\n'
                 'defenses = ["median"]\nattacks = ["ipm"]\n')  # fmt: skip
    assert main(["bench", str(f), "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: ") and "shares" in err[0]
    assert not (tmp_path / "o").exists()  # nothing was run or written
    assert main(["bench", "--bench", "tiny-cpuu"]) == 2
    assert "did you mean 'tiny-cpu'?" in capsys.readouterr().err
    assert main(["bench", "--bench", "tiny-cpu", "--only", "colour=red"]) == 2
    assert main(["bench", "--bench", "tiny-cpu", "--group", "0"]) == 2
    assert main(["bench", "--bench", "tiny-cpu", "-j", "0"]) == 2
    assert main(["bench", "--bench", "tiny-cpu", "--address", "auto"]) == 2  # needs ray


def test_infeasible_shares_are_left_out_not_errors() -> None:
    p = plan(parse_spec(BASE | {"defenses": ["krum"], "shares": [0.2, 0.4]}), Path("."))
    assert {r.setting.share for r in p.runs} == {0.2}  # Krum needs 2f + 2 < S = 10
    assert [s.share for d, s in p.infeasible] == [0.4]
    with pytest.raises(ConfigError, match="bench.defenses.krum"):  # at no share: an error
        plan(parse_spec(BASE | {"defenses": ["krum"], "shares": [0.4]}), Path("."))


def test_declared_f_and_backdoor_evaluator_in_the_run_configs() -> None:
    spec = parse_spec(BASE | {"attacks": [{"name": "backdoor", "params": {"target": 3}}],
                              "tune": {"declared_f": [0, 1]}})  # fmt: skip
    p = plan(spec, Path("."))
    run = next(r for r in p.runs if r.defense == "nnm+trimmed_mean" and r.tune == 1)
    server = run.raw["server"]
    assert server["aggregator_args"] == {"f": 3}  # ⌊0.2 · 10⌋ + 1
    assert server["pre_aggregators"] == ["nnm"] and server["pre_aggregator_args"]["nnm"]["f"] == 3
    assert run.raw["eval"]["metrics"] == ["backdoor"]
    assert run.raw["eval"]["params"]["backdoor"]["target"] == 3
    assert run.raw["eval"]["every"] == run.raw["eval"]["metrics_every"] == 1  # curves
    sparse = plan(spec.model_copy(update={"eval_every": 5}), Path(".")).runs[0].raw["eval"]
    assert sparse["every"] == 2 and "metrics_every" not in sparse  # the last round: 2
    assert run.raw["data"]["val_size"] == 200


def _fake(
    p: Any, val: dict[tuple[str, int, str], float], test: dict[tuple[str, int, str], Any]
) -> dict[str, Any]:
    out = {}
    for r in p.runs:
        key = (r.defense, r.tune, r.attack)
        t = test[key]
        out[r.id] = {"status": "diverged" if t is None else "ok", "val_acc": val[key],
                     "test_acc": t}  # fmt: skip
    return out


def test_selection_takes_the_best_validation_worst_case_per_defense() -> None:
    spec = parse_spec(BASE | {"tune": {"server.lr": [1.0, 0.5]}})
    p = plan(spec, Path("."), check=False)
    # median: lr 1.0 has the better mean on validation (0.9, 0.3) but the worse worst case;
    # lr 0.5 (0.5, 0.6) is chosen. nnm+trimmed_mean: lr 1.0 wins. Test accuracies differ
    # from validation so that the report must come from the chosen candidate's test runs.
    val = {
        ("median", 0, "ipm"): 0.9,
        ("median", 0, "alie"): 0.3,
        ("median", 1, "ipm"): 0.5,
        ("median", 1, "alie"): 0.6,
        ("nnm+trimmed_mean", 0, "ipm"): 0.7,
        ("nnm+trimmed_mean", 0, "alie"): 0.8,
        ("nnm+trimmed_mean", 1, "ipm"): 0.2,
        ("nnm+trimmed_mean", 1, "alie"): 0.9,
    }
    test = {k: v - 0.05 for k, v in val.items()} | {("median", 1, "ipm"): 0.41}
    choices = {c.defense: c for c in select(p, _fake(p, val, test))}
    assert choices["median"].tune == 1 and choices["median"].val_worst == 0.5
    assert choices["median"].worst.attack == "ipm" and choices["median"].worst.mean == 0.41
    assert choices["nnm+trimmed_mean"].tune == 0
    assert choices["nnm+trimmed_mean"].worst.attack == "ipm"


def test_a_diverged_attack_is_the_worst_case_and_never_a_number() -> None:
    p = plan(parse_spec(BASE), Path("."), check=False)
    val = {(d, 0, a): 0.8 for d in ("median", "nnm+trimmed_mean") for a in ("ipm", "alie")}
    test = dict(val) | {("median", 0, "alie"): None}
    from fedshield.bench.render import worst_text

    c = {c.defense: c for c in select(p, _fake(p, val, test))}["median"]
    assert worst_text(c) == "diverged (alie)"


def test_lockstep_equals_run_by_run() -> None:
    spec = parse_spec(BASE | {"rounds": 3, "defenses": ["median", "brdrag"],
                              "attacks": ["ipm", "label_flip"]})  # fmt: skip
    raws = [r.raw for r in plan(spec, Path(".")).runs]
    assert len(runner.groups(plan(spec, Path(".")).runs, 24)) == 1  # one group: same data
    batched = runner.run_group(raws, lockstep=True)
    alone = runner.run_group(raws, lockstep=False)
    assert all(b["lockstep"] for b in batched)
    for b, a in zip(batched, alone):  # bit-identical on this MLP (tolerance: see docs)
        assert b["test_acc"] == pytest.approx(a["test_acc"], abs=1e-9)
        assert b["val_acc"] == pytest.approx(a["val_acc"], abs=1e-9)


def test_tiny_bench_end_to_end_with_resume(tmp_path: Path, monkeypatch: Any) -> None:
    out = tmp_path / "out"
    assert main(["bench", "--bench", "tiny-cpu", "--out", str(out), "-q"]) == 0
    worst = (out / "worst.md").read_text()
    for d in ("median", "nnm+trimmed_mean"):
        row = next(line for line in worst.splitlines() if line.startswith(f"| {d} |"))
        assert "(ipm)" in row or "(backdoor)" in row or "diverged" in row
    for f in ("heatmap-median.png", "heatmap-nnm+trimmed_mean.png", "best.png", "best.md",
              "asr.md", "runs.csv", "choice.csv", "provenance.json"):  # fmt: skip
        assert (out / f).stat().st_size > 0, f
    spec, _ = read_bench(name="tiny-cpu")
    n = len(spec.defenses) * len(spec.attacks) * len(spec.tune["server.lr"])
    records = [json.loads(p.read_text()) for p in (out / "cells").glob("*.json")]
    assert len(records) == n
    assert all(r["config_sha256"] and "commit" in r for r in records)
    prov = json.loads((out / "provenance.json").read_text())
    assert len(prov["runs"]) == n and prov["commits"]

    # Resume: every run is reused; then a changed attack re-runs only its own runs.
    ran: list[int] = []
    real = runner.run_group

    def counting(raws: Any, lockstep: bool = True) -> Any:
        ran.append(len(raws))
        return real(raws, lockstep)

    monkeypatch.setattr(runner, "run_group", counting)
    assert main(["bench", "--bench", "tiny-cpu", "--out", str(out), "-q"]) == 0
    assert ran == []
    raw = tomllib.loads(
        (Path(__file__).parents[1] / "src/fedshield/presets/benches/tiny-cpu.toml").read_text()
    )
    raw["attacks"] = ["ipm", {"name": "backdoor", "params": {"target": 1}}]
    changed = tmp_path / "changed.toml"
    import tomli_w

    changed.write_text(tomli_w.dumps(raw))
    assert main(["bench", str(changed), "--out", str(out), "-q"]) == 0
    assert sum(ran) == len(spec.defenses) * len(spec.tune["server.lr"])  # backdoor runs only
    fresh = tmp_path / "fresh"  # --only into an empty folder tabulates the selection
    assert main(["bench", "--bench", "tiny-cpu", "--out", str(fresh), "-q",
                 "--only", "defense=median,attack=ipm"]) == 0  # fmt: skip
    assert "nnm+trimmed_mean" not in (fresh / "worst.md").read_text()
    assert "(backdoor)" not in (fresh / "worst.md").read_text()


def test_list_benches_shows_the_bundled_ones(capsys: Any) -> None:
    assert main(["list", "benches"]) == 0
    out = capsys.readouterr().out
    assert "robustness-digits-cpu" in out and "tiny-cpu" in out


def test_bench_list_names_both_kinds_of_bench_and_how_to_run_them(
    capsys: Any, monkeypatch: Any
) -> None:
    """docs/bench.md: the registered benches (``fedshield bench --bench NAME``) and the
    checkout's measurement scripts (``python bench/NAME.py``), each script with the first
    sentence of its docstring."""
    from fedshield.bench.command import bench_names
    from fedshield.bench.scripts import BENCH_DIR, scripts

    monkeypatch.setenv("COLUMNS", "400")  # one line per row
    assert main(["bench", "--list"]) == 0
    out = capsys.readouterr().out
    assert "fedshield bench --bench NAME" in out and "python bench/NAME.py" in out
    for name in bench_names():
        assert f"│ {name} " in out, name
    found = {s.name: s.summary for s in scripts()}
    assert set(found) == {f.name for f in BENCH_DIR.glob("*.py")} and "bench_round.py" in found
    for name, summary in found.items():
        assert f"│ bench/{name} " in out and summary in out, name
    assert found["bench_pgd.py"] == (
        "PGD-10 throughput: fedshield.adversarial.pgd vs torchattacks.PGD (same model, same batch)."
    )
    assert main(["bench", "--list", "--bench", "tiny-cpu"]) == 2
    assert "--list lists the benches and runs nothing; drop --bench" in capsys.readouterr().err


@pytest.mark.slow
def test_the_readme_grid_bench_plans_every_feasible_run() -> None:
    """The bundled grid of the README table: 22 defenses × 18 attacks × 4 shares × 3 seeds,
    less Krum / Multi-Krum (2f + 2 < S) and Trimmed Mean (2f < S) where they cannot run."""
    spec, where = read_bench(name="robustness-digits-cpu")
    p = plan(spec, where)
    per_defense_share = len(spec.attacks) * len(spec.seeds)
    # infeasible at S = 10: krum, multikrum (and nnm+) from 40 %, trimmed_mean from 60 %
    infeasible = 4 * 3 + 2 * 2
    assert len(p.runs) == (22 * 4 - infeasible) * per_defense_share == 3888
    assert len(p.infeasible) == infeasible


def test_collect_bench_records_provenance(tmp_path: Path) -> None:
    from fedshield.results import collect

    out = tmp_path / "out"
    assert main(["bench", "--bench", "tiny-cpu", "--out", str(out), "-q",
                 "--only", "defense=median"]) == 0  # fmt: skip
    data = tmp_path / "data"
    files = collect.collect_bench(out, data)
    assert (data / "bench-tiny-cpu-worst.csv").exists() and files
    assert collect.check_provenance(data) == []
    header = (data / "bench-tiny-cpu-header.md").read_text()
    assert "attack mode per_round" in header and "faults / dropout: none" in header
    assert "commit" in header and "fedshield" in header
    (data / "bench-tiny-cpu-worst.csv").write_text("changed\n")
    assert any("changed since" in p for p in collect.check_provenance(data))


def test_axes_modes_and_overrides_reach_the_run_configs() -> None:
    spec = parse_spec(BASE | {
        "attack_modes": ["fixed", "per_round"],
        "heterogeneity": {"iid": ['data.partition="iid"'], "dir0.1": ["data.beta=0.1"]},
        "faults": {"none": [], "slow": ["server.clients_per_round=8"]},
    })  # fmt: skip
    p = plan(spec, Path("."))
    assert len(p.settings) == 2 * 2 * 2 and len(p.runs) == 8 * 2 * 2
    run = next(r for r in p.runs if r.setting.heterogeneity == "iid" and r.setting.fault == "slow"
               and r.setting.mode == "fixed" and r.defense == "nnm+trimmed_mean")  # fmt: skip
    assert run.raw["data"]["partition"] == "iid" and run.raw["attack"]["mode"] == "fixed"
    assert run.raw["server"]["clients_per_round"] == 8
    assert run.raw["server"]["aggregator_args"]["f"] == 1  # ⌊0.2 · 8⌋, from the fault's S


@pytest.mark.slow
def test_ray_backend_equals_local(tmp_path: Path, monkeypatch: Any) -> None:
    ray = pytest.importorskip("ray")
    monkeypatch.setenv("RAY_ACCEL_ENV_VAR_OVERRIDE_ON_ZERO", "0")  # CPU tasks: no GPU env
    local, remote = tmp_path / "local", tmp_path / "ray"
    args = ["bench", "--bench", "tiny-cpu", "-q", "--only", "defense=median"]
    assert main([*args, "--out", str(local)]) == 0
    ray.init(num_cpus=2, include_dashboard=False, logging_level="ERROR")
    try:
        assert main([*args, "--out", str(remote), "--backend", "ray"]) == 0
    finally:
        ray.shutdown()
    assert (local / "worst.md").read_text() == (remote / "worst.md").read_text()
    assert (local / "runs.csv").read_text().count("\n") == (remote / "runs.csv").read_text().count(
        "\n"
    )
