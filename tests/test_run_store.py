"""The run store (docs/results-store.md): a record made before a change to a module its run
loaded is replayed valid or shown stale, never silently used; stores made apart merge by
file; a campaign's parts cover every missing run once."""

from __future__ import annotations

import copy
import gzip
import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from fedshield import config, runner
from fedshield.results import RUN_SIDE, campaign, store, validity
from fedshield.sweep import RunSpec, run_sweep


@pytest.fixture
def raw(small_cfg) -> dict[str, Any]:
    """A tiny real run: digits, mlp, 2 rounds, one thread."""
    return config.apply_overrides(small_cfg, ["rounds=2", "run.threads=1"])


@pytest.fixture
def made(tmp_path, raw) -> Path:
    """A store holding the record of one tiny real run."""
    runner.run(config.validate(raw), tmp_path / "run", quiet=True, store=tmp_path / "made")
    return tmp_path / "made"


def _one(s: Path) -> tuple[Path, dict[str, Any]]:
    [(f, rec)] = list(store.records(s))
    return f, rec


def _changed(monkeypatch, module: str) -> None:
    """As if ``module``'s source had been edited since the record was made."""
    real = store.current_hashes

    def now(names):
        return {m: ("0" * 64 if m == module else h) for m, h in real(names).items()}

    monkeypatch.setattr(validity, "current_hashes", now)


def test_a_record_names_the_code_that_made_it(made) -> None:
    f, rec = _one(made)
    assert f.name == store.record_name(rec) and f.name.startswith(rec["cell"][:16])
    assert {"fedshield.runner", "fedshield.sim.engine", "fedshield.aggregators.mean"} <= set(
        rec["modules"]
    )
    assert [r["round"] for r in rec["rounds"]] == [1, 2] and "test_acc" in rec["rounds"][0]
    assert rec["summary"]["final_test_acc"] == rec["rounds"][-1]["test_acc"]
    assert {"torch", "numpy"} <= set(rec["versions"]) and rec["kernels"]["threads"] == 1
    assert validity.status(f, rec).state == "valid"  # the code here made it


def test_changed_code_needs_a_replay_which_reproduces_and_stamps(made, tmp_path, monkeypatch):
    s = tmp_path / "store"
    shutil.copytree(made, s)
    f, rec = _one(s)
    _changed(monkeypatch, "fedshield.aggregators.mean")
    st = validity.status(f, rec)
    assert st.state == "unchecked" and not st.counts
    assert st.changed == ["fedshield.aggregators.mean"]
    st = validity.check(f, rec, rounds=2)  # the replay at this code gives the same rounds
    assert st.state == "replayed" and st.counts
    [stamp] = validity.stamps(f)
    assert stamp["ok"] and stamp["rounds"] == 2 and stamp["modules"]["fedshield.aggregators.mean"]
    # a stamp written before manifests (modules inline) is compacted under its text's name
    [sf] = list(s.glob("*.replay-*.json"))
    inline = {**json.loads(sf.read_text()), "modules": stamp["modules"]}
    old = sf.with_name(sf.name.replace(sf.stem[-8:], "00000000"))
    sf.rename(old)
    old.write_text(json.dumps(inline, indent=1, sort_keys=True) + "\n")
    assert validity.compact(s) == (0, 1) and validity.compact(s) == (0, 0)
    assert [p.name for p in s.glob("*.replay-*.json")] == [sf.name]
    assert sf.stat().st_size < 2000
    assert validity.stamps(f) == [stamp] and validity.status(f, rec).state == "replayed"
    # the stamp holds for this code only: another change needs another replay
    _changed(monkeypatch, "fedshield.sim.engine")
    assert validity.status(f, rec).state == "unchecked"


