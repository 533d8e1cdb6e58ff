"""Running a bench's runs: result files per run, resume, groups trained in lockstep, and
the local (``-j`` processes, one thread each) or Ray backend of ``fedshield sweep``.

Every run writes ``<out>/cells/<run id>.json``: the test accuracy at the last round, the
validation accuracy (on ``data.val_size`` samples carved from the train split, never
trained on), the backdoor ASR where the attack is a backdoor, the status (``diverged`` with
its round: no accuracy is reported for it), the wall time by phase and the provenance —
the commit (and whether the tree was dirty) and the SHA-256 of the fully resolved config.
A result file is reused only when both equal the current ones; a changed cell (another
config, another commit) runs again. Beside it, ``<out>/runs/<run id>/`` keeps the run's
resolved config (``config.toml``, whose SHA-256 is the record's) and its per-round
metrics (``metrics.csv``: one row per round — training loss, test accuracy and loss every
``eval.every`` rounds, the backdoor ASR, the server's counters), which the curves are
drawn from.

Runs that share data, model, client rule and seed (:func:`group_key`) train in lockstep
(:mod:`fedshield.bench.lockstep`); each group is one task of the backend.
"""

from __future__ import annotations

import csv
import json
import logging
import math
import statistics
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

from fedshield import config as cfgmod
from fedshield.bench.plan import Run

log = logging.getLogger("fedshield")

CELLS = "cells"
#: ``<out>/runs/<run id>/``: the run's resolved config and per-round metrics.
RUNS = "runs"
CONFIG = "config.toml"
METRICS = "metrics.csv"


def run_dir(out: Path, run_id: str) -> Path:
    return out / RUNS / run_id


def resolved(raw: dict[str, Any]) -> str:
    return cfgmod.dump(cfgmod.validate(raw))


def group_key(raw: dict[str, Any]) -> str:
    """Runs with equal keys can train in lockstep: same data, model, client, seed, rounds."""
    keys = ("data", "model", "client", "seed", "rounds", "plugins")
    return json.dumps({k: raw.get(k) for k in keys} | {"run": raw.get("run", {})}, sort_keys=True)


def provenance_now() -> dict[str, Any]:
    from fedshield.provenance import source_commit

    return source_commit()


def reusable(path: Path, config_sha: str, source: dict[str, Any]) -> dict[str, Any] | None:
    """The result in ``path`` (``<out>/cells/<id>.json``) when it was made by this config at
    this commit and its run folder is complete, else None."""
    folder = run_dir(path.parent.parent, path.stem)
    if not ((folder / CONFIG).is_file() and (folder / METRICS).is_file()):
        return None
    try:
        rec = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    same = rec.get("config_sha256") == config_sha and rec.get("commit") == source["commit"]
    return rec if same and rec.get("dirty") == source["dirty"] and source["commit"] else None


def _val_acc(sim: Any) -> float | None:
    from fedshield.core.flat import set_buffers, set_params
    from fedshield.eval import evaluate

    val = sim.exp.val
    if val is None:
        return None
    set_params(sim.model, sim.state.params)
    set_buffers(sim.model, sim.state.buffers)
    return float(evaluate(sim.model, val, sim.cfg.eval.batch_size, sim.device)["acc"])


#: Loaded datasets of this process by (dataset, root, download, params): runs of a bench
#: share them (``build`` carves and partitions copies, never the bundle itself).
_BUNDLES: dict[str, Any] = {}


def _bundle(cfg: Any) -> Any:
    from fedshield.data import load_dataset

    d = cfg.data
    key = json.dumps([d.dataset, d.root, d.download, d.params], sort_keys=True, default=str)
    if key not in _BUNDLES:
        _BUNDLES.clear()  # one dataset at a time: a bench has one, memory stays bounded
        _BUNDLES[key] = load_dataset(d.dataset, d.root, d.download, d.params)
    return _BUNDLES[key]


def step_stats(norms: Sequence[float]) -> dict[str, float | None]:
    """The largest one-round step ‖θ^{t+1} − θ^t‖ of a run and the median of its applied
    (non-zero) steps — rounds the rule skipped (too few rows) do not drag the clean scale
    to 0 — and how many rounds moved θ; None when no round ran or a step was not finite.
    The steps table divides an attacked run's largest step by its clean twin's median
    (:mod:`fedshield.bench.steps`)."""
    finite = [x for x in norms if math.isfinite(x)]
    moved = [x for x in finite if x > 0.0]
    if not norms or len(finite) != len(norms):
        return {"step_max": None, "step_median": None, "steps_applied": None}
    return {"step_max": max(finite), "step_median": statistics.median(moved) if moved else None,
            "steps_applied": len(moved)}  # fmt: skip


