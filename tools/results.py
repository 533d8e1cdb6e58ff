"""One command per results page, at the current commit.

    python tools/results.py PAGE [--out DIR] [-j N] [--only LABEL,...]
                                   # = make results PAGE=... OUT=... [JOBS=N] [ONLY=...]
    python tools/results.py --list                    # pages, [job labels], data's commits
    python tools/results.py --sample PAGE             # the page's sampled cell, re-run now

The pages and their jobs are declared once, in ``docs/results/pages.toml`` (see its header).
``PAGE`` runs the page's jobs from nothing into ``DIR`` (default ``runs/results``; the
repository's layout below it, so ``--out .`` publishes in place): sweeps and benches under
``DIR/runs/``, their CSVs collected with provenance under ``DIR/docs/results/data/``
(``tools/render_results.py``'s ``collect``), each grid's wall time appended to
``DIR/docs/results/data/campaign-times.csv``, the page's prose copied from the repository
and its tables rendered from ``DIR``'s data. A stopped command continues where it stopped:
benches keep their finished runs of the same config and commit, sweeps those of the same
config — so a grid's folder holding runs of another commit is refused before any work (a
page is made at one commit: remove the folder or choose another ``--out``).

``--only`` runs the jobs of those labels (``--list`` shows them: a grid's or bench's name, a
command's script, ``fedshield-run`` for ``{py} -m fedshield.cli run``); the other jobs' data,
and any file the page reads that none of its jobs makes (the README quotes every page), is
the published one, copied with its provenance record. Bad input (pages.toml, the command
line) is one ``error:`` line naming the key or value, exit 2, before anything is made; a
failed job, a job's missing output or a block that cannot be rendered: ``error:``, exit 1.

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
import json
import logging
import re
import shlex
import shutil
import subprocess
import sys
import time
import tomllib
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
PAGES_REL = Path("docs") / "results" / "pages.toml"
PAGES = ROOT / PAGES_REL
DATA_REL = Path("docs") / "results" / "data"
TIMES = "campaign-times.csv"


class BadInput(SystemExit):
    """Bad input (pages.toml, the command line, a ``page=`` block): one line naming the key
    or value, raised before any job runs; :func:`main` prints it as ``error: …``, exit 2."""


class PageFailed(SystemExit):
    """A job failed, or the page's data is missing after its jobs ran: ``error: …``, exit 1."""


#: Where a command's ``writes`` names may lie (first match): its data, or the page folder.
WRITE_DIRS = (DATA_REL, DATA_REL.parent)
#: What a command line may substitute (``{{`` and ``}}``: literal braces).
PLACEHOLDERS = ("py", "out", "runs")


