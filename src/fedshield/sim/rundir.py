"""Can this output directory take this run? Checked before any work, cheaply (no torch
import unless a checkpoint must be read), by the runner, the CLI on both backends, and the
engine again when it prepares the directory."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from fedshield.errors import ConfigError


def check_run_dir(out: Path, resume: bool, config_text: str) -> None:
    """Before any work (the runner, the CLI on both backends, and the engine again): an
    ``out`` that holds a run needs ``--resume``, and a resumed checkpoint must hold this
    config, up to :data:`RESUMABLE` (:func:`config_changes`)."""
    ckpt = out / "checkpoint.pt"
    has_run = (out / "metrics.jsonl").exists() or ckpt.exists()
    if has_run and not resume:
        raise ConfigError(
            f"{out} already holds a run; pass --resume to continue it or choose another --out"
        )
    if not (resume and ckpt.exists()):
        return
    from fedshield.sim.checkpoint import peek_checkpoint

    diff = config_changes(peek_checkpoint(ckpt)["config"], config_text)
    if diff:
        raise ConfigError(f"{out}: --resume with a different config (changed: {', '.join(diff)})")


def mark_started(out: Path, resume: bool, config_text: str) -> None:
    """Once every check has passed, before any data is loaded: ``out/config.toml``, written
    atomically, marks a run as started, so a kill at any later moment — start-up included
    (loading data, building the model, starting Ray) — leaves a run ``--resume`` continues
    (from round 1 when no checkpoint was written). A resumed run keeps its file; the engine
    rewrites it."""
    from fedshield.sim.checkpoint import atomic_write_text

    out.mkdir(parents=True, exist_ok=True)
    marker = out / "config.toml"
    if not (resume and marker.exists()):
        atomic_write_text(marker, config_text)


def started(out: Path) -> bool:
    """Whether ``out`` holds a started run (:func:`mark_started`, a log or a checkpoint)."""
    return any((out / f).exists() for f in ("config.toml", "metrics.jsonl", "checkpoint.pt"))


def finished(out: Path, rounds: int) -> bool:
    """Whether ``out``'s checkpoint is past round ``rounds``: a ``--resume`` that has
    nothing left to train (it only writes the summary again)."""
    ckpt = out / "checkpoint.pt"
    if not ckpt.exists():
        return False
    from fedshield.sim.checkpoint import peek_checkpoint

    return int(peek_checkpoint(ckpt)["state"]["round"]) > rounds


#: What a resumed run may change: ``rounds`` (a run may be extended) and ``run.*`` (device,
#: threads, progress bar, loggers: other hardware computes the same run).
RESUMABLE = ("rounds", "run")


def config_changes(saved_text: str, now_text: str) -> dict[str, tuple[Any, Any]]:
    """``{dotted key: (saved value, new value)}`` of two resolved configs (TOML), sorted by
    key, the :data:`RESUMABLE` keys left out; empty when a run made with ``saved_text`` can
    be continued or reused under ``now_text``."""
    import tomllib

    saved, now = tomllib.loads(saved_text), tomllib.loads(now_text)
    for key in RESUMABLE:
        saved.pop(key, None), now.pop(key, None)
    return dict(sorted(_diff(saved, now).items()))


def _diff(a: dict[str, Any], b: dict[str, Any], prefix: str = "") -> dict[str, tuple[Any, Any]]:
    out: dict[str, tuple[Any, Any]] = {}
    for k in set(a) | set(b):
        path = f"{prefix}{k}"
        va, vb = a.get(k), b.get(k)
        if isinstance(va, dict) and isinstance(vb, dict):
            out |= _diff(va, vb, path + ".")
        elif va != vb:
            out[path] = (va, vb)
    return out


__all__ = ["RESUMABLE", "check_run_dir", "config_changes", "finished", "mark_started", "started"]


def check_out_dir(out: Path, flag: str | None = None) -> None:
    """Refuse, before any work, an output directory that cannot be one: ``out`` or a
    folder above it is an existing file (``flag``, e.g. ``--out``, names the option)."""
    where = f"{flag} {out}" if flag else str(out)
    for p in (out, *out.parents):
        if p.is_dir():
            return
        if p.exists() or p.is_symlink():
            what = "it is" if p == out else f"{p} is"
            raise ConfigError(
                f"{where}: {what} an existing file, not a directory; "
                f"choose another {flag or 'output directory'}"
            )
