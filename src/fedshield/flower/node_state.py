"""Per-client state on a SuperNode's disk, so that it survives a SuperNode restart.

Flower keeps a node's :class:`~flwr.app.Context` (and so ``Context.state``) in the
SuperNode's memory: a restarted SuperNode starts with an empty one, and a stateful client
algorithm (SCAFFOLD's control variate h_m) would silently restart from h_m = 0. With the
node config key ``state-dir`` the ClientApp also writes the state to
``<state-dir>/client-<K>.pt`` after every round it trains (atomically: a temporary file,
fsync, rename), and reads it back before training.

The file names the run it belongs to (the strategy's run key) and the round that wrote it.
One file per partition: a newer run overwrites an older run's file, as the node's
``Context.state`` keeps one run's state. A file of another run is ignored.
"""

from __future__ import annotations

import os
import tempfile
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import Tensor

STATE_DIR = "state-dir"  # node config key
_VERSION = 1


@dataclass(frozen=True)
class SavedState:
    run_key: str
    client_id: int
    round: int  # the round whose training produced this state
    tensors: dict[str, Tensor]


def state_path(state_dir: Path, client_id: int) -> Path:
    return state_dir / f"client-{client_id}.pt"


def save(state_dir: Path, saved: SavedState) -> Path:
    """Write ``saved`` atomically: readers see the old file or the new one, never a torn
    one, even if the node dies mid-write."""
    state_dir.mkdir(parents=True, exist_ok=True)
    path = state_path(state_dir, saved.client_id)
    payload = {
        "version": _VERSION,
        "run_key": saved.run_key,
        "client_id": saved.client_id,
        "round": saved.round,
        "state": {k: v.detach().cpu() for k, v in saved.tensors.items()},
    }
    fd, tmp = tempfile.mkstemp(dir=state_dir, prefix=path.name, suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            torch.save(payload, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    _fsync_dir(state_dir)
    return path


def load(
    state_dir: Path, client_id: int, run_key: str, device: torch.device | str = "cpu"
) -> SavedState | None:
    """This run's saved state of ``client_id``, or None (no file, or another run's)."""
    path = state_path(state_dir, client_id)
    if not path.exists():
        return None
    d = torch.load(path, map_location="cpu", weights_only=True)
    if d.get("run_key") != run_key or d.get("client_id") != client_id:
        return None
    tensors = {k: v.to(device) for k, v in d["state"].items()}
    return SavedState(run_key, client_id, int(d["round"]), tensors)


def _fsync_dir(path: Path) -> None:
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