@dataclass(frozen=True)
class Job:
    kind: str  # "grid" | "bench" | "command"
    name: str  # grid or bench name (or a grid file, ``*.toml``); the command line for commands
    seeds: str = ""
    sets: tuple[str, ...] = ()
    jobs: int = 1
    writes: tuple[str, ...] = ()  # a command's files, by name (see WRITE_DIRS)

    def argv(self, out: Path, stores: Sequence[Path] = (), part: str | None = None) -> list[str]:
        """The fedshield command line of a grid or bench job writing under ``out``; a grid
        reads and writes the run ``stores`` (the first gets its records) and makes only
        ``part`` (``k/n``) of its missing runs."""
        runs = out / "runs"
        if self.kind == "grid":
            # a bundled grid by name, or a grid file (its runs and data named by its stem)
            grid = [self.name] if self.is_file else ["--grid", self.name]
            cmd = ["sweep", *grid, "-q", "--out", str(runs / self.stem)]
            cmd += ["-j", str(self.jobs)] + (["--seeds", self.seeds] if self.seeds else [])
            for s in self.sets:
                cmd += ["--set", s]
            for st in stores:
                cmd += ["--store", str(st)]
            return cmd + (["--part", part] if part else [])
        if self.kind == "bench":
            dest = runs / f"bench-{self.name}"
            return ["bench", "--bench", self.name, "-q", "-j", str(self.jobs), "--out", str(dest)]
        raise ValueError(self.kind)

    def command(self, out: Path) -> list[str]:
        """A command job's argv, its placeholders (:data:`PLACEHOLDERS`) filled in per
        argument (after splitting: a path with spaces stays one argument)."""
        subs = {"py": sys.executable, "out": str(out), "runs": str(out / "runs")}
        return [a.format(**subs) for a in shlex.split(self.name)]

    def records(self) -> list[str]:
        """The names of the provenance records this job writes (``<key>.provenance.json``)."""
        if self.kind == "grid":
            return [self.stem]
        if self.kind == "bench":
            return [f"bench-{self.name}"]
        # data files (tables) come with their own sidecar; a command's other outputs
        # (reports, JSON studies) get one from run_page: the commit it ran them at
        return [Path(w).stem for w in self.writes]

    def stamped(self) -> list[str]:
        """The outputs whose provenance record :func:`run_page` writes (not tables)."""
        return [w for w in self.writes if not w.endswith((".csv", ".md"))]

    @property
    def is_file(self) -> bool:
        """A grid file (a path, relative to the repository) rather than a bundled grid
        (benches are bundled ones only: ``fedshield bench --bench NAME``)."""
        return self.kind == "grid" and self.name.endswith(".toml")

    @property
    def label(self) -> str:
        """What ``--only`` names: the grid (file's stem) or bench; a command's script stem,
        or ``<package>-<subcommand>`` for ``-m package.module subcommand`` (``fedshield-run``).
        Several commands may share a label: ``--only`` runs them all."""
        if self.kind != "command":
            return self.stem if self.kind == "grid" else self.name
        argv = shlex.split(self.name)
        if len(argv) > 2 and argv[1] == "-m":
            sub = argv[3] if len(argv) > 3 and not argv[3].startswith("-") else ""
            return "-".join(x for x in (argv[2].split(".")[0], sub) if x)
        return Path(argv[1]).stem if len(argv) > 1 else argv[0]

    def outputs(self) -> list[str]:
        """The files this job may write, by name: a grid's and a bench's under
        docs/results/data (with provenance), a command's ``writes``."""
        if self.kind == "grid":
            names = [f"{self.stem}{s}.csv" for s in ("", "-cells", "-curves", "-rounds", "-budget")]
        elif self.kind == "bench":
            names = [f"bench-{self.name}-{f}" for f in _render_results().BENCH_FILES]
        else:
            names = list(self.writes)
        return names + [f"{k}.provenance.json" for k in self.records()]

    def required(self) -> list[str]:
        """The outputs that must exist once the job ran (the others depend on the grid:
        cells need seeds, rounds need per-round metrics)."""
        if self.kind == "grid":
            names = [f"{self.stem}.csv"]
        elif self.kind == "bench":
            names = [f"bench-{self.name}-runs.csv"]
        else:
            names = list(self.writes)
        return names + [f"{k}.provenance.json" for k in self.records()]

    @property
    def stem(self) -> str:
        return Path(self.name).stem if self.is_file else self.name

    def shown(self) -> str:
        """The job as a user would type it (for the page header)."""
        if self.kind == "command":
            line = self.name.replace("{py} -m fedshield.cli", "fedshield")
            return line.format(py="python", out="OUT", runs="OUT/runs")
        if self.kind == "grid":
            seeds = f" --seeds {self.seeds}" if self.seeds else ""
            sets = "".join(f" --set {s}" for s in self.sets)
            grid = self.name if self.is_file else f"--grid {self.name}"
            return f"fedshield sweep {grid}{seeds}{sets}"
        return f"fedshield bench --bench {self.name}"


def locate(root: Path, name: str) -> Path | None:
    """Where the output file ``name`` lies under ``root`` (:data:`WRITE_DIRS`), or None."""
    return next((root / d / name for d in WRITE_DIRS if (root / d / name).exists()), None)


@dataclass(frozen=True)
class Page:
    name: str
    doc: str
    what: str
    jobs: list[Job]
    sample: dict[str, Any] = field(default_factory=dict)

    def data_names(self) -> list[str]:
        """The provenance sidecars this page's jobs write (a command's: of its data files)."""
        return [f"{k}.provenance.json" for j in self.jobs for k in j.records()]


#: Each table of pages.toml: its keys, and those it must have.
KEYS: dict[str, tuple[frozenset[str], frozenset[str]]] = {
    "page": (frozenset({"doc", "what", "grid", "bench", "command", "sample"}), frozenset({"doc"})),
    "grid": (frozenset({"name", "seeds", "set", "jobs"}), frozenset({"name"})),
    "bench": (frozenset({"name", "jobs"}), frozenset({"name"})),
    "command": (frozenset({"run", "writes"}), frozenset({"run"})),
    "sample": (
        frozenset({"grid", "bench", "run", "metric", "round", "skip_metrics"}),
        frozenset({"run", "metric"}),
    ),
}


