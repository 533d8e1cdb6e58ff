"""A bench's output folder as the source of its report: the plan it was run with
(``bench.json``), the run files (``cells/<run>.json``, ``runs/<run>/``), and the report
rendered from them alone.

``bench.json`` keeps what the tables need of the plan — the spec, the tuning candidates,
the settings, the infeasible cells, every run's axes and the SHA-256 of its resolved
config — and the command that produced the folder. A result file counts for a run of the
plan when its config hash is the run's: a run of another commit is kept (the header and
``provenance.json`` name every commit), a run of another config is not. So ``--only``
into a finished folder merges (the tables and plots are re-drawn from every run present),
and ``fedshield bench --render DIR`` re-draws them without running anything.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from fedshield.bench.plan import Plan, Run, Setting
from fedshield.bench.runner import CELLS
from fedshield.bench.spec import BenchSpec
from fedshield.errors import ConfigError

MANIFEST = "bench.json"
VERSION = 1
#: Every file the report writes (removed before it is re-drawn: no stale heat map of a
#: defense or table of an attack no longer present is left beside the new ones).
REPORT_FILES = ("runs.csv", "cells.csv", "worst.csv", "worst.md", "choice.csv", "asr.csv",
                "asr.md", "best.md", "best.png", "steps.csv", "steps.md", "header.md",
                "provenance.json")  # fmt: skip
REPORT_GLOBS = ("heatmap-*.png", "curves-*.png")


def check_out(out: Path, bench: str | None = None) -> None:
    """``--out``: a folder (or nothing yet), and not another bench's; one line otherwise."""
    if out.exists() and not out.is_dir():
        raise ConfigError(f"--out {out}: is a file, not a folder; give a folder for the bench")
    manifest = out / MANIFEST
    if bench is not None and manifest.is_file():
        theirs = _load(manifest).get("spec", {}).get("name")
        if theirs != bench:
            raise ConfigError(
                f"--out {out}: holds bench {theirs!r}, not {bench!r}; give another --out"
            )


def write_manifest(
    p: Plan, out: Path, shas: dict[str, str], command: list[str], only: bool
) -> None:
    """``bench.json`` of the full plan ``p``. A ``--only`` run keeps the command of the run
    that made the folder and is listed under ``updates``."""
    old = _load(out / MANIFEST) if (out / MANIFEST).is_file() else {}
    first = old.get("command") if only and old.get("command") else command
    updates = [*old.get("updates", []), command] if only and old.get("command") else []
    data = {
        "version": VERSION,
        "spec": p.spec.model_dump(mode="json"),
        "tune": p.tune,
        "settings": [_setting(s) for s in p.settings],
        "infeasible": [
            {"defense": d, "setting": _setting(s), "why": why}
            for (d, s), why in p.infeasible.items()
        ],  # fmt: skip
        "runs": [
            {
                "id": r.id,
                "defense": r.defense,
                "attack": r.attack,
                "setting": _setting(r.setting),
                "tune": r.tune,
                "seed": r.seed,
                "placement": r.placement,
                "placement_label": r.placement_label,
                "rounds": int(r.raw.get("rounds", 0)),
                "config_sha256": shas[r.id],
            }
            for r in p.runs
        ],  # fmt: skip
        "command": first,
        "updates": updates,
    }
    out.mkdir(parents=True, exist_ok=True)
    tmp = out / f"{MANIFEST}.tmp"
    # not sort_keys: the spec's tables keep the file's order (heat-map rows, tune candidates)
    tmp.write_text(json.dumps(data, indent=1) + "\n")
    tmp.replace(out / MANIFEST)


def _setting(s: Setting) -> dict[str, Any]:
    return {"share": s.share, "heterogeneity": s.heterogeneity, "fault": s.fault, "mode": s.mode}


