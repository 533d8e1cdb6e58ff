"""A results page's data files and their provenance (docs/results/index.md).

``fedshield results render --collect SWEEP_DIR`` (:func:`collect`) copies a sweep's
``comparison.csv`` (and ``cells.csv``, ``curves.csv``) under docs/results/data/ and writes
beside them ``<name>.provenance.json`` — the sweep's ``provenance.json`` (the commits its
runs ran from, each run's config hash and one hash over them, the command) plus the
SHA-256 of every file it covers; ``--collect-bench`` (:func:`collect_bench`) the same for a
``fedshield bench`` output. :func:`check_provenance` (``render --check`` and
tests/test_docs.py) refuses a result file without such a record or changed since it was
collected.

``collect`` also writes ``<sweep>-rounds.csv`` when the runs logged evaluator metrics in
more than the last round (``eval.metrics_every``): per cell and round, the mean, interval,
min and max over the seeds of the robust and per-group accuracies, for curves that show
when rankings cross (``pivot=round,variant value=robust/worst``); and ``<sweep>-budget.csv``,
the same metrics per run and round, so that ``paired=A,B by=round`` gives the paired
verdict at every budget and :mod:`fedshield.results.curves` draws them with a band over
the seeds.
"""

from __future__ import annotations

import csv
import hashlib
import json
import re
import shutil
from pathlib import Path

from fedshield.results.pages import BENCH_FILES, DATA_REL, ROOT, TIMES

DATA = ROOT / DATA_REL
PROVENANCE = ".provenance.json"


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def collect(sweep_dir: Path, data: Path = DATA) -> list[Path]:
    """Copy a sweep's comparison.csv (and cells.csv, curves.csv) to
    docs/results/data/<name>[-cells|-curves].csv with ``<name>.provenance.json``: the
    sweep's provenance.json and the files' SHA-256."""
    prov_file = sweep_dir / "provenance.json"
    if not prov_file.exists():
        raise SystemExit(
            f"{prov_file}: missing; re-run the sweep with this version of fedshield (it "
            f"records the commit and config hashes that produced the results)"
        )
    data.mkdir(parents=True, exist_ok=True)
    out = []
    for src, suffix in (("comparison.csv", ""), ("cells.csv", "-cells"), ("curves.csv", "-curves")):
        if (sweep_dir / src).exists():
            dst = data / f"{sweep_dir.name}{suffix}.csv"
            shutil.copyfile(sweep_dir / src, dst)
            out.append(dst)
    for suffix, (rows, cols) in (("-rounds", round_rows(sweep_dir)),
                                 ("-budget", budget_rows(sweep_dir))):  # fmt: skip
        if rows:
            dst = data / f"{sweep_dir.name}{suffix}.csv"
            with dst.open("w", newline="") as fh:
                w = csv.DictWriter(fh, fieldnames=cols, extrasaction="ignore")
                w.writeheader()
                w.writerows(rows)
            out.append(dst)
    prov = json.loads(prov_file.read_text())
    prov["files"] = {p.name: _sha256(p) for p in out}
    side = data / f"{sweep_dir.name}{PROVENANCE}"
    side.write_text(json.dumps(prov, indent=2, sort_keys=True) + "\n")
    return [*out, side]


def collect_bench(bench_dir: Path, data: Path = DATA) -> list[Path]:
    """Copy a ``fedshield bench`` output's tables to docs/results/data/bench-<name>-*.{csv,md}
    with ``bench-<name>.provenance.json``: the bench's provenance.json (commits, each run's
    config hash, the command, attack modes, faults) and the files' SHA-256."""
    prov_file = bench_dir / "provenance.json"
    if not prov_file.exists():
        raise SystemExit(f"{prov_file}: missing; is {bench_dir} a `fedshield bench` output?")
    prov = json.loads(prov_file.read_text())
    name = f"bench-{prov['bench']}"
    data.mkdir(parents=True, exist_ok=True)
    out = []
    for f in BENCH_FILES:
        if (bench_dir / f).exists():
            dst = data / f"{name}-{f}"
            shutil.copyfile(bench_dir / f, dst)
            out.append(dst)
    prov["files"] = {p.name: _sha256(p) for p in out}
    prov.setdefault("grid", name)  # what check_provenance matches a sidecar's runs against
    side = data / f"{name}{PROVENANCE}"
    side.write_text(json.dumps(prov, indent=2, sort_keys=True) + "\n")
    return [*out, side]


#: Data files that record their own origin row by row (a page's run appends each grid's
#: wall time with its commit, :mod:`fedshield.results.make`): no sidecar needed.
SELF_RECORDING = frozenset({TIMES})