def _table(where: str, value: Any, kind: str) -> dict[str, Any]:
    """``value`` checked as a ``kind`` table of pages.toml (:data:`KEYS`)."""
    if not isinstance(value, dict):
        raise BadInput(f"{where}: expected a table, got {value!r}")
    allowed, needed = KEYS[kind]
    for key in value:
        if key not in allowed:
            raise BadInput(f"{where}: unknown key {key!r} (allowed: {', '.join(sorted(allowed))})")
    for key in sorted(needed - set(value)):
        raise BadInput(f"{where}: missing key {key!r}")
    return value


def _typed(where: str, value: Any, kind: type, what: str) -> Any:
    ok = isinstance(value, kind) and (kind is bool or not isinstance(value, bool))
    if ok and kind is list:
        ok = all(isinstance(v, str) for v in value)
    if ok and kind is int:
        ok = value >= 1
    if ok and kind is str:
        ok = bool(value.strip())
    if not ok:
        raise BadInput(f"{where}: expected {what}, got {value!r}")
    return value


def _tables(where: str, spec: dict[str, Any], key: str) -> list[tuple[str, dict[str, Any]]]:
    entries = spec.get(key, [])
    if not isinstance(entries, list):
        raise BadInput(f"{where}.{key}: expected a list of tables, got {entries!r}")
    return [(f"{where}.{key}[{i}]", _table(f"{where}.{key}[{i}]", e, key))
            for i, e in enumerate(entries)]  # fmt: skip


def _job(where: str, kind: str, t: dict[str, Any]) -> Job:
    jobs = _typed(f"{where}.jobs", t.get("jobs", 1), int, "a positive integer")
    if kind == "command":
        run = _typed(f"{where}.run", t["run"], str, "a command line")
        writes = _typed(f"{where}.writes", t.get("writes", []), list, "a list of file names")
        try:
            argv = shlex.split(run)
            for a in argv:
                a.format(**dict.fromkeys(PLACEHOLDERS, ""))
        except (ValueError, KeyError, IndexError) as err:
            raise BadInput(
                f"{where}.run: {err!s} in {run!r} (placeholders: "
                f"{', '.join('{' + p + '}' for p in PLACEHOLDERS)}; {{{{ }}}} for a literal brace)"
            ) from None
        return Job("command", run, writes=tuple(writes))
    name = _typed(f"{where}.name", t["name"], str, "a grid or bench name")
    if kind == "bench":
        return Job("bench", name, jobs=jobs)
    seeds = t.get("seeds", "")
    if not (isinstance(seeds, str) and (seeds == "" or re.fullmatch(r"\d+(,\d+)*", seeds))):
        raise BadInput(f'{where}.seeds: expected seeds as text, e.g. "0,1,2", got {seeds!r}')
    sets = _typed(f"{where}.set", t.get("set", []), list, "a list of 'key=value' strings")
    return Job("grid", name, seeds, tuple(sets), jobs)


def load_pages(path: Path = PAGES) -> dict[str, Page]:
    """Every page of ``pages.toml``, checked: a bad key or value raises :class:`BadInput`
    naming it (``[page].grid[i].key``)."""
    try:
        raw = tomllib.loads(path.read_text())
    except tomllib.TOMLDecodeError as err:
        raise BadInput(f"{path.name}: {err}") from None
    pages = {}
    for name, spec in raw.items():
        where = f"{path.name} [{name}]"
        _table(where, spec, "page")
        jobs = [_job(w, kind, t) for kind in ("grid", "bench", "command")
                for w, t in _tables(where, spec, kind)]  # fmt: skip
        doc = _typed(f"{where}.doc", spec["doc"], str, "a path in the repository")
        what = spec.get("what", "")
        if not isinstance(what, str):
            raise BadInput(f"{where}.what: expected a line of text, got {what!r}")
        sample: dict[str, Any] = {}
        if "sample" in spec:
            sample = _table(f"{where}.sample", spec["sample"], "sample")
            _check_sample(f"{where}.sample", sample, jobs)
        pages[name] = Page(name, doc, what, jobs, sample)
    return pages


