"""A results page's sampled cell, re-run at the current commit (``fedshield results page
PAGE --sample``).

The page's ``sample`` (docs/results/pages.toml) names one run of one of its grid or bench
jobs and a metric; :func:`sample` re-runs it now (for a long run, its first ``round``
rounds, compared with the published per-round curve there) beside the published seeds'
range, widened by :func:`kernel_tolerance`. tests/test_results_pages.py asserts it lies
inside: outside, the page is stale.
"""

from __future__ import annotations

import csv
import logging
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fedshield.results.pages import DATA_REL, ROOT, BadInput, Page, PageFailed, load_pages


def kernel_tolerance(root: Path = ROOT) -> float:
    """Twice the spread of the demo's Median row across the CPU kernel variants
    (docs/results/data/demo-kernels.csv, tools/demo_kernels.py): what the same config at the
    same commit moved on other kernel paths (0.012 → 0.024; tests/test_results_fresh.py
    allows the same). Attacked FedAvg moved more (0.040): samples are cells of robust rules
    or clean runs, not of an undefended run under attack."""
    rows = {r["label"]: r for r in csv.DictReader((root / DATA_REL / "demo-kernels.csv").open())}
    return 2 * float(rows["median"]["final_test_acc_spread"])


@dataclass
class Sample:
    page: str
    cell: str
    metric: str
    value: float | None  # None: the run diverged
    published: dict[str, float]  # seed → value, the cell's seeds that did not diverge
    seed: str  # the sampled run's seed ("-": a grid without seeds)
    diverged: frozenset[str]  # the cell's published seeds that diverged
    tol: float

    @property
    def same_seed(self) -> float | None:
        return self.published.get(self.seed)

    @property
    def low(self) -> float:
        return min(self.published.values(), default=float("nan")) - self.tol

    @property
    def high(self) -> float:
        return max(self.published.values(), default=float("nan")) + self.tol

    @property
    def ok(self) -> bool:
        """The run did what the page says: diverged where its seed is published diverged,
        else a value within the published seeds' range widened by ``tol``."""
        if self.seed in self.diverged or self.value is None:
            return self.seed in self.diverged and self.value is None
        return self.low <= self.value <= self.high

    def line(self) -> str:
        got = "diverged" if self.value is None else f"{self.value:.4f}"
        seeds = ", ".join(f"{s}: {v:.4f}" for s, v in sorted(self.published.items()))
        if self.diverged:
            seeds += f"; diverged: seed {', '.join(sorted(self.diverged))}"
        verdict = "ok" if self.ok else "STALE"
        return (
            f"{self.page}: {self.cell} {self.metric} = {got} now; published seeds {seeds} "
            f"(range ± {self.tol:.3f} kernel tolerance: [{self.low:.4f}, {self.high:.4f}]) "
            f"→ {verdict}"
        )


def split_seed(label: str, sep: str) -> tuple[str, str]:
    """``(cell, seed)`` of a run's label ``<cell><sep><digits>`` (a sweep's ``_seed=``, a
    bench id's ``__s``); ``(label, "-")`` when it names no seed."""
    m = re.fullmatch(rf"(.*){re.escape(sep)}(\d+)", label)
    return (m.group(1), m.group(2)) if m else (label, "-")


def _read_csv(f: Path, metric: str, where: str) -> list[dict[str, str]]:
    """The rows of a published CSV that must have the column ``metric``."""
    if not f.exists():
        raise PageFailed(f"{DATA_REL / f.name}: missing; is the page measured?")
    with f.open(newline="") as fh:
        reader = csv.DictReader(fh)
        rows = list(reader)
    if metric not in (reader.fieldnames or []):
        raise BadInput(f"{where}.metric: {metric!r} is not a column of {f.name}")
    return rows


def _published_grid(page: Page, s: dict[str, Any], root: Path) -> tuple[dict[str, float], set[str]]:
    """The published values of the sampled run's cell, per seed: the final metric from the
    grid's per-run CSV, or the curve at ``round``; and the seeds whose run diverged (their
    numbers, final or per round, are not results)."""
    where = f"pages.toml [{page.name}].sample"
    stem = Path(s["grid"]).stem
    cell = split_seed(s["run"], "_seed=")[0]
    runs = _read_csv(
        root / DATA_REL / f"{stem}.csv", "label" if "round" in s else s["metric"], where
    )
    bad = {r["label"] for r in runs if r.get("status") == "diverged"}
    picked = runs
    if "round" in s:
        curves = _read_csv(root / DATA_REL / f"{stem}-curves.csv", s["metric"], where)
        picked = [r for r in curves if int(r["round"]) == int(s["round"])]
    values: dict[str, float] = {}
    for r in picked:
        base, seed = split_seed(r["label"], "_seed=")
        if base == cell and r["label"] not in bad and r.get(s["metric"]):
            values[seed] = float(r[s["metric"]])
    return values, {split_seed(b, "_seed=")[1] for b in bad if split_seed(b, "_seed=")[0] == cell}