def check_provenance(data: Path = DATA) -> list[str]:
    """What is wrong with the provenance of the result files in ``data``: a file no
    ``*.provenance.json`` covers, one changed since it was recorded (another SHA-256), a
    record without a commit or a config hash, a sweep's record whose ``grid`` is neither a
    bundled grid nor the file's own name (it used to name the last run to finish).
    Empty: every file records its origin."""
    from fedshield.sweep import grid_names

    grids = set(grid_names())
    problems = []
    covered: dict[str, str] = {}
    for side in sorted(data.glob(f"*{PROVENANCE}")):
        prov = json.loads(side.read_text())
        if not prov.get("commits") or not prov.get("config_sha256"):
            problems.append(f"{side.name}: no commit or config hash")
        stem = side.name.removesuffix(PROVENANCE)
        if prov.get("runs") and prov.get("grid") not in grids | {stem}:
            problems.append(
                f"{side.name}: grid {prov.get('grid')!r} is neither a bundled grid nor {stem!r}"
            )
        for name, digest in prov.get("files", {}).items():
            covered[name] = side.name
            f = data / name
            if not f.exists():
                problems.append(f"{side.name}: names {name}, which is not there")
            elif _sha256(f) != digest:
                problems.append(
                    f"{name}: changed since {side.name} recorded it; collect it again "
                    f"(fedshield results render --collect <sweep dir>)"
                )
    for f in sorted(data.iterdir()):
        skip = f.name.endswith(PROVENANCE) or f.name in SELF_RECORDING
        if not skip and f.name not in covered:
            problems.append(f"{f.name}: no *{PROVENANCE} records the commit and config")
    return problems


#: Per-round metrics kept in <sweep>-rounds.csv.
ROUND_KEYS = re.compile(
    r"^(robust/(natural|fgsm|pgd20|cw|aa|worst)|groups/minority/(natural|pgd20|worst))$"
)


def _run_records(sweep_dir: Path) -> tuple[list[str], list[tuple[dict[str, str], list[dict]]]]:
    """The parameter columns of a sweep's comparison.csv (seed included) and, per run whose
    metrics.jsonl is there, its row and its per-round records."""
    comp = sweep_dir / "comparison.csv"
    if not comp.exists():
        return [], []
    runs = list(csv.DictReader(comp.open()))
    fixed = ("label", "name", "rounds", "final_test_acc", "best_test_acc", "best_round",
             "rounds_to_target")  # fmt: skip
    keys = [k for k in (runs[0] if runs else {}) if k not in fixed and "/" not in k]
    out = []
    for run in runs:
        path = sweep_dir / run["label"] / "metrics.jsonl"
        if path.exists():
            lines = path.read_text().splitlines()
            out.append((run, [json.loads(line) for line in lines if line.strip()]))
    return keys, out


def budget_rows(sweep_dir: Path) -> tuple[list[dict[str, object]], list[str]]:
    """Per run and evaluated round (a verdict per budget, docs/results/fedcart.md): the run's
    parameters, its seed, the round, ``test_acc`` and every ``ROUND_KEYS`` metric logged that round
    — the rows ``paired=A,B by=round`` pairs by seed at each budget. Empty when no run logged
    an evaluator metric before its last round (a one-budget sweep)."""
    keys, runs = _run_records(sweep_dir)
    rows: list[dict[str, object]] = []
    metrics: set[str] = set()
    early = False
    for run, records in runs:
        last = max((r.get("round", 0) for r in records), default=0)
        for r in records:
            vals = {k: v for k, v in r.items() if ROUND_KEYS.match(k) and isinstance(v, float)}
            if not vals:
                continue
            early |= r["round"] < last
            metrics |= set(vals)
            acc = r.get("test_acc")
            rows.append({k: run[k] for k in keys} | {"round": r["round"], "test_acc": acc} | vals)
    if not early:
        return [], []
    return rows, [*keys, "round", "test_acc", *sorted(metrics)]


def round_rows(sweep_dir: Path) -> tuple[list[dict[str, object]], list[str]]:
    """Per cell (a comparison.csv row's parameters but the seed) and round: n_seeds and the
    mean, 95 % interval half-width, min and max over the seeds of every ``ROUND_KEYS``
    metric. Empty when no run logged such a metric before its last round."""
    import math

    from scipy.stats import t

    keys, runs = _run_records(sweep_dir)
    params = [k for k in keys if k != "seed"]
    series: dict[tuple[str, ...], dict[int, dict[str, list[float]]]] = {}
    early = False
    for run, records in runs:
        last = max((r.get("round", 0) for r in records), default=0)
        cell = series.setdefault(tuple(run[k] for k in params), {})
        for r in records:
            vals = {k: v for k, v in r.items() if ROUND_KEYS.match(k) and isinstance(v, float)}
            if not vals:
                continue
            early |= r["round"] < last
            slot = cell.setdefault(int(r["round"]), {})
            for k, v in vals.items():
                slot.setdefault(k, []).append(v)
    if not early:
        return [], []
    metrics = sorted({k for c in series.values() for s in c.values() for k in s})
    rows: list[dict[str, object]] = []
    for cell_key, by_round in series.items():
        for rnd in sorted(by_round):
            row: dict[str, object] = dict(zip(params, cell_key)) | {"round": rnd}
            for k, xs in by_round[rnd].items():
                n = len(xs)
                mean = sum(xs) / n
                sd = math.sqrt(sum((v - mean) ** 2 for v in xs) / (n - 1)) if n > 1 else 0.0
                half = float(t.ppf(0.975, n - 1)) * sd / math.sqrt(n) if n > 1 else float("nan")
                row |= {f"{k}_mean": mean, f"{k}_ci95": half, f"{k}_min": min(xs),
                        f"{k}_max": max(xs), f"{k}_n": n}  # fmt: skip
            row["n_seeds"] = max(len(v) for v in by_round[rnd].values())
            rows.append(row)
    stats = ("mean", "ci95", "min", "max", "n")
    cols = [*params, "round", "n_seeds", *[f"{m}_{x}" for m in metrics for x in stats]]
    return rows, cols