def run_group(raws: Sequence[dict[str, Any]], lockstep: bool = True) -> list[dict[str, Any]]:
    """Run configs ``raws`` (one group) in this process; per run its result fields (no
    provenance). With ``lockstep`` the runs' clients train as one computation where
    :func:`~fedshield.bench.lockstep.lockstep_ok` allows, else run by run."""
    import torch

    from fedshield.bench.lockstep import lockstep_ok, train_runs
    from fedshield.provenance import sha256_text
    from fedshield.sim.builder import build, build_components
    from fedshield.sim.engine import Simulator

    torch.set_num_threads(1)
    t0 = time.perf_counter()
    sims = []
    for raw in raws:
        cfg = cfgmod.validate(raw)
        sims.append(Simulator(build(cfg, build_components(cfg), _bundle(cfg))))
    n = len(sims)
    prof = [{"build_s": (time.perf_counter() - t0) / n, "train_s": 0.0, "server_s": 0.0,
             "eval_s": 0.0} for _ in sims]  # fmt: skip
    for sim in sims:
        sim.start()
    active = list(range(n))
    steps: list[list[float]] = [[] for _ in sims]  # ‖Δθ‖ per round (float64), the steps table
    batched = lockstep and n > 1
    rounds = sims[0].cfg.rounds
    for rnd in range(1, rounds + 1):
        if not active:
            break
        plans = {i: sims[i].begin_round(rnd) for i in active}
        t = time.perf_counter()
        group = [sims[i] for i in active]
        trainer = group[0]._batched_trainer(plans[active[0]]) if batched else None
        if trainer is not None and lockstep_ok(group, trainer):
            ups = dict(zip(active, train_runs(trainer, group, [plans[i] for i in active])))
            share = (time.perf_counter() - t) / len(active)
            for i in active:
                prof[i]["train_s"] += share
        else:
            ups = {}
            for i in active:
                t = time.perf_counter()
                ups[i] = sims[i].train_cohort(plans[i])
                prof[i]["train_s"] += time.perf_counter() - t
        for i in list(active):
            t = time.perf_counter()
            before = sims[i].state.params.detach().double().clone()
            m = sims[i].end_round(plans[i], ups[i])
            t1 = time.perf_counter()
            steps[i].append(float((sims[i].state.params.detach().double() - before).norm()))
            sims[i].record(m, t1 - t)
            prof[i]["server_s"] += t1 - t
            prof[i]["eval_s"] += time.perf_counter() - t1
            if sims[i].diverged(m):
                active.remove(i)
    out = []
    for i, sim in enumerate(sims):
        s = sim.finish(sum(prof[i].values()))
        t = time.perf_counter()
        ok = s.get("status") != "diverged"
        val = _val_acc(sim) if ok else None
        prof[i]["eval_s"] += time.perf_counter() - t
        out.append({
            "status": s.get("status"),
            "diverged_round": s.get("diverged_round"),
            "test_acc": s.get("final_test_acc") if ok else None,
            "val_acc": val,
            "backdoor_asr": s.get("final", {}).get("backdoor/asr") if ok else None,
            "rounds": s.get("rounds"),
            "config_sha256": sha256_text(sim.config_text),
            "wall_s": round(sum(prof[i].values()), 4),
            "profile": {k: round(v, 4) for k, v in prof[i].items()},
            "lockstep": batched,
            **step_stats(steps[i]),
            "config_text": sim.config_text,
            "history": [_scalars(m) for m in sim.records],
        })  # fmt: skip
    return out


def _scalars(record: dict[str, Any]) -> dict[str, float]:
    """A round's record without its nested tables (per-client lists): the metrics.csv row."""
    return {k: v for k, v in record.items()
            if isinstance(v, (int, float)) and not isinstance(v, bool)}  # fmt: skip


