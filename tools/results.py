"""One command per results page, at the current commit (issue 27).

    python tools/results.py PAGE [--out DIR] [-j N]   # = make results PAGE=... OUT=...
    python tools/results.py --list                    # pages, jobs, their data's commits
    python tools/results.py --sample PAGE             # the page's sampled cell, re-run now

The pages and their jobs are declared once, in ``docs/results/pages.toml`` (see its header).
``PAGE`` runs the page's jobs from nothing into ``DIR`` (default ``runs/results``; the
repository's layout below it, so ``--out .`` publishes in place): sweeps and benches under
``DIR/runs/``, their CSVs collected with provenance under ``DIR/docs/results/data/``
(``tools/render_results.py``'s ``collect``), each grid's wall time appended to
``DIR/docs/results/data/campaign-times.csv``, the page's prose copied from the repository
and its tables rendered from ``DIR``'s data. Sweeps and benches resume (finished runs of the
same config and commit are kept), so a stopped command continues where it stopped.

A page names where its numbers come from in a generated header (block option ``page=NAME``
of render_results): each job, its seeds, the commit(s) its data was made at and the command.

``--sample`` re-runs the page's ``sample`` cell at the current commit (for a long run, its
first ``round`` rounds, compared with the published per-round curve there) and prints it
beside the published seeds' range; tests/test_results_pages.py asserts it lies inside,
widened by :func:`kernel_tolerance`. Exit 1 when it does not: the page is stale.
"""

from __future__ import annotations

import argparse
import csv
import functools
import json
import logging
import shlex
import shutil
import subprocess
import sys
import time
import tomllib
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
PAGES_REL = Path("docs") / "results" / "pages.toml"
PAGES = ROOT / PAGES_REL
DATA_REL = Path("docs") / "results" / "data"
TIMES = "campaign-times.csv"


@dataclass(frozen=True)
class Job:
    kind: str  # "grid" | "bench" | "command"
    name: str  # grid or bench name; the command line for commands
    seeds: str = ""
    sets: tuple[str, ...] = ()
    jobs: int = 1
    writes: tuple[str, ...] = ()  # a command's data files (under docs/results/data or beside)

    def argv(self, out: Path) -> list[str]:
        """The fedshield command line of a grid or bench job writing under ``out``."""
        runs = out / "runs"
        if self.kind == "grid":
            # a bundled grid by name, or a grid file (its runs and data named by its stem)
            grid = [self.name] if self.name.endswith(".toml") else ["--grid", self.name]
            cmd = ["sweep", *grid, "-q", "--out", str(runs / self.stem)]
            cmd += ["-j", str(self.jobs)] + (["--seeds", self.seeds] if self.seeds else [])
            for s in self.sets:
                cmd += ["--set", s]
            return cmd
        if self.kind == "bench":
            dest = runs / f"bench-{self.name}"
            return ["bench", "--bench", self.name, "-q", "-j", str(self.jobs), "--out", str(dest)]
        raise ValueError(self.kind)

    def records(self) -> list[str]:
        """The names of the provenance records this job writes (``<key>.provenance.json``)."""
        if self.kind == "grid":
            return [self.stem]
        if self.kind == "bench":
            return [f"bench-{self.name}"]
        return [Path(w).stem for w in self.writes if w.endswith(".csv")]

    @property
    def label(self) -> str:
        """What ``--only`` names: the grid or bench, or a command's script (its stem)."""
        if self.kind == "command":
            return Path(shlex.split(self.name)[1]).stem
        return self.stem if self.kind == "grid" else self.name

    def outputs(self) -> list[str]:
        """The data files this job writes under docs/results/data (with provenance)."""
        if self.kind == "grid":
            names = [f"{self.stem}{s}.csv" for s in ("", "-cells", "-curves", "-rounds")]
        elif self.kind == "bench":
            names = [f"bench-{self.name}-{f}" for f in _render_results().BENCH_FILES]
        else:
            names = list(self.writes)
        return names + [f"{k}.provenance.json" for k in self.records()]

    @property
    def stem(self) -> str:
        return Path(self.name).stem if self.name.endswith(".toml") else self.name

    def shown(self) -> str:
        """The job as a user would type it (for the page header)."""
        if self.kind == "command":
            line = self.name.replace("{py} -m fedshield.cli", "fedshield")
            return line.format(py="python", out="OUT", runs="OUT/runs")
        if self.kind == "grid":
            seeds = f" --seeds {self.seeds}" if self.seeds else ""
            sets = "".join(f" --set {s}" for s in self.sets)
            grid = self.name if self.name.endswith(".toml") else f"--grid {self.name}"
            return f"fedshield sweep {grid}{seeds}{sets}"
        return f"fedshield bench --bench {self.name}"


