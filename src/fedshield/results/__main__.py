"""The results: the run store's records at the current code (docs/results-store.md) and the
results pages made from them (docs/results/index.md)::

    fedshield results status [STORE ...]             # valid / replayed / unchecked / stale
    fedshield results replay [STORE ...] [--rounds 2] [-j N]   # replay the unchecked ones
    fedshield results compact [STORE ...]            # module hashes into shared manifests
    fedshield results page PAGE [--out DIR] [-j N] [--only LABEL,...] [--part K/N] [--store DIR]
                                                     # = make results PAGE=... OUT=... ...
    fedshield results page --list                    # pages, [job labels], data's commits
    fedshield results page PAGE --sample             # the page's sampled cell, re-run now
    fedshield results render [--check] [--collect SWEEP_DIR ...] [--collect-bench DIR ...]
    fedshield results paired SOURCE A B METRIC ...   # paired per-seed verdicts, a table
    fedshield results curves SOURCE --metrics M,... --out FIG.png
    python -m fedshield.results ...                  # the same

STORE defaults to the repository's (docs/results/store). ``status`` and ``replay`` exit 1
when a record is stale (or, for ``status``, unchecked): a page would leave it out.

This module holds the arguments only: ``fedshield run`` builds its parser with them, so a
run's process loads it (and it is among the modules a run's record hashes, :mod:`fedshield.
results.store`). The commands' code is imported when one runs, so a change to how pages are
made or rendered leaves every stored record valid.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path


def add_arguments(ap: argparse.ArgumentParser) -> None:
    """The subcommands and their arguments (also ``fedshield results``)."""
    sub = ap.add_subparsers(
        dest="action", required=True, metavar="ACTION",
        help="status / replay: the run store; page / render / paired / curves: the pages",
    )  # fmt: skip
    for action, what in (
        ("status", "each record valid, replayed, unchecked or stale at the current code"),
        ("replay", "as status, replaying the unchecked records at the current code"),
    ):
        p = sub.add_parser(action, help=what, description=what)
        p.add_argument("stores", nargs="*", type=Path, help="store folders (default: the repo's)")
        p.add_argument("--rounds", type=int, default=None, help="rounds a replay runs (2)")
        if action == "replay":
            p.add_argument(
                "-j", "--jobs", type=int, default=1,
                help="replays in parallel, one process and one thread each (1)",
            )  # fmt: skip
    cp = sub.add_parser(
        "compact", help="records and stamps written before manifests: module hashes moved "
        "into the store's shared manifests/ (names and contents read back unchanged)",
    )  # fmt: skip
    cp.add_argument("stores", nargs="*", type=Path, help="store folders (default: the repo's)")
    pg = sub.add_parser(
        "page", help="make a results page at this commit (docs/results/pages.toml)",
        description="Run a page's jobs from nothing into --out and render it there "
        "(fedshield.results.make); `make results PAGE=...` runs this.",
    )  # fmt: skip
    pg.add_argument("page", nargs="?", help="a page of docs/results/pages.toml")
    pg.add_argument("--out", default="runs/results", help="where (the repo's layout below it)")
    pg.add_argument("-j", "--jobs", type=int, default=None, help="parallel runs per job")
    pg.add_argument("--list", action="store_true", help="the pages, their jobs and commits")
    pg.add_argument("--sample", action="store_true", help="re-run the page's sampled cell")
    pg.add_argument("--only", default=None, help="these jobs only (comma-separated labels)")
    pg.add_argument("--part", default=None, help="K/N: part K of N of the missing grid runs")
    pg.add_argument("--store", default=None, help="run store (default OUT/docs/results/store)")
    rd = sub.add_parser(
        "render", help="render the tables of README.md and docs/ from docs/results/data",
        description="Rewrite every <!-- fedshield:table --> block of README.md and docs/ "
        "(fedshield.results.render); --collect copies a sweep's result files with their "
        "provenance (fedshield.results.collect).",
    )  # fmt: skip
    rd.add_argument("--check", action="store_true", help="fail if a document is out of date")
    rd.add_argument(
        "--collect", nargs="*", default=[], metavar="SWEEP_DIR",
        help="copy these sweeps' result files to docs/results/data with provenance; no render",
    )  # fmt: skip
    rd.add_argument(
        "--collect-bench", nargs="*", default=[], metavar="BENCH_DIR",
        help="the same for `fedshield bench` output folders",
    )  # fmt: skip
    pr = sub.add_parser(
        "paired", help="variant A minus B paired by seed (fedshield.results.paired)",
        description="Per metric: mean ± 95 %% t interval of the per-seed differences, the "
        "sign test and the verdict, as a `paired=A,B` block renders it.",
    )  # fmt: skip
    pr.add_argument("source", help="a sweep's per-run CSV (several: comma-separated)")
    pr.add_argument("a", help="variant A")
    pr.add_argument("b", help="variant B")
    pr.add_argument("metrics", nargs="+", help="the metrics (columns) compared")
    cv = sub.add_parser(
        "curves", help="curves over rounds with a band over the seeds (a budget file)",
        description="One panel per metric from a sweep's <name>-budget.csv "
        "(fedshield.results.curves).",
    )  # fmt: skip
    cv.add_argument("source", type=Path, help="a sweep's <name>-budget.csv")
    cv.add_argument("--metrics", required=True, help="comma-separated columns, one panel each")
    cv.add_argument("--out", type=Path, required=True, help="the PNG to write")
    cv.add_argument("--by", default="variant", help="the column that names a curve")
    cv.add_argument("--budgets", default="", help="rounds to mark, e.g. 20,40,80,150")


def run(args: argparse.Namespace) -> int:
    """The subcommand ``args.action`` (see the module doc for the exits)."""
    if args.action in ("status", "replay"):
        return _records(args)
    if args.action == "compact":
        from fedshield.results import store, validity

        for where in args.stores or [store.REPO_STORE]:
            records, stamps = validity.compact(where)
            print(f"{where}: {records} record(s) and {stamps} stamp(s) compacted")
        return 0
    if args.action == "page":
        from fedshield.results import make

        return make.main(args)
    if args.action == "render":
        from fedshield.results import render

        return render.main(args)
    if args.action == "paired":
        from fedshield.results import paired

        return paired.main(args)
    from fedshield.results import curves

    return curves.main(args)


def _records(args: argparse.Namespace) -> int:
    """Each record's line, then the count per status (see the module doc for the exit)."""
    from collections import Counter

    from fedshield.results import store, validity

    stores = args.stores or [store.REPO_STORE]
    counts: Counter[str] = Counter()
    rounds = args.rounds or validity.ROUNDS
    jobs = getattr(args, "jobs", 1)
    if jobs < 1:
        from fedshield.errors import ConfigError

        raise ConfigError(f"--jobs {jobs}: give at least 1")
    todo: list[Path] = []
    for f, rec in store.records(*stores):
        st = validity.status(f, rec)
        if args.action == "replay" and st.state == "unchecked":
            if jobs > 1:  # replayed below, in parallel
                todo.append(f)
                continue
            st = validity.check(f, rec, rounds)
        counts[st.state] += 1
        print(st.line(), flush=True)
    if todo:
        import multiprocessing
        from concurrent.futures import ProcessPoolExecutor

        # spawn: a fresh interpreter per worker (no forked torch thread pools); stamps and
        # manifests are written atomically under per-process names, so workers never clash
        # (the workers' functions live in validity: a spawned worker cannot import __main__)
        ctx = multiprocessing.get_context("spawn")
        work = validity.check_file
        with ProcessPoolExecutor(jobs, mp_context=ctx, initializer=validity.one_thread) as pool:
            for state, line in pool.map(work, todo, [rounds] * len(todo), chunksize=4):
                counts[state] += 1
                print(line, flush=True)
    print(", ".join(f"{n} {k}" for k, n in sorted(counts.items())) or "no records")
    bad = counts["stale"] + (counts["unchecked"] if args.action == "status" else 0)
    return 1 if bad else 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m fedshield.results",
        description=__doc__.split("\n\n")[0] if __doc__ else None,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_arguments(ap)
    return run(ap.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
