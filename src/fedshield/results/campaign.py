"""A campaign in parts: which runs a grid still needs, split over machines.

A grid's run counts as done when the store holds a record of its cell (:func:`~fedshield.
results.store.cell_key`) that counts at the current code (:mod:`fedshield.results.
validity`); :func:`lookup` finds it (replaying an unchecked one), :func:`materialize`
writes it back as the run's folder (``config.toml``, ``summary.json``, ``metrics.jsonl``),
which the sweep then keeps as a finished run, so its tables are made as for runs made
here. The missing ones are split over ``n`` machines by :func:`part_of`: by the cell's
hash, so every machine computes the same split of any list, and each cell lies in exactly
one part.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fedshield.errors import ConfigError
from fedshield.results import store, validity

#: The key a materialized run's summary.json carries (the record it came from, its status).
FROM_STORE = "from_store"


def parse_part(text: str) -> tuple[int, int]:
    """``k/n`` (1 <= k <= n) as ``(k, n)``."""
    m = re.fullmatch(r"\s*(\d+)\s*/\s*(\d+)\s*", text)
    if not m or not 1 <= int(m.group(1)) <= int(m.group(2)):
        raise ConfigError(f"--part {text!r}: expected k/n with 1 <= k <= n, e.g. 2/4")
    return int(m.group(1)), int(m.group(2))


def part_of(cell: str, n: int) -> int:
    """The part (1..n) a cell belongs to: its hash modulo ``n``."""
    return int(cell[:16], 16) % n + 1


@dataclass
class Found:
    """What the stores say about one cell: the record that counts, if any, and the records
    of it that do not (stale or unchecked: named, never used)."""

    counted: validity.Status | None
    rejected: list[validity.Status]


def index(*stores: Path) -> dict[str, list[tuple[Path, dict[str, Any]]]]:
    """The records of ``stores`` by cell."""
    out: dict[str, list[tuple[Path, dict[str, Any]]]] = {}
    for f, rec in store.records(*stores):
        out.setdefault(rec["cell"], []).append((f, rec))
    return out


def lookup(
    cell: str,
    by_cell: dict[str, list[tuple[Path, dict[str, Any]]]],
    replay: bool = True,
    rounds: int = validity.ROUNDS,
) -> Found:
    """The first record of ``cell`` that counts (valid first; with ``replay``, unchecked
    ones are replayed until one holds), and those that do not."""
    sts = [validity.status(f, rec) for f, rec in by_cell.get(cell, [])]
    sts.sort(key=lambda s: (s.state != "valid", s.state != "replayed", s.path.name))
    rejected: list[validity.Status] = []
    for st in sts:
        if st.state == "unchecked" and replay:
            st = validity.check(st.path, st.record, rounds)
        if st.counts:
            return Found(st, rejected)
        rejected.append(st)
    return Found(None, rejected)


def materialize(st: validity.Status, folder: Path) -> None:
    """The record of ``st`` as a finished run's folder (see the module doc)."""
    rec = st.record
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.toml").write_text(rec["config"])
    with (folder / "metrics.jsonl").open("w") as fh:
        for r in rec["rounds"]:
            fh.write(json.dumps(r) + "\n")
    summary = {**rec["summary"], FROM_STORE: {"record": st.path.name, "state": st.state,
                                              "commit": rec.get("commit")}}  # fmt: skip
    (folder / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")


__all__ = ["FROM_STORE", "Found", "index", "lookup", "materialize", "parse_part", "part_of"]
