"""The measurement scripts of ``fedshield bench --list``: the two kinds of bench (docs/bench.md).

* **Registered benches** (``fedshield bench --bench NAME``, bundled TOML files,
  :mod:`fedshield.bench.command`): result-producing sweeps of cells — defenses × attacks ×
  shares × ... × seeds — with the worst-case tables and provenance the results pages read.
* **Measurement scripts** (``python bench/NAME.py``, the repository's ``bench/`` folder):
  timings and side-by-side checks of one piece (a round, an aggregator, a layout), each
  printing or saving its numbers with the commit they were measured at. They ship with the
  checkout, not the package; their one-line summary is their docstring's first sentence,
  read without importing them.
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass
from pathlib import Path

#: The checkout's bench/ folder (src/fedshield/bench/ → the repository root → bench/).
BENCH_DIR = Path(__file__).resolve().parents[3] / "bench"


@dataclass(frozen=True)
class Script:
    name: str  # the file name, e.g. bench_round.py
    summary: str  # the docstring's first sentence


def summary(doc: str) -> str:
    """The first sentence of a docstring's first paragraph, on one line."""
    para = " ".join(doc.strip().split("\n\n")[0].split())
    m = re.match(r"(.+?\.)(\s|$)", para)
    return m.group(1) if m else para


def scripts(folder: Path = BENCH_DIR) -> list[Script]:
    """The measurement scripts in ``folder`` (none outside a checkout)."""
    out = []
    for f in sorted(folder.glob("*.py")):
        doc = ast.get_docstring(ast.parse(f.read_text(encoding="utf-8"))) or ""
        out.append(Script(f.name, summary(doc) if doc else "(no docstring)"))
    return out


__all__ = ["BENCH_DIR", "Script", "scripts", "summary"]
