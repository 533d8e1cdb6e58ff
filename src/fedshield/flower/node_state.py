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

from dataclasses import dataclass
from pathlib import Path

import torch
from torch import Tensor

from fedshield.core.state_check import check_round, check_table
from fedshield.errors import DataError
from fedshield.sim.checkpoint import atomic_write_bytes

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
    atomic_write_bytes(path, lambda f: torch.save(payload, f))
    return path


def load(
    state_dir: Path, client_id: int, run_key: str, device: torch.device | str = "cpu"
) -> SavedState | None:
    """This run's saved state of ``client_id``, or None (no file, or another run's)."""
    path = state_path(state_dir, client_id)
    if not path.exists():
        return None
    try:
        d = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as err:
        raise DataError(f"{path}: corrupt client state ({type(err).__name__})") from None
    if not isinstance(d, dict):
        raise DataError(f"{path}: not a fedshield client state")
    if d.get("run_key") != run_key or d.get("client_id") != client_id:
        return None
    rnd = check_round(f"{path}: round", d.get("round"), None)
    # Shapes and dtypes are checked by the caller against the client algorithm's spec.
    tensors = check_table(f"{path}: state", d.get("state"), None)
    return SavedState(run_key, client_id, rnd, {k: v.to(device) for k, v in tensors.items()})