def _check_sample(where: str, s: dict[str, Any], jobs: list[Job]) -> None:
    """A sample names one grid or bench job of its page, a run, a metric (and a round)."""
    kinds = [k for k in ("grid", "bench") if k in s]
    if len(kinds) != 1:
        raise BadInput(f"{where}: give one of 'grid' or 'bench' (the job whose run it re-runs)")
    kind = kinds[0]
    names = [j.name for j in jobs if j.kind == kind]
    if s[kind] not in names:
        raise BadInput(f"{where}.{kind}: {s[kind]!r} is not a {kind} job of the page ({names})")
    if kind == "bench" and "round" in s:
        raise BadInput(f"{where}.round: a bench sample compares the final value only")
    for key in ("run", "metric"):
        _typed(f"{where}.{key}", s[key], str, "a non-empty string")
    if "skip_metrics" in s:
        _typed(f"{where}.skip_metrics", s["skip_metrics"], bool, "true or false")
        if kind == "bench":
            raise BadInput(f"{where}.skip_metrics: applies to a grid sample only")
    if "round" in s:
        _typed(f"{where}.round", s["round"], int, "a positive integer")


def _render_results() -> Any:
    """tools/render_results.py, the sibling module (one copy: render_results loads this
    module the same way, by name in ``sys.modules``)."""
    if "render_results" in sys.modules:
        return sys.modules["render_results"]
    import importlib.util

    spec = importlib.util.spec_from_file_location(
        "render_results", Path(__file__).with_name("render_results.py")
    )
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules["render_results"] = mod
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


def store_lines(page: Page, root: Path = ROOT) -> tuple[dict[str, str], list[str]]:
    """Per grid job, what of its runs came from the run store (its provenance's ``store``:
    records valid at the code that made the page, replayed valid there); and the stored
    records that were left out (stale, or not replayed), named."""
    per_job: dict[str, str] = {}
    left: list[str] = []
    for side in page.data_names():
        f = root / DATA_REL / side
        used = (json.loads(f.read_text()) if f.exists() else {}).get("store")
        if not used:
            continue
        valid, replayed = len(used.get("valid", [])), len(used.get("replayed", []))
        if valid or replayed:
            per_job[side.removesuffix(".provenance.json")] = (
                f" — {valid + replayed} runs from the run store"
                + (f", {replayed} of them replayed valid at the page's code" if replayed else "")
            )
        left += [line for lines in used.get("left_out", {}).values() for line in lines]
    return per_job, left


def render_header(name: str, root: Path = ROOT) -> str:
    """The ``page=NAME`` block: where the page's numbers come from and how to regenerate it
    (the pages of ``root``'s pages.toml when it has one). A job whose data has no record is
    "not yet measured", and then the page claims no single commit."""
    pages = load_pages(root / PAGES_REL if (root / PAGES_REL).exists() else PAGES)
    if name not in pages:
        raise BadInput(f"page={name}: not a page of pages.toml (pages: {', '.join(pages)})")
    page = pages[name]
    commits = data_commits(page, root)
    from_store, left_out = store_lines(page, root)
    lines = [
        f"**Regenerate**: `make results PAGE={name}` (into `runs/results/`; `OUT=.` "
        f"publishes here). Its jobs, and the commit each one's data was made at:",
        "",
    ]
    for j in page.jobs:
        cs = list(dict.fromkeys(c for k in j.records() for c in commits.get(k, [])))
        # Outputs published before run_page recorded their commit: said as such.
        unstamped = {Path(w).stem for w in j.stamped() if not commits.get(Path(w).stem)}
        at = " — its output records no commit" if unstamped else ""
        if cs:
            at = " — commit " + ", ".join(f"`{c}`" for c in cs)
            at += " (mixed: runs from several commits)" if len(cs) > 1 else ""
        if any(not commits.get(k) for k in j.records() if k not in unstamped):
            at += " — not yet measured"
        at += "".join(from_store.get(k, "") for k in j.records())
        lines.append(f"- `{j.shown()}`{at}")
    if left_out:
        lines += ["", f"Left out of every number ({len(left_out)} stored runs that do not "
                  "count at the page's code; docs/results-store.md):", "",
                  *(f"- `{x}`" for x in left_out)]  # fmt: skip
    all_commits = {c for cs in commits.values() for c in cs}
    stamped = {Path(w).stem for j in page.jobs for w in j.stamped()}
    unmeasured = [k for k, cs in commits.items() if not cs and k not in stamped]
    lines.append("")
    if unmeasured:
        lines.append(f"Not yet measured: {', '.join(unmeasured)}; this page is incomplete.")
    elif len(all_commits) == 1:
        lines.append(f"All of this page's data was made at commit `{next(iter(all_commits))}`.")
    elif all_commits:
        lines.append(
            "The data comes from several commits (above); tests/test_results_pages.py "
            "re-runs a sampled cell at the current commit and fails if it left the "
            "published seeds' range."
        )
    return "\n".join(lines) + "\n"