def _load(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as err:
        raise ConfigError(f"{path}: not a bench manifest ({err})") from None
    if not isinstance(data, dict) or data.get("version") != VERSION:
        raise ConfigError(f"{path}: not a bench manifest of version {VERSION}")
    return data


def read_manifest(out: Path) -> tuple[Plan, dict[str, str], dict[str, Any]]:
    """The plan recorded in ``out``, each run's config hash, and the manifest itself."""
    if not out.is_dir():
        why = "is a file, not a bench folder" if out.exists() else "no such folder"
        raise ConfigError(f"--render {out}: {why}")
    if not (out / MANIFEST).is_file():
        raise ConfigError(
            f"--render {out}: no {MANIFEST}; not a folder written by `fedshield bench` "
            f"(or one from before {MANIFEST}: run its bench command again)"
        )
    data = _load(out / MANIFEST)
    try:
        spec = BenchSpec.model_validate(data["spec"])
        # a searched attack's runs differ by placement alone (its index is in the run id)
        runs = [Run(r["defense"], r["attack"], Setting(**r["setting"]), r["tune"], r["seed"],
                    {"rounds": r["rounds"]}, r.get("placement"), r.get("placement_label", ""))
                for r in data["runs"]]  # fmt: skip
        shas = {r["id"]: r["config_sha256"] for r in data["runs"]}
        infeasible = {(x["defense"], Setting(**x["setting"])): x["why"]
                      for x in data["infeasible"]}  # fmt: skip
        p = Plan(spec, runs, data["tune"], [Setting(**s) for s in data["settings"]], infeasible)
    except (KeyError, TypeError, ValueError) as err:
        raise ConfigError(f"{out / MANIFEST}: damaged ({type(err).__name__}: {err})") from None
    if any(r.id not in shas for r in runs):
        raise ConfigError(f"{out / MANIFEST}: damaged (run ids do not match their axes)")
    return p, shas, data


def gather(p: Plan, shas: dict[str, str], out: Path) -> dict[str, dict[str, Any]]:
    """The result of every run of ``p`` whose file in ``out/cells`` was made by its config."""
    results = {}
    for r in p.runs:
        try:
            rec = json.loads((out / CELLS / f"{r.id}.json").read_text())
        except (OSError, ValueError):
            continue
        if isinstance(rec, dict) and rec.get("config_sha256") == shas[r.id]:
            results[r.id] = rec
    return results


def narrowed(p: Plan, runs: Sequence[Run]) -> Plan:
    """``p`` with only ``runs``: its defenses, attacks and settings those runs have (the
    protocol's worst case is then over the attacks present)."""
    spec = p.spec.model_copy(update={
        "defenses": [d for d in p.spec.defenses if any(r.defense == d.key for r in runs)],
        "attacks": [a for a in p.spec.attacks if any(r.attack == a.key for r in runs)],
    })  # fmt: skip
    settings = [s for s in p.settings if any(r.setting == s for r in runs)]
    keep = {d.key for d in spec.defenses}
    infeasible = {k: v for k, v in p.infeasible.items() if k[0] in keep and k[1] in settings}
    return replace(p, spec=spec, runs=list(runs), settings=settings, infeasible=infeasible)


def render(out: Path) -> dict[str, Path]:
    """Every table and plot of ``out`` re-drawn from its manifest and run files alone."""
    from fedshield.bench.curves import curves
    from fedshield.bench.render import write_all
    from fedshield.bench.select import select

    full, shas, data = read_manifest(out)
    results = gather(full, shas, out)
    if not results:
        raise ConfigError(f"{out}: no finished run of bench {full.spec.name!r} to render")
    p = narrowed(full, [r for r in full.runs if r.id in results])
    for name in REPORT_FILES:
        (out / name).unlink(missing_ok=True)
    for pattern in REPORT_GLOBS:
        for f in out.glob(pattern):
            f.unlink()
    choices = select(p, results)
    files = write_all(p, choices, results, out, data["command"], data.get("updates", []))
    return files | curves(p, choices, out)


__all__ = ["MANIFEST", "check_out", "gather", "narrowed", "read_manifest", "render",
           "write_manifest"]  # fmt: skip
