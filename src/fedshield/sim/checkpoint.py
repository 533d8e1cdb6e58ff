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
import pickle
import re
import tempfile
import tomllib
from pathlib import Path
from typing import Any

import torch

from fedshield.core.state_check import check_round
from fedshield.errors import DataError


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
    fsync_dir(path.parent)


def fsync_dir(path: Path) -> None:
    # The rename is durable only once the directory entry is on disk (POSIX).
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:  # pragma: no cover - e.g. platforms without directory fds
        return
    try:
        os.fsync(fd)
    except OSError:  # pragma: no cover
        pass
    finally:
        os.close(fd)


def atomic_write_text(path: Path, text: str) -> None:
    atomic_write_bytes(path, lambda f: f.write(text.encode()))


def save_checkpoint(path: Path, state: dict[str, Any]) -> None:
    atomic_write_bytes(path, lambda f: torch.save(state, f))


#: A loaded and checked checkpoint kept for the next :func:`load_checkpoint` of the same
#: unchanged file (see :func:`check_checkpoint`): the CLI checks it before any work, the
#: engine loads it after the build, and a large file is read once.
_checked: dict[Path, tuple[tuple[int, int, int], dict[str, Any]]] = {}


def _stat_key(path: Path) -> tuple[int, int, int]:
    st = path.stat()
    return st.st_ino, st.st_size, st.st_mtime_ns


def check_checkpoint(path: Path) -> None:
    """Load and check ``path`` now (:func:`load_checkpoint`'s errors, before any work);
    the next :func:`load_checkpoint` of the unchanged file returns it without reading it."""
    key = path.resolve()
    try:
        stat = _stat_key(path)
    except OSError:
        stat = None  # load_checkpoint says what is wrong
    if stat is not None and key in _checked and _checked[key][0] == stat:
        return
    _checked.clear()
    obj = load_checkpoint(path)
    if stat is not None:
        _checked[key] = (stat, obj)


def peek_checkpoint(path: Path) -> dict[str, Any]:
    """The checked checkpoint in ``path`` (:func:`check_checkpoint`), kept for the engine's
    :func:`load_checkpoint`, so reading it early costs no second read."""
    check_checkpoint(path)
    cached = _checked.get(path.resolve())
    return cached[1] if cached is not None else load_checkpoint(path)


def load_checkpoint(path: Path) -> dict[str, Any]:
    """The engine's checkpoint ``{"version", "config", "state"}`` in ``path``, checked.

    Loaded with ``weights_only=True``: a checkpoint holds only tensors, numbers, strings and
    dicts, so a file that asks the unpickler for anything else (a planted ``os.system``) is
    refused instead of run. A missing, unreadable, truncated or foreign file raises
    :class:`~fedshield.errors.DataError` naming it and what is wrong."""
    key = path.resolve()
    cached = _checked.pop(key, None)
    if cached is not None and path.exists() and cached[0] == _stat_key(path):
        return cached[1]
    try:
        obj = torch.load(path, map_location="cpu", weights_only=True)
    except FileNotFoundError:
        raise DataError(f"{path}: checkpoint not found") from None
    except IsADirectoryError:
        raise DataError(f"{path}: checkpoint is a directory, not a file") from None
    except pickle.UnpicklingError as err:
        text = str(err)
        unsafe = re.search(r"unsupported GLOBAL (\S+)", text)
        if unsafe:
            raise DataError(
                f"{path}: refused: the checkpoint asks to load {unsafe.group(1)}, which a "
                f"fedshield checkpoint never holds (unpickling it could run code)"
            ) from None
        detail = re.search(r"WeightsUnpickler error: \s*(.+?)\n", text)
        cause = f": {detail.group(1).strip()}" if detail else ""
        raise DataError(f"{path}: corrupt checkpoint (not a torch file{cause})") from None
    except EOFError:
        raise DataError(f"{path}: corrupt checkpoint (empty or cut short)") from None
    except Exception as err:
        cause = " ".join(str(err).split())[:200]
        raise DataError(
            f"{path}: corrupt checkpoint (damaged or cut short: {type(err).__name__}: {cause})"
        ) from None
    problem = _checkpoint_problem(obj)
    if problem:
        raise DataError(f"{path}: not a fedshield checkpoint ({problem})")
    return obj


def _checkpoint_problem(obj: Any) -> str | None:
    """What is wrong with a loaded checkpoint's layout (see ``Simulator.save``), or None."""
    if not isinstance(obj, dict):
        return f"holds a {type(obj).__name__}, expected a dict"
    missing = [k for k in ("config", "state") if k not in obj]
    if missing:
        return f"no {' or '.join(repr(k) for k in missing)} entry"
    if obj.get("version", 1) != 1:
        return f"format version {obj['version']!r}; this fedshield reads version 1"
    if not isinstance(obj["config"], str):
        return "'config' is not the config text"
    try:
        rounds = tomllib.loads(obj["config"]).get("rounds")
    except tomllib.TOMLDecodeError as err:
        return f"'config' is not valid TOML: {err}"
    state = obj["state"]
    if not isinstance(state, dict):
        return "'state' is not a dict"
    for key in ("round", "params", "buffers", "server_state", "client_states"):
        if key not in state:
            return f"no 'state.{key}' entry"
    try:  # the round counter within the rounds of the config that wrote it
        check_round("state.round", state["round"], rounds, error=ValueError)
    except ValueError as err:
        return str(err)
    norms = obj.get("norms", {})
    if not isinstance(norms, dict) or not all(
        isinstance(v, int | float) and not isinstance(v, bool) for v in norms.values()
    ):
        return "'norms' is not a table of numbers"
    for key in ("params", "buffers"):
        if not isinstance(state[key], torch.Tensor):
            return f"state.{key} is not a tensor"
    tables = {"state.server_state": state["server_state"]}
    clients = state["client_states"]
    if not isinstance(clients, dict):
        return "state.client_states is not a dict"
    for k, table in clients.items():
        if isinstance(k, bool) or not isinstance(k, int | str) or not str(k).isdigit():
            return f"state.client_states has a key {k!r} that is not a client id"
        tables[f"state.client_states[{k}]"] = table
    for where, table in tables.items():
        if not isinstance(table, dict):
            return f"{where} is not a dict"
        for name, value in table.items():
            if not isinstance(name, str) or not isinstance(value, torch.Tensor):
                return f"{where}[{name!r}] is not a named tensor"
    return None


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