# -- running a page -----------------------------------------------------------------------------
def _stamp(job: Job, data: Path) -> None:
    """The provenance record of a command's non-table outputs (:meth:`Job.stamped`): the
    commit the job just ran at, and the command line's hash as its configuration."""
    from fedshield.provenance import sha256_text, source_commit

    src = source_commit()
    for name in job.stamped():
        prov = {
            "commits": [src.get("commit") or "unknown"],
            "dirty": src.get("dirty"),
            "config_sha256": sha256_text(job.name),
            "output": name,
            "made_by": "tools/results.py, after the command ran",
        }
        side = data / f"{Path(name).stem}.provenance.json"
        side.write_text(json.dumps(prov, indent=2, sort_keys=True) + "\n")


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


def _count_rows(f: Path) -> int:
    with f.open(newline="") as fh:
        return sum(1 for _ in csv.DictReader(fh))


def _reads(text: str) -> list[str]:
    """The files (repository paths) a document's blocks read."""
    rr = _render_results()
    out: list[str] = []
    for m in rr.BLOCK.finditer(text):
        opts = rr.parse_opts(m.group("opts"))
        out += [*opts.get("source", "").split(","), opts.get("text", ""), opts.get("include", "")]
    return [f for f in dict.fromkeys(out) if f]


def _copy_published(names: list[str], out: Path) -> list[str]:
    """Copy the repository's published files ``names`` (repository paths) into ``out`` where
    ``out`` has none yet; a data file comes with its provenance record and every file that
    record covers (so ``out``'s data checks as the repository's does). The names copied."""
    data = ROOT / DATA_REL
    records = {
        f: side
        for side in sorted(data.glob("*.provenance.json"))
        for f in json.loads(side.read_text()).get("files", {})
    }
    wanted = [ROOT / n for n in names]
    for src in list(wanted):
        side = records.get(src.name) if src.parent == data else None
        if side is not None:
            wanted += [side, *(data / f for f in json.loads(side.read_text())["files"])]
    copied = []
    for src in dict.fromkeys(wanted):
        dst = out / src.relative_to(ROOT)
        if src.exists() and not dst.exists():
            dst.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(src, dst)
            copied.append(str(src.relative_to(ROOT)))
    return copied


def _run(argv: list[str], what: str, store: Path | None = None) -> None:
    """Run a job's command; its runs write their records to ``store`` (``$FEDSHIELD_STORE``)."""
    import os

    env = {**os.environ, "FEDSHIELD_STORE": str(store)} if store is not None else None
    rc = subprocess.run(argv, cwd=ROOT, check=False, env=env).returncode
    if rc != 0:
        raise PageFailed(f"`{what}` failed (exit {rc}); its output above says why")


def _check_names(page: Page) -> None:
    """Every grid and bench the page runs exists (a typo fails now, not after the jobs
    before it have run for hours)."""
    from fedshield.bench.command import bench_names
    from fedshield.sweep import grid_names

    known = {"grid": ("grids", grid_names()), "bench": ("benches", bench_names())}
    for j in page.jobs:
        if j.kind == "command":
            continue
        if j.is_file and not (ROOT / j.name).exists():
            raise BadInput(f"pages.toml [{page.name}].grid: {j.name!r}: no such grid file")
        kinds, names = known[j.kind]
        if not j.is_file and j.name not in names:
            raise BadInput(
                f"pages.toml [{page.name}].{j.kind}: {j.name!r}: not a bundled {j.kind} "
                f"(see `fedshield list {kinds}`)"
            )


def _older_runs(page: Page, out: Path, only: set[str] | None) -> None:
    """Refuse a grid job whose run folder in ``out`` holds runs of another commit: the sweep
    would keep them (it resumes by config, not by commit) and the page mix two commits."""
    from fedshield.results.campaign import FROM_STORE

    now = _commit()
    if now == "unknown":
        return
    for j in page.jobs:
        if j.kind != "grid" or (only is not None and j.label not in only):
            continue
        folder = out / "runs" / j.stem
        for f in sorted(folder.glob("*/summary.json")):
            summary = json.loads(f.read_text())
            if FROM_STORE in summary:  # a stored record that counts here (looked up again)
                continue
            made = (summary.get("provenance") or {}).get("commit") or "unknown"
            if made != now:
                raise BadInput(
                    f"{folder}: holds runs made at commit {made[:7]} (this is {now[:7]}), e.g. "
                    f"{f.parent.name}; a page is made at one commit: remove the folder or "
                    f"choose another --out"
                )


