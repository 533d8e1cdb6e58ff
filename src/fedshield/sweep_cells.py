"""Which runs already in a sweep's output folder a sweep may keep.

A sweep writes each run to ``<out>/<run name>/`` and, run again with the same ``--out``,
keeps the runs it finds there (finished ones are reused, unfinished ones continue from their
checkpoint). A run is kept only when it was made with the same fully resolved config as the
grid's cell now resolves to — every key, compared as ``run --resume`` compares a checkpoint
(:func:`fedshield.sim.rundir.config_changes`: ``rounds`` may grow, ``run.*`` is hardware).
A run made with another config (``--set client.lr=0.001`` on a sweep folder made at 0.1) is
removed and run again, with one warning line naming the key, the old and the new value:
no stale result stays in the folder and none is reported as the new config's.

The code version is reported, not enforced: a kept run made by another fedshield commit or
version gives one warning line (its ``summary.json`` and the sweep's ``provenance.json``
name every commit); delete its folder to run it again. Forcing a re-run on every commit
would make a long sweep impossible to continue across an unrelated change (a docs commit),
while a changed default that changes the resolved config is caught by the config check.
"""

from __future__ import annotations

import json
import logging
import shutil
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from fedshield import config as cfgmod
from fedshield.sim.rundir import config_changes

log = logging.getLogger("fedshield")


def saved_config(out: Path) -> str | None:
    """The resolved config of the run in ``out`` that a sweep could keep: a finished run's
    ``config.toml`` (written by the session that finished it; "" when missing), else the
    checkpoint's (what ``--resume`` continues; a large file is read only here); None when
    there is nothing to keep (no run, or one killed before its first checkpoint, which
    starts over anyway)."""
    if (out / "summary.json").exists():
        saved = out / "config.toml"
        return saved.read_text() if saved.exists() else ""
    ckpt = out / "checkpoint.pt"
    if ckpt.exists():
        from fedshield.sim.checkpoint import peek_checkpoint

        return str(peek_checkpoint(ckpt)["config"])
    return None


def cell_changes(raw: dict[str, Any], out: Path) -> dict[str, tuple[Any, Any]]:
    """``{key: (saved, now)}`` in which the run in ``out`` differs from the cell's config
    ``raw``; ``rounds`` counts when the saved run has more rounds than asked (a run can be
    extended, not shortened). Empty: keep it (or nothing is there)."""
    text = saved_config(out)
    if text is None:
        return {}
    now = cfgmod.dump(cfgmod.validate(raw))
    if not text:
        return {"config.toml": ("missing", "present")}
    import tomllib

    changes = config_changes(text, now)
    saved_rounds, rounds = tomllib.loads(text).get("rounds"), tomllib.loads(now).get("rounds")
    if isinstance(saved_rounds, int) and isinstance(rounds, int) and saved_rounds > rounds:
        changes = {"rounds": (saved_rounds, rounds), **changes}
    return changes


def describe(changes: dict[str, tuple[Any, Any]], most: int = 3) -> str:
    """``client.lr: 0.1 → 0.001, ...`` (the first ``most`` keys and how many more)."""
    parts = [f"{k}: {json.dumps(a)} → {json.dumps(b)}" for k, (a, b) in changes.items()]
    more = f", and {len(parts) - most} more keys" if len(parts) > most else ""
    return ", ".join(parts[:most]) + more


def drop_stale_cells(cells: Sequence[tuple[str, dict[str, Any]]], out: Path) -> list[str]:
    """Remove the run folders under ``out`` made with another config than their cell's
    ``(name, raw)`` (one warning line per distinct change, naming the runs); returns the
    names of the removed runs, which the sweep then runs from scratch."""
    by_change: dict[str, list[str]] = {}
    for name, raw in cells:
        changes = cell_changes(raw, out / name)
        if changes:
            by_change.setdefault(describe(changes), []).append(name)
    for what, names in by_change.items():
        runs = names[0] if len(names) == 1 else f"{len(names)} runs ({', '.join(names[:3])}...)"
        log.warning(
            "sweep: %s in %s made with another config (%s): removed and run again",
            runs, out, what,
        )  # fmt: skip
        for name in names:
            shutil.rmtree(out / name)
    return [n for names in by_change.values() for n in names]


def warn_other_code(summaries: Sequence[dict[str, Any]], out: Path) -> None:
    """One warning line when kept runs were made by another fedshield commit or version
    than this one (reported, not re-run: see the module doc)."""
    from fedshield import __version__
    from fedshield.provenance import source_commit

    here = source_commit().get("commit")
    other: dict[str, list[str]] = {}
    for s in summaries:
        prov = s.get("provenance") or {}
        version, commit = prov.get("fedshield"), prov.get("commit")
        if version != __version__:
            other.setdefault(f"fedshield {version}", []).append(s["name"])
        elif here and commit and commit != here:
            other.setdefault(f"commit {str(commit)[:10]}", []).append(s["name"])
    if other:
        made = "; ".join(f"{len(v)} by {k} ({', '.join(v[:3])})" for k, v in other.items())
        now = f"commit {here[:10]}" if here else f"fedshield {__version__}"
        log.warning(
            "sweep: kept runs in %s were made by other code than this %s: %s; provenance.json "
            "lists every commit (delete a run's folder to run it again)",
            out, now, made,
        )  # fmt: skip


__all__ = ["cell_changes", "describe", "drop_stale_cells", "saved_config", "warn_other_code"]
