"""Run a grid of experiments and write one comparison table (CSV + Markdown) and curves.

A grid file::

    name = "drag-c-sweep"
    base = "drag-mnist5k-dir0.1-cpu"     # a preset, or  file = "my.toml"  (relative path)
    set = ["rounds=30"]                   # overrides applied to every run
    [grid]                                # cartesian product of dotted keys
    "server.aggregator_args.c" = [0.1, 0.2, 0.5]
    [[variant]]                           # named variants (× the grid)
    name = "drag"
    set = ["server.algorithm=drag"]

Runs land in ``<out>/<run name>/``; a sweep that is interrupted resumes where it stopped
(finished runs are kept, unfinished ones continue from their checkpoints).
"""

from __future__ import annotations

import itertools
import json
import os
import tomllib
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

from fedshield import config as cfgmod
from fedshield.errors import ConfigError


@dataclass(frozen=True)
class RunSpec:
    name: str
    raw: dict[str, Any]
    params: dict[str, Any]


def grid_names() -> list[str]:
    files = resources.files(cfgmod.PRESET_PACKAGE).joinpath("grids").iterdir()
    return sorted(f.name[:-5] for f in files if f.name.endswith(".toml"))


def read_grid(path: str | None = None, grid: str | None = None) -> tuple[dict[str, Any], Path]:
    if grid is not None:
        res = resources.files(cfgmod.PRESET_PACKAGE).joinpath("grids", f"{grid}.toml")
        if not res.is_file():
            raise ConfigError(f"unknown grid {grid!r}; known: {', '.join(grid_names())}")
        return tomllib.loads(res.read_text()), Path(".")
    assert path is not None
    return cfgmod.read_toml(path), Path(path).parent


def _overrides(value: Any, key: str) -> list[str]:
    if isinstance(value, list) and all(isinstance(v, str) for v in value):
        return value
    raise ConfigError(f"{key}: expected a list of 'key=value' strings, got {value!r}")


def _fmt(v: Any) -> str:
    return v if isinstance(v, str) else json.dumps(v)


def _short(key: str) -> str:
    """Column/run label of a dotted key: its last part, or the section for ``*.name``."""
    parts = key.split(".")
    return parts[-2] if parts[-1] == "name" and len(parts) > 1 else parts[-1]


def _seeds(value: Any) -> list[int]:
    ok = (
        isinstance(value, list)
        and value
        and all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in value)
    )
    if not ok or len(set(value)) != len(value):
        raise ConfigError(f"grid.seeds: expected a list of distinct seeds >= 0, got {value!r}")
    return list(value)


def expand(
    spec: dict[str, Any], where: Path, seeds: list[int] | None = None
) -> tuple[str, list[RunSpec]]:
    """The runs of a grid file: variants × cartesian grid (× seeds), each a validated config.
    ``seeds`` (``--seeds``) overrides the grid's ``seeds`` key; with seeds every run is
    repeated per seed, named ``<run>_seed=<s>``, and tables report mean ± std and a 95 %
    interval per cell."""
    allowed = {"name", "description", "base", "file", "set", "grid", "variant", "seeds"}
    unknown = sorted(set(spec) - allowed)
    if unknown:
        import difflib

        close = difflib.get_close_matches(unknown[0], sorted(allowed), n=1)
        hint = f"did you mean {close[0]!r}? " if close else ""
        raise ConfigError(
            f"grid: unknown key {unknown[0]!r} ({hint}allowed: {', '.join(sorted(allowed))})"
        )
    if seeds is None and "seeds" in spec:
        seeds = _seeds(spec["seeds"])
    elif seeds is not None:
        seeds = _seeds(seeds)
    name = spec.get("name", "sweep")
    if "file" in spec:
        base = cfgmod.read_toml(where / spec["file"])
    else:
        base = cfgmod.read_preset(spec.get("base", "demo"))
    common = _overrides(spec.get("set", []), "grid.set")
    variants = spec.get("variant", [{"name": ""}])
    grid = spec.get("grid", {})
    if not isinstance(grid, dict) or not all(isinstance(v, list) and v for v in grid.values()):
        raise ConfigError("grid.grid: every entry must be a non-empty list of values")
    keys = list(grid)
    runs: list[RunSpec] = []
    for var in variants:
        extra = set(var) - {"name", "set"}
        if extra:
            raise ConfigError(
                f"grid.variant: unknown key {sorted(extra)[0]!r} (allowed: name, set)"
            )
        vset = _overrides(var.get("set", []), f"grid.variant[{var.get('name', '')}].set")
        for values in itertools.product(*(grid[k] for k in keys)):
            grid_set = [f"{k}={json.dumps(v)}" for k, v in zip(keys, values)]
            label = "_".join(
                [var.get("name", "")] + [f"{_short(k)}={_fmt(v)}" for k, v in zip(keys, values)]
            ).strip("_")
            label = label or name
            params = {"variant": var.get("name", "")} | dict(zip(keys, values))
            for seed in seeds or [None]:
                run_label = label if seed is None else f"{label}_seed={seed}"
                sets = [*common, *vset, *grid_set, f"name={json.dumps(run_label)}"]
                if seed is not None:
                    sets.append(f"seed={seed}")
                raw = cfgmod.apply_overrides(base, sets)
                cfgmod.validate(raw, f"grid run {run_label}")
                run_params = params if seed is None else params | {"seed": seed}
                runs.append(RunSpec(run_label, raw, run_params))
    names = [r.name for r in runs]
    if len(set(names)) != len(names):
        raise ConfigError("grid: two runs share a name; give each variant a distinct name")
    return name, runs


def _run_one(raw: dict[str, Any], out: str, threads: int) -> dict[str, Any]:
    import torch

    from fedshield.cli import run_config

    torch.set_num_threads(threads)
    cfg = cfgmod.validate(raw)
    summary_path = Path(out) / "summary.json"
    if summary_path.exists():
        summary = json.loads(summary_path.read_text())
        if summary.get("rounds") == cfg.rounds:  # finished earlier: keep it
            summary["out"] = out
            return summary
    return run_config(cfg, Path(out), resume=True, quiet=True)


def run_sweep(
    runs: list[RunSpec], out: Path, jobs: int = 1, on_done: Any = None
) -> list[dict[str, Any]]:
    """Run every spec (in ``jobs`` processes) and write the comparison files to ``out``."""
    from fedshield.report import compare_runs

    out.mkdir(parents=True, exist_ok=True)
    threads = max(1, (os.cpu_count() or 1) // max(jobs, 1))
    results: dict[str, dict[str, Any]] = {}
    if jobs <= 1:
        for r in runs:
            results[r.name] = _run_one(r.raw, str(out / r.name), threads)
            if on_done:
                on_done(results[r.name])
    else:
        import multiprocessing as mp

        with ProcessPoolExecutor(jobs, mp_context=mp.get_context("spawn")) as pool:
            futs = {pool.submit(_run_one, r.raw, str(out / r.name), threads): r for r in runs}
            for fut in as_completed(futs):
                results[futs[fut].name] = fut.result()
                if on_done:
                    on_done(results[futs[fut].name])
    ordered = []
    for r in runs:
        s = dict(results[r.name])
        s.update(r.params)
        ordered.append(s)
    compare_runs([out / r.name for r in runs], out, extra=[r.params for r in runs])
    return ordered
