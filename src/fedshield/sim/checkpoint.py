"""Atomic checkpoints and crash-safe metrics logs.

A checkpoint is written to a temporary file in the same directory, fsync'ed and moved over
the old one with ``os.replace``, so a SIGKILL at any instant leaves either the previous or
the new checkpoint, never a torn one. ``metrics.jsonl`` lines are fsync'ed before the
checkpoint of the same round, so on resume every round up to the checkpoint is on disk and
anything after it (possibly a half-written line) is dropped and recomputed.
"""

from __future__ import annotations

import json
import math
import os
import tempfile
from pathlib import Path
from typing import Any

import torch


def atomic_write_bytes(path: Path, write: Any) -> None:
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    dir_fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


def atomic_write_text(path: Path, text: str) -> None:
    atomic_write_bytes(path, lambda f: f.write(text.encode()))


def save_checkpoint(path: Path, state: dict[str, Any]) -> None:
    atomic_write_bytes(path, lambda f: torch.save(state, f))


def load_checkpoint(path: Path) -> dict[str, Any]:
    return torch.load(path, map_location="cpu", weights_only=False)


def strict_json(obj: Any) -> Any:
    """``obj`` with every non-finite float replaced by None, so it serialises as strict JSON
    (``NaN``/``Infinity`` are not JSON; strict parsers reject them)."""
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {k: strict_json(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [strict_json(v) for v in obj]
    return obj


def dumps(obj: Any, **kw: Any) -> str:
    """Strict JSON text (undefined values as ``null``)."""
    return json.dumps(strict_json(obj), allow_nan=False, sort_keys=True, **kw)


class JsonlLog:
    """Append-only JSON-lines file, one fsync'ed line per record."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def append(self, record: dict[str, Any]) -> None:
        with self.path.open("a") as f:
            f.write(dumps(record) + "\n")
            f.flush()
            os.fsync(f.fileno())

    def read(self) -> list[dict[str, Any]]:
        if not self.path.exists():
            return []
        out = []
        for line in self.path.read_text().splitlines():
            try:
                out.append(json.loads(line))
            except json.JSONDecodeError:
                break  # a line torn by a crash: everything after it is recomputed
        return out

    def truncate_after(self, last_round: int) -> list[dict[str, Any]]:
        """Keep only records with ``round <= last_round`` (rewritten atomically)."""
        kept = [r for r in self.read() if r.get("round", 0) <= last_round]
        atomic_write_text(self.path, "".join(dumps(r) + "\n" for r in kept))
        return kept