def _grid_run(page: Page, s: dict[str, Any]) -> dict[str, Any]:
    from fedshield.sweep import expand, read_grid

    job = next(j for j in page.jobs if j.kind == "grid" and j.name == s["grid"])
    spec, where = read_grid(str(ROOT / job.name)) if job.is_file else read_grid(grid=job.name)
    if job.sets:
        spec = {**spec, "set": [*spec.get("set", []), *job.sets]}
    seeds = [int(x) for x in job.seeds.split(",")] if job.seeds else None
    runs = {r.name: r.raw for r in expand(spec, where, seeds)[1]}
    if s["run"] not in runs:
        raise BadInput(
            f"pages.toml [{page.name}].sample.run: {s['run']!r} is not a run of {job.name}"
        )
    return runs[s["run"]]


def _without_metrics(raw: dict[str, Any], rounds: int | None, where: str) -> dict[str, Any]:
    """``raw`` without its extra evaluators (``eval.metrics = []``: robust accuracy, routing),
    the costly part of a FedCART or early-exit sample. They read the model and change no
    training, and where they run no earlier than the compared round nothing they draw can
    reach it either; a config evaluating them earlier is refused."""
    from fedshield import config

    cfg = config.validate(raw)
    upto = rounds or cfg.rounds
    every = cfg.eval.metrics_every
    if cfg.eval.metrics and every and every < upto:
        raise BadInput(
            f"{where}.skip_metrics: the run evaluates eval.metrics every {every} rounds, "
            f"before the compared round {upto}"
        )
    return config.apply_overrides(raw, ["eval.metrics=[]"])


def _metric(got: dict[str, Any], metric: str, where: str) -> float:
    v = got.get(metric)
    if v is None and isinstance(got.get("final"), dict):
        v = got["final"].get(metric)
    if v is None:
        raise BadInput(f"{where}.metric: the run records no {metric!r}")
    return float(v)


def _train(raw: dict[str, Any], rounds: int | None, metric: str, where: str) -> float | None:
    """The run's ``metric`` after its last round, or after ``rounds`` of its own rounds (the
    config is untouched: the first rounds of the published run, not a shorter run); None
    when it diverged."""
    from fedshield import config, runner
    from fedshield.results.validity import replay_rounds

    cfg = config.validate(raw)
    if rounds is None:
        result = runner.run(cfg, None, quiet=True)
        return None if result.get("status") == "diverged" else _metric(result, metric, where)
    recs, diverged = replay_rounds(config.dump(cfg), rounds)
    return None if diverged else _metric(recs[-1], metric, f"{where} (round {rounds})")


def _bench_run(page: Page, s: dict[str, Any]) -> dict[str, Any]:
    from fedshield.bench.command import read_bench
    from fedshield.bench.plan import plan

    spec, where = read_bench(name=s["bench"])
    before = logging.root.manager.disable
    logging.disable(logging.WARNING)  # the plan states every run's Byzantine budget
    try:
        runs = {r.id: r for r in plan(spec, where).runs}
    finally:
        logging.disable(before)
    if s["run"] not in runs:
        raise BadInput(
            f"pages.toml [{page.name}].sample.run: {s['run']!r} is not a run of bench {s['bench']}"
        )
    return runs[s["run"]].raw


def _published_bench(
    page: Page, s: dict[str, Any], root: Path
) -> tuple[dict[str, float], set[str]]:
    """As :func:`_published_grid`, from the bench's runs.csv (ids ``<cell>__s<seed>``)."""
    f = root / DATA_REL / f"bench-{s['bench']}-runs.csv"
    cell = split_seed(s["run"], "__s")[0]
    values: dict[str, float] = {}
    bad: set[str] = set()
    for r in _read_csv(f, s["metric"], f"pages.toml [{page.name}].sample"):
        base, seed = split_seed(r["id"], "__s")
        if base != cell:
            continue
        if r.get("status") == "diverged":
            bad.add(seed)
        elif r.get(s["metric"]):
            values[seed] = float(r[s["metric"]])
    return values, bad


def sample(name: str, root: Path = ROOT) -> Sample:
    """Re-run ``name``'s sampled cell at the current commit, beside what the page published
    under ``root``."""
    pages = load_pages()
    if name not in pages:
        raise BadInput(f"PAGE={name!r}: not a page of pages.toml (pages: {', '.join(pages)})")
    page = pages[name]
    s = page.sample
    if not s:
        raise BadInput(f"pages.toml [{name}]: has no sample")
    where = f"pages.toml [{name}].sample"
    tol = kernel_tolerance(root)  # before training: fail fast
    if "bench" in s:
        from fedshield.bench.runner import run_group

        published, bad = _published_bench(page, s, root)  # before training: fail fast
        res = run_group([_bench_run(page, s)], lockstep=False)[0]
        value = None if res.get("status") == "diverged" else _metric(res, s["metric"], where)
        seed = split_seed(s["run"], "__s")[1]
    else:
        published, bad = _published_grid(page, s, root)
        raw = _grid_run(page, s)
        if s.get("skip_metrics"):
            raw = _without_metrics(raw, s.get("round"), where)
        value = _train(raw, s.get("round"), s["metric"], where)
        seed = split_seed(s["run"], "_seed=")[1]
    if not published and seed not in bad:
        raise PageFailed(f"{name}: no published value for the sampled cell {s['run']!r}")
    return Sample(
        name,
        s["run"] + (f" @ round {s['round']}" if "round" in s else ""),
        s["metric"],
        value,
        published,
        seed,
        frozenset(bad),
        tol,
    )