def _stores(out: Path, store: Path | None) -> list[Path]:
    """The run stores of a page made in ``out``: the one its runs write to (``store``,
    default ``out``'s docs/results/store), then the repository's, read too."""
    from fedshield.results.store import REPO_STORE

    first = (store or out / REPO_STORE).resolve()
    return list(dict.fromkeys([first, (ROOT / REPO_STORE).resolve()]))


def _run_part(
    page: Page, out: Path, stores: list[Path], part: str, jobs: int | None, only: set[str] | None
) -> None:
    """Part ``k/n`` of the page's grid jobs' missing runs (see :func:`run_page`); the
    sweeps print each run made with the time left."""
    from fedshield.results.campaign import parse_part

    try:
        parse_part(part)
    except ValueError as err:  # ConfigError: a ValueError
        raise BadInput(str(err)) from None
    grids = [j for j in page.jobs if j.kind == "grid" and (only is None or j.label in only)]
    skipped = [j.label for j in page.jobs if j.kind != "grid"]
    if skipped:
        print(f"   part {part}: not run here (made with the page): {', '.join(skipped)}")
    for i, j in enumerate(grids, 1):
        t0 = time.perf_counter()
        print(f"== {page.name} part {part}, job {i}/{len(grids)}: {j.shown()}", flush=True)
        job = j if jobs is None else replace(j, jobs=jobs)
        argv = job.argv(out, stores, part)
        _run([sys.executable, "-m", "fedshield.cli", *argv], j.shown(), stores[0])
        print(f"   {time.perf_counter() - t0:.0f} s", flush=True)
    print(f"part {part} of {page.name}: records in {stores[0]}; merge the parts' stores "
          f"(copy the files) and run `make results PAGE={page.name}`")  # fmt: skip


