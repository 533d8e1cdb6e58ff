"""The run store's records at the current code (docs/results-store.md)::

    fedshield results status [STORE ...]             # valid / replayed / unchecked / stale
    fedshield results replay [STORE ...] [--rounds 2]   # replay the unchecked ones
    python -m fedshield.results ...                  # the same

STORE defaults to the repository's (docs/results/store). Exit 1 when a record is stale (or,
for ``status``, unchecked): a page would leave it out.
"""

from __future__ import annotations

import argparse
import sys
from collections import Counter
from pathlib import Path

from fedshield.results import store, validity


def add_arguments(ap: argparse.ArgumentParser) -> None:
    """The arguments of ``status`` / ``replay`` (also ``fedshield results``)."""
    ap.add_argument(
        "action",
        choices=("status", "replay"),
        help="status: each record valid, replayed, unchecked or stale; replay: also replay "
        "the unchecked ones at the current code",
    )
    ap.add_argument("stores", nargs="*", type=Path, help="store folders (default: the repo's)")
    ap.add_argument("--rounds", type=int, default=validity.ROUNDS, help="rounds a replay runs")


def run(args: argparse.Namespace) -> int:
    """Each record's line, then the count per status (see the module doc for the exit)."""
    stores = args.stores or [store.REPO_STORE]
    counts: Counter[str] = Counter()
    for f, rec in store.records(*stores):
        st = validity.status(f, rec)
        if args.action == "replay" and st.state == "unchecked":
            st = validity.check(f, rec, args.rounds)
        counts[st.state] += 1
        print(st.line(), flush=True)
    print(", ".join(f"{n} {k}" for k, n in sorted(counts.items())) or "no records")
    bad = counts["stale"] + (counts["unchecked"] if args.action == "status" else 0)
    return 1 if bad else 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m fedshield.results", description=__doc__)
    add_arguments(ap)
    return run(ap.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
