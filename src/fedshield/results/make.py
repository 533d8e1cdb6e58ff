"""Make a results page at the current commit: ``fedshield results page PAGE`` (``make
results PAGE=...``), docs/results/index.md.

:func:`run_page` runs the page's jobs (docs/results/pages.toml, :mod:`fedshield.results.
pages`) from nothing into ``OUT`` (the repository's layout below it, so ``OUT=.`` publishes
in place): sweeps and benches under ``OUT/runs/``, their CSVs collected with provenance
under ``OUT/docs/results/data/`` (:mod:`fedshield.results.collect`), each grid's wall time
appended to ``OUT/docs/results/data/campaign-times.csv``, the page's prose copied from the
repository and its tables rendered from ``OUT``'s data (:mod:`fedshield.results.render`). A
stopped command continues where it stopped: benches keep their finished runs of the same
config and commit, sweeps those of the same config — so a grid's folder holding runs of
another commit is refused before any work (a page is made at one commit: remove the folder
or choose another ``--out``).

``--only`` runs the jobs of those labels (``--list`` shows them: a grid's or bench's name, a
command's script, ``fedshield-run`` for ``{py} -m fedshield.cli run``); the other jobs' data,
and any file the page reads that none of its jobs makes (the README quotes every page), is
the published one, copied with its provenance record. Bad input (pages.toml, the command
line) is one ``error:`` line naming the key or value, exit 2, before anything is made; a
failed job, a job's missing output or a block that cannot be rendered: ``error:``, exit 1.

``--sample`` re-runs the page's sampled cell (:mod:`fedshield.results.sampling`).
"""

from __future__ import annotations

import argparse
import csv
import json
import shutil
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

from fedshield.results import collect, render
from fedshield.results.header import data_commits
from fedshield.results.pages import (
    DATA_REL,
    PAGES_REL,
    ROOT,
    TIMES,
    WRITE_DIRS,
    BadInput,
    Job,
    Page,
    PageFailed,
    load_pages,
    locate,
)


def _commit() -> str:
    """The checkout's commit (``source_commit`` returns a record, not the sha)."""
    from fedshield.provenance import source_commit

    return str(source_commit().get("commit") or "unknown")


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
            "made_by": "fedshield results page, after the command ran",
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
            collect.collect(src, data)
            n = _count_rows(src / "comparison.csv")
        else:
            src = out / "runs" / f"bench-{j.name}"
            collect.collect_bench(src, data)
            n = _count_rows(src / "runs.csv")
        _record_time(data, j, n, wall)
    absent = [f for j in ran for f in j.required() if locate(out, f) is None]
    if absent:
        raise PageFailed(f"{page.name}: its jobs ran but did not write {', '.join(absent)}")
    made = {f for j in ran for f in j.outputs()}
    if not in_place:
        foreign = [f for f in render.reads(doc.read_text()) if Path(f).name not in made]
        for f in _copy_published(foreign, out):
            print(f"   {f}: the published file (no job of {page.name} makes it)", flush=True)
    missing: list[str] = []
    text = render.render_document(doc.read_text(), missing, root=out)
    doc.write_text(text)
    if missing:
        raise PageFailed(f"{page.doc}: not rendered: {'; '.join(dict.fromkeys(missing))}")
    return doc


# -- the command --------------------------------------------------------------------------------
def main(args: argparse.Namespace) -> int:
    """``fedshield results page`` (its arguments: :mod:`fedshield.results.__main__`): bad
    input is ``error: …``, exit 2; a failed page ``error: …``, exit 1."""
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
        from fedshield.results.sampling import sample

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