def write_run(folder: Path, config_text: str, history: Sequence[dict[str, float]]) -> None:
    """A run's folder: its resolved config and one metrics row per round (the columns are
    every key any round reported; a blank where a round did not, e.g. between evaluations)."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / CONFIG).write_text(config_text)
    keys = sorted({k for m in history for k in m} - {"round"})
    with (folder / METRICS).open("w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(["round", *keys])
        w.writerows([[m.get("round", ""), *(m.get(k, "") for k in keys)] for m in history])


def run_task(
    raw: dict[str, Any], out: str, threads: int, cap_threads: bool = False
) -> dict[str, Any]:
    """One backend task (a group): ``raw["runs"]`` = [{id, meta, raw}], results written to
    ``Path(out).parent`` (the cells folder) as each group finishes; the same signature as
    :func:`fedshield.sweep.run_one`, so the sweep backends run it."""
    # Each run's build-time statements would repeat per run; quiet them for this task only
    # (in-process with -j 1: the caller's logging comes back afterwards).
    before = logging.root.manager.disable
    logging.disable(logging.WARNING)
    entries = raw["runs"]
    try:
        results = run_group([e["raw"] for e in entries], raw.get("lockstep", True))
    finally:
        logging.disable(before)
    from fedshield.results.store import store_run

    source = provenance_now()
    cells = Path(out).parent
    recs = []
    for e, res in zip(entries, results):
        text, history = res.pop("config_text"), res.pop("history")
        write_run(run_dir(cells.parent, e["id"]), text, history)
        rec = {"id": e["id"], **e["meta"], **res, **source}
        store_run(text, history, rec, "fedshield bench")  # to $FEDSHIELD_STORE, when set
        (cells / f"{e['id']}.json").write_text(json.dumps(rec, indent=1, sort_keys=True) + "\n")
        recs.append(rec)
    return {"results": recs}


def _meta(run: Run) -> dict[str, Any]:
    s = run.setting
    return {"defense": run.defense, "attack": run.attack, "share": s.share,
            "heterogeneity": s.heterogeneity, "fault": s.fault, "mode": s.mode,
            "tune": run.tune, "seed": run.seed,
            "placement": run.placement_label}  # fmt: skip


def groups(runs: Sequence[Run], size: int) -> list[list[Run]]:
    """Runs grouped by :func:`group_key`, in chunks of at most ``size``."""
    by: dict[str, list[Run]] = {}
    for r in runs:
        by.setdefault(group_key(r.raw), []).append(r)
    return [rs[i : i + size] for rs in by.values() for i in range(0, len(rs), size)]


def execute(
    runs: Sequence[Run],
    out: Path,
    backend: Any,
    group_size: int = 24,
    lockstep: bool = True,
    on_done: Callable[[dict[str, Any]], None] | None = None,
    shas: dict[str, str] | None = None,
) -> dict[str, dict[str, Any]]:
    """Every run's result by id: reused from ``out/cells`` when it matches (config hash and
    commit), else run on ``backend`` (``map(tasks)`` of :mod:`fedshield.sweep`). ``shas``:
    the runs' config hashes when the caller has them (:func:`config_shas`)."""
    from fedshield.sweep import RunTask

    cells = out / CELLS
    cells.mkdir(parents=True, exist_ok=True)
    source = provenance_now()
    results: dict[str, dict[str, Any]] = {}
    todo = []
    shas = shas if shas is not None else config_shas(runs)
    for r in runs:
        rec = reusable(cells / f"{r.id}.json", shas[r.id], source)
        if rec is None:
            todo.append(r)
        else:
            results[r.id] = rec
            if on_done:
                on_done(rec)
    tasks = []
    for i, g in enumerate(groups(todo, group_size)):
        entries = [{"id": r.id, "meta": _meta(r), "raw": r.raw} for r in g]
        tasks.append(RunTask(f"group{i}", {"runs": entries, "lockstep": lockstep},
                             str(cells / f"group{i}")))  # fmt: skip
    for _, res in _map(backend, tasks):
        for rec in res["results"]:
            results[rec["id"]] = rec
            if on_done:
                on_done(rec)
    return results


def config_shas(runs: Sequence[Run]) -> dict[str, str]:
    """Each run's SHA-256 of its resolved config (what a result file must have been made by)."""
    from fedshield.provenance import sha256_text

    return {r.id: sha256_text(resolved(r.raw)) for r in runs}


def _map(backend: Any, tasks: Sequence[Any]) -> Iterator[tuple[str, dict[str, Any]]]:
    yield from backend.map(tasks)


__all__ = [
    "CELLS",
    "CONFIG",
    "METRICS",
    "RUNS",
    "config_shas",
    "execute",
    "group_key",
    "groups",
    "reusable",
    "run_dir",
    "run_group",
    "run_task",
    "write_run",
]
