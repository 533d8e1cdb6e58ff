"""Where a result came from: the source commit and the hash of the config that made it.

Every run's ``summary.json`` carries ``provenance`` (:func:`run_provenance`): the fedshield
version, the git commit of the source tree it ran from (and whether that tree had
uncommitted changes), and ``config_sha256``, the SHA-256 of the run's fully resolved
``config.toml``. A sweep writes ``provenance.json`` next to its tables
(:func:`sweep_provenance`): the commits of its runs, each run's config hash, and one hash
over all of them; ``tools/render_results.py --collect`` keeps it beside the result files in
``docs/results/data/`` with the SHA-256 of each file, so a result file that is changed
without its provenance, or a grid whose configs no longer hash the same, is noticed.
"""

from __future__ import annotations

import functools
import hashlib
import platform
import subprocess
import sys
from pathlib import Path
from typing import Any

#: The source tree of this package (a git checkout when installed editable).
SOURCE = Path(__file__).resolve().parent


def sha256_text(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def sha256_file(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@functools.lru_cache(maxsize=1)
def source_commit() -> dict[str, Any]:
    """``{"commit": sha, "dirty": bool}`` of the git checkout this package runs from, or
    ``{"commit": None, "dirty": None}`` outside one (an installed wheel: see the version)."""

    def git(*args: str) -> str | None:
        try:
            res = subprocess.run(
                ["git", "-C", str(SOURCE), *args], capture_output=True, text=True, timeout=10
            )
        except (OSError, subprocess.TimeoutExpired):
            return None
        return res.stdout.strip() if res.returncode == 0 else None

    commit = git("rev-parse", "HEAD")
    if not commit:
        return {"commit": None, "dirty": None}
    status = git("status", "--porcelain", "--untracked-files=no", "--", str(SOURCE))
    return {"commit": commit, "dirty": bool(status) if status is not None else None}


#: /proc/cpuinfo fields that tell CPU generations apart (x86: vendor, family, model,
#: stepping; ARM: implementer, part, variant, revision); the flags / features (what a BLAS
#: dispatches on) enter as a hash.
_CPU_FIELDS = (
    "vendor_id", "cpu family", "model", "model name", "stepping",
    "CPU implementer", "CPU architecture", "CPU variant", "CPU part", "CPU revision",
)  # fmt: skip


def _cpu_model() -> str:
    """The first CPU's identity from /proc/cpuinfo (platform.processor() elsewhere)."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return platform.processor() or "unknown"
    first = text.split("\n\n", 1)[0]
    fields, flags = {}, ""
    for line in first.splitlines():
        key, _, value = (part.strip() for part in line.partition(":"))
        if key in _CPU_FIELDS:
            fields[key] = value
        elif key in ("flags", "Features"):
            flags = value
    parts = [f"{k}={v}" for k, v in fields.items()]
    parts.append(f"flags={sha256_text(flags)[:16]}")
    return "; ".join(parts)


def kernel_signature() -> dict[str, Any]:
    """What decides which float kernels a CPU run uses: the CPU model and architecture,
    torch's version and vectorisation level (ATen's CPU capability), oneDNN, the MKL path
    forced by ``MKL_CBWR``, and the thread count. Two runs with the same signature run the
    same kernels (a result can be compared bit for bit); different ones sum in other orders
    (a result agrees only to a tolerance)."""
    import os

    import torch

    return {
        "cpu": _cpu_model(),
        "machine": platform.machine(),
        "torch": torch.__version__,
        "capability": torch.backends.cpu.get_cpu_capability(),
        "onednn": bool(torch.backends.mkldnn.is_available() and torch.backends.mkldnn.enabled),
        "mkl_cbwr": os.environ.get("MKL_CBWR", ""),
        "threads": torch.get_num_threads(),
    }


def run_provenance(config_text: str, device: str = "cpu") -> dict[str, Any]:
    """The provenance of one run with this resolved config (see the module doc); on CPU
    with the :func:`kernel_signature` it ran under."""
    from fedshield import __version__

    out = {"fedshield": __version__, **source_commit(), "config_sha256": sha256_text(config_text)}
    out["device"] = device
    if device == "cpu":
        out["kernels"] = kernel_signature()
    return out


def combined_sha256(hashes: dict[str, str]) -> str:
    """One hash over named hashes (``name sha`` lines, sorted by name)."""
    return sha256_text("".join(f"{k} {v}\n" for k, v in sorted(hashes.items())))


def sweep_provenance(
    name: str, summaries: list[dict[str, Any]], command: list[str] | None = None
) -> dict[str, Any]:
    """A sweep's provenance from its runs' summaries: every run's config hash and commit
    (a resumed sweep may hold runs of several commits: all are listed), one hash over the
    configs, the command and the platform."""
    import torch

    from fedshield import __version__

    configs, commits, kernels = {}, set(), []
    dirty = False
    for s in summaries:
        prov = s.get("provenance") or {}
        configs[s["name"]] = prov.get("config_sha256")
        commits.add(prov.get("commit"))
        dirty = dirty or bool(prov.get("dirty"))
        if prov.get("kernels") and prov["kernels"] not in kernels:
            kernels.append(prov["kernels"])
    return {
        "grid": name,
        "command": command if command is not None else ["fedshield", *sys.argv[1:]],
        "fedshield": __version__,
        "commits": sorted(c or "unknown" for c in commits),
        "dirty": dirty,
        "config_sha256": combined_sha256({k: v or "" for k, v in configs.items()}),
        "runs": dict(sorted(configs.items())),
        "kernels": kernels,
        "torch": torch.__version__,
        "python": platform.python_version(),
        "machine": platform.machine(),
    }


__all__ = [
    "combined_sha256",
    "kernel_signature",
    "run_provenance",
    "sha256_file",
    "sha256_text",
    "source_commit",
    "sweep_provenance",
]
