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
    atomically, marks a run as started (replacing :func:`mark_starting`'s marker), so a
    kill at any later moment — start-up included (loading data, building the model,
    starting Ray) — leaves a run ``--resume`` continues (from round 1 when no checkpoint was
    written). A resumed run keeps its file; the engine rewrites it."""
    from fedshield.sim.checkpoint import atomic_write_text

    out.mkdir(parents=True, exist_ok=True)
    marker = out / "config.toml"
    if not (resume and marker.exists()):
        atomic_write_text(marker, config_text)
    (out / STARTING).unlink(missing_ok=True)  # config.toml now says the same, and more


#: Written by :func:`mark_starting` as soon as the command line is read, before the config
#: is loaded or torch imported; replaced by ``config.toml`` once the checks have passed.
STARTING = ".starting"


def mark_starting(out: Path, argv: list[str]) -> list[Path] | None:
    """The first thing ``fedshield run --out DIR`` does after reading its command line
    (about 0.3 s after launch, seconds before :func:`mark_started`): ``out/.starting``
    holding the command, so a kill during the config checks or torch's import still leaves
    a run that ``--resume`` continues (from round 1). Nothing is written into a folder that
    already holds a run or is not a folder. Returns None when it wrote nothing, else the
    folders it created (innermost first), which :func:`unmark_starting` removes again."""
    if out.exists() and (not out.is_dir() or started(out)):
        return None
    import json

    from fedshield.sim.checkpoint import atomic_write_text

    created = [d for d in (out, *out.parents) if not d.exists()]
    try:
        out.mkdir(parents=True, exist_ok=True)
        atomic_write_text(out / STARTING, json.dumps({"argv": argv}) + "\n")
    except OSError:
        return None  # an unwritable --out is reported by the checks, in one line
    return created


def unmark_starting(out: Path, created: list[Path]) -> None:
    """Undo :func:`mark_starting` after refused input: no marker, and none of the folders
    it created (bad input leaves nothing behind)."""
    (out / STARTING).unlink(missing_ok=True)
    for d in created:
        if d.is_dir() and not any(d.iterdir()):
            d.rmdir()


def started(out: Path) -> bool:
    """Whether ``out`` holds a started run (:func:`mark_starting`, :func:`mark_started`, a
    log or a checkpoint)."""
    return any(
        (out / f).exists() for f in (STARTING, "config.toml", "metrics.jsonl", "checkpoint.pt")
    )


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


__all__ = [
    "RESUMABLE",
    "STARTING",
    "check_run_dir",
    "config_changes",
    "finished",
    "mark_started",
    "mark_starting",
    "started",
    "unmark_starting",
]


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