@dataclass(frozen=True)
class Page:
    name: str
    doc: str
    what: str
    jobs: list[Job]
    sample: dict[str, Any] = field(default_factory=dict)

    def data_names(self) -> list[str]:
        """The provenance sidecars this page's jobs write (a command's: of its data files)."""
        out = []
        for j in self.jobs:
            out += [f"{k}.provenance.json" for k in j.records()]
        return out


def load_pages(path: Path = PAGES) -> dict[str, Page]:
    """Every page of ``pages.toml``, checked: one line naming the page and key otherwise."""
    raw = tomllib.loads(path.read_text())
    pages = {}
    for name, spec in raw.items():
        unknown = set(spec) - {"doc", "what", "grid", "bench", "command", "sample"}
        if unknown or "doc" not in spec:
            raise SystemExit(f"{path.name}: [{name}] has keys {sorted(unknown)}; needs doc")
        jobs = [
            Job(
                "grid",
                g["name"],
                str(g.get("seeds", "")),
                tuple(g.get("set", ())),
                g.get("jobs", 1),
            )
            for g in spec.get("grid", [])
        ]
        jobs += [Job("bench", b["name"], jobs=b.get("jobs", 1)) for b in spec.get("bench", [])]
        jobs += [
            Job("command", c["run"], writes=tuple(c.get("writes", ())))
            for c in spec.get("command", [])
        ]
        pages[name] = Page(name, spec["doc"], spec.get("what", ""), jobs, spec.get("sample", {}))
    return pages


@functools.cache
def _render_results() -> Any:
    import importlib.util

    spec = importlib.util.spec_from_file_location(
        "render_results", ROOT / "tools" / "render_results.py"
    )
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _commit() -> str:
    """The checkout's commit (``source_commit`` returns a record, not the sha)."""
    from fedshield.provenance import source_commit

    return str(source_commit().get("commit") or "unknown")


# -- the page header ------------------------------------------------------------------------
def _short(commits: Any) -> list[str]:
    if isinstance(commits, str):
        commits = [commits]
    return [str(c)[:7] for c in commits or []]


def data_commits(page: Page, root: Path = ROOT) -> dict[str, list[str]]:
    """Per grid / bench job, the commits its published data was made at (its provenance)."""
    out: dict[str, list[str]] = {}
    for side in page.data_names():
        f = root / DATA_REL / side
        prov = json.loads(f.read_text()) if f.exists() else {}
        out[side.removesuffix(".provenance.json")] = _short(prov.get("commits"))
    return out


def render_header(name: str, root: Path = ROOT) -> str:
    """The ``page=NAME`` block: where the page's numbers come from and how to regenerate it
    (the pages of ``root``'s pages.toml when it has one)."""
    page = load_pages(root / PAGES_REL if (root / PAGES_REL).exists() else PAGES)[name]
    commits = data_commits(page, root)
    lines = [
        f"**Regenerate**: `make results PAGE={name}` (into `runs/results/`; `OUT=.` "
        f"publishes here). Its jobs, and the commit each one's data was made at:",
        "",
    ]
    for j in page.jobs:
        cs = list(
            dict.fromkeys(c for k in j.records() for c in commits.get(k) or ["not yet measured"])
        )
        at = " — its output records no commit" if j.writes and not j.records() else ""
        if cs:
            at = " — commit " + ", ".join(f"`{c}`" for c in cs)
            at += " (mixed: runs from several commits)" if len(cs) > 1 else ""
        lines.append(f"- `{j.shown()}`{at}")
    all_commits = {c for cs in commits.values() for c in cs}
    lines.append("")
    if len(all_commits) == 1:
        lines.append(f"All of this page's data was made at commit `{next(iter(all_commits))}`.")
    elif all_commits:
        lines.append(
            "The data comes from several commits (above); tests/test_results_pages.py "
            "re-runs a sampled cell at the current commit and fails if it left the "
            "published seeds' range."
        )
    return "\n".join(lines) + "\n"


# -- running a page -----------------------------------------------------------------------------
def _record_time(data: Path, job: Job, runs: int, wall: float) -> None:
    f = data / TIMES
    new = not f.exists()
    with f.open("a", newline="") as fh:
        w = csv.writer(fh)
        if new:
            w.writerow(["grid", "seeds", "runs", "wall_s", "date", "commit"])
        w.writerow(
            [job.name, job.seeds, runs, round(wall), time.strftime("%Y-%m-%d"), _commit()[:7]]
        )


