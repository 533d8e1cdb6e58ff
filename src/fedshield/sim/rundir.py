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
    config, up to ``rounds`` (a run may be extended) and ``run.*`` (device, threads,
    progress bar: other hardware computes the same run)."""
    import tomllib

    ckpt = out / "checkpoint.pt"
    has_run = (out / "metrics.jsonl").exists() or ckpt.exists()
    if has_run and not resume:
        raise ConfigError(
            f"{out} already holds a run; pass --resume to continue it or choose another --out"
        )
    if not (resume and ckpt.exists()):
        return
    from fedshield.sim.checkpoint import peek_checkpoint

    saved = tomllib.loads(peek_checkpoint(ckpt)["config"])
    now = tomllib.loads(config_text)
    for key in ("rounds", "run"):
        saved.pop(key, None), now.pop(key, None)
    if saved != now:
        diff = sorted(_diff_keys(saved, now))
        raise ConfigError(f"{out}: --resume with a different config (changed: {', '.join(diff)})")


def _diff_keys(a: dict[str, Any], b: dict[str, Any], prefix: str = "") -> set[str]:
    keys = set()
    for k in set(a) | set(b):
        path = f"{prefix}{k}"
        va, vb = a.get(k), b.get(k)
        if isinstance(va, dict) and isinstance(vb, dict):
            keys |= _diff_keys(va, vb, path + ".")
        elif va != vb:
            keys.add(path)
    return keys


__all__ = ["check_run_dir"]


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