def run_page(
    page: Page,
    out: Path,
    jobs: int | None = None,
    only: set[str] | None = None,
    part: str | None = None,
    store: Path | None = None,
) -> Path | None:
    """Every job of ``page`` into ``out`` and the page rendered there from ``out``'s data;
    returns the rendered page's path. With ``only`` (labels, :attr:`Job.label`) the other
    jobs do not run: their published files are copied, with their provenance and so their
    commit. Files the page reads that none of its jobs makes (the README quotes every
    page) are the published ones, copied likewise. Raises :class:`BadInput` before any work
    (unknown ``only`` label, no such page, ``jobs`` < 1) and :class:`PageFailed` when a job
    fails, a job's data is missing after it ran, or a block cannot be rendered.

    Every run a job makes leaves its record in the run ``store`` (default
    ``OUT/docs/results/store``; :mod:`fedshield.results.store`), and a grid's run whose
    record there or in the repository's store counts at this code is not run again
    (docs/results-store.md). ``part`` (``k/n``): only the grid jobs, each making its part
    ``k`` of ``n`` of the runs still missing, their records in ``store``; nothing is
    collected or rendered (None is returned): once every part's records are in one store,
    the page is made without ``part``."""
    rr = _render_results()
    labels = list(dict.fromkeys(j.label for j in page.jobs))
    unknown = sorted((only or set()) - set(labels))
    if unknown:
        raise BadInput(
            f"--only {','.join(unknown)}: not a job of {page.name} (jobs: {', '.join(labels)})"
        )
    if jobs is not None and jobs < 1:
        raise BadInput(f"-j {jobs}: expected a positive number of parallel runs")
    out = out.resolve()
    _check_names(page)
    _older_runs(page, out, only)
    stores = _stores(out, store)
    if part is not None:
        _run_part(page, out, stores, part, jobs, only)
        return None
    prose = ROOT / page.doc
    doc = out / page.doc
    if not prose.exists() and not doc.exists():
        raise BadInput(
            f"pages.toml [{page.name}].doc: {page.doc}: no such page (in the repository or {out})"
        )
    in_place = out == ROOT.resolve()
    data = out / DATA_REL
    data.mkdir(parents=True, exist_ok=True)
    (out / "runs").mkdir(exist_ok=True)
    if prose.exists() and not in_place:
        doc.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(prose, doc)  # the prose; the tables are rendered below
    ran: list[Job] = []
    for j in page.jobs:
        if only is not None and j.label not in only:
            if not in_place:
                _copy_published([str(d / f) for f in j.outputs() for d in WRITE_DIRS], out)
            continue
        t0 = time.perf_counter()
        print(f"== {page.name}: {j.shown()}", flush=True)
        ran.append(j)
        if j.kind == "command":
            for f in j.writes if not in_place else ():  # an earlier run's: not this one's
                if (old := locate(out, f)) is not None:
                    old.unlink()
            _run(j.command(out), j.shown(), stores[0])
            _stamp(j, data)
            continue
        job = j if jobs is None else replace(j, jobs=jobs)
        argv = job.argv(out, stores if j.kind == "grid" else ())
        _run([sys.executable, "-m", "fedshield.cli", *argv], j.shown(), stores[0])
        wall = time.perf_counter() - t0
        if j.kind == "grid":
            src = out / "runs" / j.stem
            rr.collect(src, data)
            n = _count_rows(src / "comparison.csv")
        else:
            src = out / "runs" / f"bench-{j.name}"
            rr.collect_bench(src, data)
            n = _count_rows(src / "runs.csv")
        _record_time(data, j, n, wall)
    absent = [f for j in ran for f in j.required() if locate(out, f) is None]
    if absent:
        raise PageFailed(f"{page.name}: its jobs ran but did not write {', '.join(absent)}")
    made = {f for j in ran for f in j.outputs()}
    if not in_place:
        foreign = [f for f in _reads(doc.read_text()) if Path(f).name not in made]
        for f in _copy_published(foreign, out):
            print(f"   {f}: the published file (no job of {page.name} makes it)", flush=True)
    missing: list[str] = []
    text = rr.render_document(doc.read_text(), missing, root=out)
    doc.write_text(text)
    if missing:
        raise PageFailed(f"{page.doc}: not rendered: {'; '.join(dict.fromkeys(missing))}")
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


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("page", nargs="?", help="a page of docs/results/pages.toml")
    ap.add_argument("--out", default="runs/results", help="where (the repo's layout below it)")
    ap.add_argument("-j", "--jobs", type=int, default=None, help="parallel runs per job")
    ap.add_argument("--list", action="store_true", help="the pages, their jobs and commits")
    ap.add_argument("--sample", action="store_true", help="re-run the page's sampled cell")
    ap.add_argument("--only", default=None, help="these jobs only (comma-separated labels)")
    ap.add_argument("--part", default=None, help="K/N: part K of N of the missing grid runs")
    ap.add_argument("--store", default=None, help="run store (default OUT/docs/results/store)")
    args = ap.parse_args(argv)
    try:
        return _main(args)
    except BadInput as err:
        print(f"error: {err.code}", file=sys.stderr)
        return 2
    except PageFailed as err:
        print(f"error: {err.code}", file=sys.stderr)
        return 1


def _main(args: argparse.Namespace) -> int:
    pages = load_pages()
    if args.list:
        for p in pages.values():
            commits = sorted({c for cs in data_commits(p).values() for c in cs})
            print(f"{p.name:18} {p.doc:36} {p.what}  [data at {', '.join(commits) or '-'}]")
            for j in p.jobs:
                print(f"    [{j.label}] {j.shown()}")
        return 0
    if args.page not in pages:
        raise BadInput(f"PAGE={args.page!r}: not a page of {PAGES_REL} (pages: {', '.join(pages)})")
    if args.sample:
        if args.only is not None or args.jobs is not None:
            raise BadInput("--sample re-runs one cell: --only and -j do not apply")
        got = sample(args.page)
        print(got.line())
        return 0 if got.ok else 1
    only = {x.strip() for x in args.only.split(",")} if args.only is not None else None
    if only is not None and not all(only):
        raise BadInput(f"--only {args.only!r}: expected job labels separated by commas")
    store = Path(args.store) if args.store else None
    doc = run_page(pages[args.page], Path(args.out), args.jobs, only, args.part, store)
    if doc is not None:
        print(f"rendered {doc}")
    return 0


if __name__ == "__main__":
    sys.modules.setdefault("results", sys.modules[__name__])  # render_results' page= blocks
    sys.exit(main())