def run_page(page: Page, out: Path, jobs: int | None = None, only: set[str] | None = None) -> Path:
    """Every job of ``page`` into ``out`` (with ``only``: the jobs of those labels; the
    others' published data is copied, with its provenance and so its commit); returns the
    rendered page's path."""
    rr = _render_results()
    out = out.resolve()
    data = out / DATA_REL
    data.mkdir(parents=True, exist_ok=True)
    (out / "runs").mkdir(exist_ok=True)
    doc = out / page.doc
    src = ROOT / page.doc
    if src.exists() and doc.resolve() != src.resolve():
        doc.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(src, doc)  # the prose; the tables are rendered below
    if not doc.exists():
        raise SystemExit(f"{page.doc}: no such page (in the repository or in {out})")
    fs = [sys.executable, "-m", "fedshield.cli"]
    unknown = (only or set()) - {j.label for j in page.jobs}
    if unknown:
        labels = ", ".join(j.label for j in page.jobs)
        raise SystemExit(f"--only {','.join(sorted(unknown))}: not a job of {page.name} ({labels})")
    for j in page.jobs:
        if only is not None and j.label not in only:
            if data.resolve() != (ROOT / DATA_REL).resolve():
                for f in j.outputs():
                    if (ROOT / DATA_REL / f).exists():
                        shutil.copyfile(ROOT / DATA_REL / f, data / f)
            continue
        t0 = time.perf_counter()
        print(f"== {page.name}: {j.shown()}", flush=True)
        if j.kind == "command":
            subs = {"py": sys.executable, "out": str(out), "runs": str(out / "runs")}
            argv = [a.format(**subs) for a in shlex.split(j.name)]
            subprocess.run(argv, cwd=ROOT, check=True)
            continue
        job = j if jobs is None else replace(j, jobs=jobs)
        subprocess.run([*fs, *job.argv(out)], cwd=ROOT, check=True)
        wall = time.perf_counter() - t0
        if j.kind == "grid":
            src = out / "runs" / j.stem
            rr.collect(src, data)
            n = sum(1 for _ in (src / "comparison.csv").open()) - 1
        else:
            src = out / "runs" / f"bench-{j.name}"
            rr.collect_bench(src, data)
            n = sum(1 for _ in (src / "runs.csv").open()) - 1
        _record_time(data, j, n, wall)
    missing: list[str] = []
    text = rr.render_document(doc.read_text(), missing, root=out)
    doc.write_text(text)
    if missing:
        raise SystemExit(f"{page.doc}: not rendered: {'; '.join(dict.fromkeys(missing))}")
    return doc


# -- the sampled cell -------------------------------------------------------------------------
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
    published: dict[str, float]  # seed → value
    same_seed: float | None
    tol: float

    @property
    def low(self) -> float:
        return min(self.published.values()) - self.tol

    @property
    def high(self) -> float:
        return max(self.published.values()) + self.tol

    @property
    def ok(self) -> bool:
        return self.value is not None and self.low <= self.value <= self.high

    def line(self) -> str:
        got = "diverged" if self.value is None else f"{self.value:.4f}"
        seeds = ", ".join(f"{s}: {v:.4f}" for s, v in sorted(self.published.items()))
        verdict = "ok" if self.ok else "STALE"
        return (
            f"{self.page}: {self.cell} {self.metric} = {got} now; published seeds {seeds} "
            f"(range ± {self.tol:.3f} kernel tolerance: [{self.low:.4f}, {self.high:.4f}]) "
            f"→ {verdict}"
        )


def _seed_of(label: str, sep: str) -> tuple[str, str]:
    base, _, seed = label.rpartition(sep)
    return base, seed


def _published_grid(page: Page, s: dict[str, Any], root: Path) -> dict[str, float]:
    """The published values of the sampled run's cell, per seed: the final metric from the
    grid's per-run CSV, or the curve at ``round``. A diverged seed counts as absent."""
    cell, _ = _seed_of(s["run"], "_seed=") if "_seed=" in s["run"] else (s["run"], "")
    if "round" in s:
        rows = csv.DictReader((root / DATA_REL / f"{s['grid']}-curves.csv").open())
        picked = [r for r in rows if int(r["round"]) == int(s["round"])]
    else:
        picked = list(csv.DictReader((root / DATA_REL / f"{s['grid']}.csv").open()))
    out = {}
    for r in picked:
        base, seed = _seed_of(r["label"], "_seed=") if "_seed=" in r["label"] else (r["label"], "")
        if base == cell and r.get("status", "ok") != "diverged" and r.get(s["metric"]):
            out[seed or "-"] = float(r[s["metric"]])
    return out