@pytest.mark.xdist_group("processes")  # it starts two worker processes
def test_replay_in_parallel_stamps_each_record(made, tmp_path) -> None:
    """``fedshield results replay -j 2``: spawned workers replay the unchecked records (here
    made "at other code": a module hash that is not this code's, in every process) and
    stamp each; one the replay contradicts is stale, and the command says so (exit 1)."""
    from fedshield.results.__main__ import main

    _, rec = _one(made)
    other = {**rec["modules"], "fedshield.aggregators.mean": "0" * 64}
    s = tmp_path / "store"
    good = store.write({**copy.deepcopy(rec), "modules": other}, s)
    bad = copy.deepcopy(rec) | {"modules": other}
    bad["rounds"][1]["test_acc"] += 0.2
    worse = store.write(bad, s)
    assert validity.status(good, store.read(good)).state == "unchecked"
    # as a user runs it: spawned workers must not need this process's __main__
    cmd = [sys.executable, "-m", "fedshield.results", "replay", str(s), "-j", "2"]
    assert subprocess.run(cmd, capture_output=True, timeout=300).returncode == 1
    assert validity.status(good, store.read(good)).state == "replayed"
    assert validity.status(worse, store.read(worse)).state == "stale"
    assert len(list(s.glob("*.replay-*.json"))) == 2
    assert main(["replay", str(s), "-j", "2"]) == 1  # nothing left to replay: the same verdicts


def test_a_record_its_replay_contradicts_is_stale_and_left_out(made, raw, tmp_path, monkeypatch):
    s = tmp_path / "store"
    _, rec = _one(made)
    bad = copy.deepcopy(rec)
    # 0.2 of accuracy at round 2: far outside the kernel tolerance (0.024)
    bad["rounds"][1]["test_acc"] += 0.2
    f = store.write(bad, s)
    _changed(monkeypatch, "fedshield.aggregators.mean")
    st = validity.check(f, bad, rounds=2)
    assert st.state == "stale" and "round 2 test_acc" in st.why
    assert validity.status(f, bad).state == "stale"  # the verdict is kept beside it
    # a sweep over its cell does not use it: the run is made again, the record is named
    out = tmp_path / "sweep"
    spec = RunSpec("t", raw, {})
    comparison = run_sweep([spec], out, stores=[s])
    assert comparison is not None
    summary = json.loads((out / "t" / "summary.json").read_text())
    assert campaign.FROM_STORE not in summary
    assert summary["final_test_acc"] == rec["summary"]["final_test_acc"]  # same kernels here
    prov = json.loads((out / "provenance.json").read_text())
    assert prov["store"]["left_out"]["t"][0].startswith("stale")
    assert len(store.files(s)) == 2  # the new run's record joined the stale one


def test_stores_made_apart_merge_by_file(made, tmp_path) -> None:
    _, rec = _one(made)
    a, b = tmp_path / "a", tmp_path / "b"
    fa, fb = store.write(rec, a), store.write(copy.deepcopy(rec), b)
    assert fa.name == fb.name and fa.read_bytes() == fb.read_bytes()  # same record, same file
    other = {**rec, "seed": 1}
    assert store.write(other, b).name != fa.name
    for f in store.files(b):
        if (a / f.name).exists():
            assert (a / f.name).read_bytes() == f.read_bytes()  # nothing to resolve
        shutil.copy(f, a)
    assert len(store.files(a)) == 2
    with gzip.open(fa, "rt") as fh:  # JSON lines: pandas reads a file in one line too
        assert json.loads(fh.readline())["cell"] == rec["cell"]


def test_module_hashes_live_once_per_code_in_a_manifest(made, tmp_path) -> None:
    """Two records of one code share one manifest; a record file holds only its reference
    and reads back whole; without its manifest it is refused by name; a store written
    before manifests is compacted in place under the same names."""
    f, rec = _one(made)
    other = store.write({**copy.deepcopy(rec), "seed": 1}, made)
    manifests = list((made / store.MANIFESTS).glob("*.json.gz"))
    assert len(manifests) == 1
    with gzip.open(f, "rt") as fh:
        assert set(json.loads(fh.readline())["modules"]) == {"@manifest"}
    assert store.read(other)["modules"] == rec["modules"]
    assert f.stat().st_size < 0.5 * len(json.dumps(rec).encode()) / 4  # not the 20 kB of hex
    lone = tmp_path / "lone"
    lone.mkdir()
    shutil.copy(f, lone)
    with pytest.raises(ValueError, match=f"{f.name}: its module manifest .* is missing"):
        store.read(lone / f.name)
    old = tmp_path / "old"  # a record as written before manifests: modules inline
    old.mkdir()
    (old / f.name).write_bytes(gzip.compress(json.dumps(rec, sort_keys=True).encode() + b"\n"))
    assert store.read(old / f.name) == rec
    assert store.compact(old) == 1 and store.compact(old) == 0
    assert store.read(old / f.name) == rec and (old / f.name).stat().st_size < 4000


