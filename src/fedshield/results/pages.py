"""The results pages and their jobs, as ``docs/results/pages.toml`` declares them.

A page is a document of the repository (``doc``) and the jobs that make its data: bundled or
file grids (``fedshield sweep``), benches (``fedshield bench``) and commands (a script with
the outputs it ``writes``). :func:`load_pages` reads and checks the file: a bad key or value
is :class:`BadInput`, one line naming it. Running a page: :mod:`fedshield.results.make`;
its header block: :mod:`fedshield.results.header`; docs/results/index.md.
"""

from __future__ import annotations

import re
import shlex
import sys
import tomllib
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

#: The repository checkout these modules lie in (src/fedshield/results/): pages are made
#: in a checkout, as the repository's tests and data are there.
ROOT = Path(__file__).resolve().parents[3]
PAGES_REL = Path("docs") / "results" / "pages.toml"
PAGES = ROOT / PAGES_REL
DATA_REL = Path("docs") / "results" / "data"
TIMES = "campaign-times.csv"


class BadInput(SystemExit):
    """Bad input (pages.toml, the command line, a ``page=`` block): one line naming the key
    or value, raised before any job runs; the ``page`` command
    (:func:`fedshield.results.make.main`) prints it as ``error: …``, exit 2."""


class PageFailed(SystemExit):
    """A job failed, or the page's data is missing after its jobs ran: ``error: …``, exit 1."""


#: Where a command's ``writes`` names may lie (first match): its data, or the page folder.
WRITE_DIRS = (DATA_REL, DATA_REL.parent)
#: The files of a ``fedshield bench`` output that are results (copied as
#: ``bench-<name>-<file>`` by :func:`fedshield.results.collect.collect_bench`); the per-run
#: JSON files stay in the run folder.
BENCH_FILES = ("worst.csv", "asr.csv", "cells.csv", "runs.csv", "choice.csv", "best.md",
               "header.md", "steps.csv", "steps.md")  # fmt: skip
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
            names = [f"bench-{self.name}-{f}" for f in BENCH_FILES]
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