def _grid_run(page: Page, s: dict[str, Any]) -> dict[str, Any]:
    from fedshield.sweep import expand, read_grid

    job = next(j for j in page.jobs if j.kind == "grid" and j.name == s["grid"])
    spec, where = read_grid(grid=job.name)
    if job.sets:
        spec = {**spec, "set": [*spec.get("set", []), *job.sets]}
    seeds = [int(x) for x in job.seeds.split(",")] if job.seeds else None
    runs = {r.name: r.raw for r in expand(spec, where, seeds)[1]}
    if s["run"] not in runs:
        raise SystemExit(f"pages.toml: [{page.name}] sample run {s['run']!r} not in {job.name}")
    return runs[s["run"]]


def _train(raw: dict[str, Any], rounds: int | None, metric: str) -> float | None:
    """The run's ``metric`` after its last round, or after ``rounds`` of its own rounds (the
    config is untouched: the first rounds of the published run, not a shorter run)."""
    from fedshield import config, runner
    from fedshield.sim.builder import build
    from fedshield.sim.engine import Simulator

    cfg = config.validate(raw)
    if rounds is None:
        result = runner.run(cfg, None, quiet=True)
        if result.get("status") == "diverged":
            return None
        v = result[metric] if metric in result else result["final"].get(metric)
        return float(v)
    runner.set_threads(cfg)
    sim = Simulator(build(cfg), None)
    sim.start()
    rec: dict[str, Any] = {}
    for rnd in range(1, rounds + 1):
        t0 = time.perf_counter()
        rec = sim.run_round(rnd)
        sim.record(rec, time.perf_counter() - t0)
        if sim.diverged(rec):
            return None
    return float(rec[metric])


def _bench_run(s: dict[str, Any]) -> dict[str, Any]:
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
        raise SystemExit(f"pages.toml: sample run {s['run']!r} not in bench {s['bench']}")
    return runs[s["run"]].raw


def _published_bench(s: dict[str, Any], root: Path) -> dict[str, float]:
    cell, _ = _seed_of(s["run"], "__s")
    rows = csv.DictReader((root / DATA_REL / f"bench-{s['bench']}-runs.csv").open())
    out = {}
    for r in rows:
        base, seed = _seed_of(r["id"], "__s")
        if base == cell and r["status"] != "diverged" and r.get(s["metric"]):
            out[seed] = float(r[s["metric"]])
    return out


def sample(name: str, root: Path = ROOT) -> Sample:
    """Re-run ``name``'s sampled cell at the current commit, beside what the page published."""
    page = load_pages()[name]
    s = page.sample
    if not s:
        raise SystemExit(f"pages.toml: [{name}] has no sample")
    if "bench" in s:
        from fedshield.bench.runner import run_group

        res = run_group([_bench_run(s)], lockstep=False)[0]
        value = None if res.get("status") == "diverged" else float(res[s["metric"]])
        published = _published_bench(s, root)
        seed = _seed_of(s["run"], "__s")[1]
    else:
        raw = _grid_run(page, s)
        value = _train(raw, s.get("round"), s["metric"])
        published = _published_grid(page, s, root)
        seed = _seed_of(s["run"], "_seed=")[1] if "_seed=" in s["run"] else "-"
    if not published:
        raise SystemExit(f"{name}: no published value for the sampled cell {s['run']!r}")
    return Sample(
        name,
        s["run"] + (f" @ round {s['round']}" if "round" in s else ""),
        s["metric"],
        value,
        published,
        published.get(seed),
        kernel_tolerance(root),
    )


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("page", nargs="?", help="a page of docs/results/pages.toml")
    ap.add_argument("--out", default="runs/results", help="where (the repo's layout below it)")
    ap.add_argument("-j", "--jobs", type=int, default=None, help="parallel runs per job")
    ap.add_argument("--list", action="store_true", help="the pages, their jobs and commits")
    ap.add_argument("--sample", action="store_true", help="re-run the page's sampled cell")
    ap.add_argument("--only", default=None, help="these jobs only (comma-separated labels)")
    args = ap.parse_args()
    pages = load_pages()
    if args.list:
        for p in pages.values():
            commits = sorted({c for cs in data_commits(p).values() for c in cs})
            print(f"{p.name:18} {p.doc:36} {p.what}  [data at {', '.join(commits) or '-'}]")
            for j in p.jobs:
                print(f"    {j.shown()}")
        return 0
    if args.page not in pages:
        print(
            f"error: PAGE={args.page!r}: not a page of {PAGES.relative_to(ROOT)} "
            f"(pages: {', '.join(pages)})",
            file=sys.stderr,
        )
        return 2
    if args.sample:
        got = sample(args.page)
        print(got.line())
        return 0 if got.ok else 1
    only = set(args.only.split(",")) if args.only else None
    doc = run_page(pages[args.page], Path(args.out), args.jobs, only)
    print(f"rendered {doc}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