def test_parts_make_every_missing_run_once_and_the_merged_store_completes_the_grid(tmp_path, raw):
    runs = [
        RunSpec(name, config.apply_overrides(raw, [f"client.lr={lr}", f"seed={s}",
                                                   f'name="{name}"']), {})
        for lr in (0.05, 0.1) for s in (0, 1) for name in [f"lr={lr}_seed={s}"]
    ]  # fmt: skip
    n = 2
    keys = [store.cell_key(config.dump(config.validate(r.raw))) for r in runs]
    parts = [campaign.part_of(k, n) for k in keys]
    assert set(parts) <= {1, 2}
    made: list[str] = []
    for k in range(1, n + 1):
        s = tmp_path / f"store{k}"
        got = run_sweep(runs, tmp_path / f"part{k}", stores=[s], part=(k, n))
        assert (got is None) == (parts.count(k) < len(runs))  # tables once all are in
        made += [rec["name"] for _, rec in store.records(s)]
    assert sorted(made) == sorted(r.name for r in runs)  # each run in exactly one part
    merged = tmp_path / "merged"
    for k in range(1, n + 1):
        shutil.copytree(tmp_path / f"store{k}", merged, dirs_exist_ok=True)
    out = tmp_path / "all"
    comparison = run_sweep(runs, out, stores=[merged])
    assert comparison is not None and len(comparison.summaries) == len(runs)
    assert all(campaign.FROM_STORE in s for s in comparison.summaries)  # none made again
    assert len(store.files(merged)) == len(runs)
    assert json.loads((out / "provenance.json").read_text())["store"]["valid"]


def test_part_is_k_of_n() -> None:
    assert campaign.parse_part("2/4") == (2, 4)
    for bad in ("0/4", "5/4", "1", "a/b"):
        with pytest.raises(ValueError, match="k/n"):
            campaign.parse_part(bad)


def test_a_record_hashes_no_page_module_so_page_code_never_invalidates_it(tmp_path, raw):
    """``fedshield run`` and ``fedshield sweep`` through the command line, each in its own
    process: their records name no module of the results pages (fedshield.results.make,
    render, ...), only the run side's (:data:`fedshield.results.RUN_SIDE`)."""
    import subprocess
    import sys

    import tomli_w

    src = Path(store.__file__).resolve().parents[2]
    pkg = sorted(p.stem for p in (src / "fedshield" / "results").glob("*.py"))
    pages = {f"fedshield.results.{m}" for m in pkg} - RUN_SIDE - {"fedshield.results.__init__"}
    assert {"fedshield.results.make", "fedshield.results.render"} <= pages
    cfg = tmp_path / "t.toml"
    cfg.write_text(tomli_w.dumps(config.apply_overrides(raw, ["rounds=1"])))
    grid = tmp_path / "g.toml"
    grid.write_text(f'name = "g"\nfile = "{cfg}"\n')
    for argv in (["run", str(cfg), "--out", str(tmp_path / "run")],
                 ["sweep", str(grid), "-j", "1", "--out", str(tmp_path / "sweep")]):  # fmt: skip
        s = tmp_path / f"store-{argv[0]}"
        cmd = [sys.executable, "-m", "fedshield", *argv, "-q", "--store", str(s)]
        subprocess.run(cmd, check=True, capture_output=True)
        _, rec = _one(s)
        ours = {m for m in rec["modules"] if m.startswith("fedshield.results")}
        assert "fedshield.results.store" in ours and not ours & pages, (argv[0], ours & pages)
