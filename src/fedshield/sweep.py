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
(finished runs are kept, unfinished ones continue from their checkpoints). A run there made
with another config than its cell's (any key but ``rounds`` and ``run.*``) is removed and
run again, with a warning naming the key (:mod:`fedshield.sweep_cells`).

Where the runs execute is a :class:`SweepBackend`: :class:`LocalBackend` (this process, or
``jobs`` local processes) or :class:`fedshield.sweep_ray.RayBackend` (one Ray task per run,
on a local Ray or a cluster). A backend only maps runs to summaries; finished runs are
skipped, resumption and the comparison files are the same for every backend.
"""

from __future__ import annotations

import itertools
import json
import os
import tomllib
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ProcessPoolExecutor, as_completed
from contextlib import contextmanager
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from fedshield import config as cfgmod
from fedshield.errors import ConfigError

if TYPE_CHECKING:
    from fedshield.report import Comparison


@dataclass(frozen=True)
class RunSpec:
    name: str
    raw: dict[str, Any]
    params: dict[str, Any]


def grid_names() -> list[str]:
    files = resources.files(cfgmod.PRESET_PACKAGE).joinpath("grids").iterdir()
    return sorted(f.name[:-5] for f in files if f.name.endswith(".toml"))


def read_grid(path: str | None = None, grid: str | None = None) -> tuple[dict[str, Any], Path]:
    """A grid file's table and the folder its relative paths start from: a bundled grid
    (``--grid NAME``, with a did-you-mean) or a file, which must not be empty."""
    if grid is not None:
        names = grid_names()
        if grid not in names:  # also keeps NAME inside the grids folder ("../demo")
            import difflib

            close = difflib.get_close_matches(grid, names, n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            raise ConfigError(f"--grid: unknown grid {grid!r}{hint}; known: {', '.join(names)}")
        res = resources.files(cfgmod.PRESET_PACKAGE).joinpath("grids", f"{grid}.toml")
        return tomllib.loads(res.read_text()), Path(".")
    assert path is not None
    spec = cfgmod.read_toml(path)
    if not spec:
        raise ConfigError(
            f'{path}: the grid file is empty; set base = "<preset>" or file = "<config>.toml" '
            f"and a [grid] or [[variant]] (or run a bundled one: --grid demo)"
        )
    return spec, Path(path).parent


def _read_base_file(path: Path) -> dict[str, Any]:
    """A grid's ``file`` as :func:`fedshield.config.load` reads a config file: plugin files
    relative to the config file, and an empty file refused."""
    from fedshield.plugins import resolve_plugin_paths

    raw = cfgmod.read_toml(path)
    plugins = raw.get("plugins")
    if isinstance(plugins, list) and all(isinstance(x, str) for x in plugins):
        raw["plugins"] = resolve_plugin_paths(plugins, path.parent)
    if not raw:
        raise ConfigError(
            f"{path} (grid.file): the config is empty; set at least name, rounds, [data] "
            f"dataset and [model] name"
        )
    return raw


def _base(spec: dict[str, Any], where: Path) -> dict[str, Any]:
    """The raw config every run starts from: ``file`` (a config file) or ``base`` (a
    preset, default ``demo``), never both."""
    if "file" in spec and "base" in spec:
        raise ConfigError(
            f"grid: both base ({spec['base']!r}) and file ({spec['file']!r}) are set; "
            f"keep one: base names a preset, file a config file"
        )
    for key in ("file", "base"):
        if key in spec and not (isinstance(spec[key], str) and spec[key].strip()):
            raise ConfigError(f"grid.{key}: expected a non-empty string, got {spec[key]!r}")
    if "file" in spec:
        return _read_base_file(where / spec["file"])
    return cfgmod.read_preset(spec.get("base", "demo"))


def check_run(cfg: cfgmod.ExperimentConfig, label: str, device: bool = True) -> None:
    """The checks ``fedshield run`` does before it loads any data (every component's name,
    parameters, tags and feasibility, the plugins, the device), for one run of a grid.
    ``device=False``: the run goes to other machines (Ray), whose devices this one may not
    have, so ``run.device`` is left to the worker."""
    from fedshield.errors import FedshieldError
    from fedshield.sim.builder import build_components

    if not device:
        cfg = cfg.model_copy(update={"run": cfg.run.model_copy(update={"device": "cpu"})})
    try:
        build_components(cfg)
    except FedshieldError as err:
        raise type(err)(f"grid run {label}: {err}") from None


def _overrides(value: Any, key: str) -> list[str]:
    if isinstance(value, list) and all(isinstance(v, str) for v in value):
        return value
    raise ConfigError(f"{key}: expected a list of 'key=value' strings, got {value!r}")


def _fmt(v: Any) -> str:
    """A grid value in a run name (a folder name: path separators become ``_``)."""
    text = v if isinstance(v, str) else json.dumps(v)
    return text.replace("/", "_").replace("\\", "_")


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
    spec: dict[str, Any], where: Path, seeds: list[int] | None = None, local: bool = True
) -> tuple[str, list[RunSpec]]:
    """The runs of a grid file: variants × cartesian grid (× seeds), each a config checked
    as ``fedshield run`` checks one before loading data (:func:`check_run`), so a bad cell
    fails here, naming its run, and not after the runs before it have trained.
    ``seeds`` (``--seeds``) overrides the grid's ``seeds`` key; with seeds every run is
    repeated per seed, named ``<run>_seed=<s>``, and tables report mean ± std and a 95 %
    interval per cell. ``local=False`` (a Ray sweep): devices are checked by the workers.
    """
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
    run_seeds: Sequence[int | None] = seeds or [None]  # None: one run, the config's seed
    name = spec.get("name", "sweep")
    if not (isinstance(name, str) and name.strip()):
        raise ConfigError(f"grid.name: expected a non-empty string, got {name!r}")
    base = _base(spec, where)
    common = _overrides(spec.get("set", []), "grid.set")
    variants = spec.get("variant", [{"name": ""}])
    if not (
        isinstance(variants, list)
        and variants
        and all(isinstance(v, dict) and isinstance(v.get("name", ""), str) for v in variants)
    ):
        raise ConfigError(
            f"grid.variant: expected one or more [[variant]] tables with a string name, "
            f"got {variants!r}"
        )
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
            for seed in run_seeds:
                run_label = label if seed is None else f"{label}_seed={seed}"
                sets = [*common, *vset, *grid_set, f"name={json.dumps(run_label)}"]
                if seed is not None:
                    sets.append(f"seed={seed}")
                raw = cfgmod.apply_overrides(base, sets)
                check_run(cfgmod.validate(raw, f"grid run {run_label}"), run_label, local)
                run_params = params if seed is None else params | {"seed": seed}
                runs.append(RunSpec(run_label, raw, run_params))
    names = [r.name for r in runs]
    if len(set(names)) != len(names):
        raise ConfigError("grid: two runs share a name; give each variant a distinct name")
    return name, runs


@dataclass(frozen=True)
class RunTask:
    """One run for a backend: its name, validated raw config and output directory."""

    name: str
    raw: dict[str, Any]
    out: str


class SweepBackend(Protocol):
    """Runs sweep tasks somewhere and yields ``(name, summary)`` as each one finishes.
    A task resumes from ``out/checkpoint.pt`` when there is one (``run_one`` does)."""

    def map(self, tasks: Sequence[RunTask]) -> Iterator[tuple[str, dict[str, Any]]]: ...


def finished_summary(raw: dict[str, Any], out: str) -> dict[str, Any] | None:
    """The summary of a run in ``out`` made with this config (:mod:`fedshield.sweep_cells`)
    that already reached its rounds, else None."""
    from fedshield.sweep_cells import cell_changes

    summary_path = Path(out) / "summary.json"
    if not summary_path.exists() or cell_changes(raw, Path(out)):
        return None  # another config's run: run_sweep removed it, run() refuses to resume it
    summary = json.loads(summary_path.read_text())
    cfg = cfgmod.validate(raw)
    stopped = summary.get("status") == "diverged" and cfg.run.on_nonfinite == "stop"
    if summary.get("rounds") != cfg.rounds and not stopped:
        return None
    summary["out"] = out
    return summary


def run_one(
    raw: dict[str, Any], out: str, threads: int, cap_threads: bool = False
) -> dict[str, Any]:
    """Run (or finish, from its checkpoint) one experiment in this process. With
    ``cap_threads`` (parallel local runs) ``run.threads`` is lowered to this run's share of
    the cores: two 2-thread runs on 2 cores oversubscribe them (measured 3-16x slower per
    round for the early-exit ViT preset); the run's config.toml records the value used."""
    import torch

    from fedshield.runner import run

    if cap_threads and int((raw.get("run") or {}).get("threads") or 1) > threads:
        raw = {**raw, "run": {**raw["run"], "threads": threads}}
    torch.set_num_threads(threads)
    done = finished_summary(raw, out)
    if done is not None:
        return done
    return run(cfgmod.validate(raw), Path(out), resume=True, quiet=True)


def check_jobs(jobs: Any) -> int:
    """``-j/--jobs``: a number of parallel local runs, at least 1 (0 or -3 is refused, not
    quietly run as 1)."""
    if isinstance(jobs, bool) or not isinstance(jobs, int) or jobs < 1:
        raise ConfigError(f"-j/--jobs {jobs!r}: expected a number of parallel runs >= 1")
    return jobs


class LocalBackend:
    """This machine: in process (``jobs == 1``) or in ``jobs`` spawned processes, the
    cores split evenly between them. ``task`` runs one task (default :func:`run_one`;
    ``fedshield bench`` passes its own, same signature)."""

    def __init__(self, jobs: int = 1, task: Callable[..., dict[str, Any]] | None = None) -> None:
        self.jobs = check_jobs(jobs)
        self.task = task or run_one

    def map(self, tasks: Sequence[RunTask]) -> Iterator[tuple[str, dict[str, Any]]]:
        threads = max(1, (os.cpu_count() or 1) // self.jobs)
        if self.jobs == 1:
            for t in tasks:
                yield t.name, self.task(t.raw, t.out, threads)
            return
        import multiprocessing as mp

        with ProcessPoolExecutor(self.jobs, mp_context=mp.get_context("spawn")) as pool:
            futs = {pool.submit(self.task, t.raw, t.out, threads, True): t.name for t in tasks}
            for fut in as_completed(futs):
                yield futs[fut], fut.result()


def run_sweep(
    runs: list[RunSpec],
    out: Path,
    jobs: int = 1,
    on_done: Callable[[dict[str, Any]], None] | None = None,
    backend: SweepBackend | None = None,
    name: str | None = None,
    stores: Sequence[Path] = (),
    part: tuple[int, int] | None = None,
    on_todo: Callable[[int], None] | None = None,
) -> Comparison | None:
    """Run every spec on ``backend`` (default: ``jobs`` local processes) and write the
    comparison files to ``out`` with ``provenance.json`` (commits and config hashes of the
    runs; ``name`` is the grid's, default the folder's). Runs made earlier with the same
    config are kept (finished: not run again; unfinished: continued); a run made with
    another config is removed and run again (:mod:`fedshield.sweep_cells`). Returns the
    comparison, whose summaries are in grid order with each run's parameters.

    ``stores`` (run stores, :mod:`fedshield.results`): a run whose cell has a record there
    that counts at this code (replayed first where the code changed) is not run but
    written back as its folder (:func:`fedshield.results.campaign.materialize`), and every
    run made writes its record to ``stores[0]`` as it finishes. ``part=(k, n)``: of the
    runs still missing, only part ``k`` of ``n`` runs (:func:`fedshield.results.campaign.
    part_of`); when others are left for other parts, no comparison is written and None is
    returned. ``on_todo(n)``: called once the ``n`` runs to make are known (before any)."""
    from fedshield.provenance import sweep_provenance
    from fedshield.report import compare_runs
    from fedshield.results.campaign import FROM_STORE
    from fedshield.sim.checkpoint import atomic_write_text, dumps
    from fedshield.sweep_cells import drop_stale_cells, warn_other_code

    if backend is None:
        check_jobs(jobs)  # before the output folder or any run
    out.mkdir(parents=True, exist_ok=True)
    backend = backend if backend is not None else LocalBackend(jobs)
    drop_stale_cells([(r.name, r.raw) for r in runs], out)
    keys, rejected = _from_stores(runs, out, stores, part) if stores else ({}, {})
    results: dict[str, dict[str, Any]] = {}
    todo: list[RunTask] = []
    for r in runs:
        done = finished_summary(r.raw, str(out / r.name))
        if done is None:
            todo.append(RunTask(r.name, r.raw, str(out / r.name)))
        else:
            results[r.name] = done
            if on_done:
                on_done(done)
    warn_other_code([s for s in results.values() if FROM_STORE not in s], out)
    if part is not None:
        from fedshield.results.campaign import part_of

        todo = [t for t in todo if part_of(keys[t.name], part[1]) == part[0]]
    if on_todo:
        on_todo(len(todo))
    with _writing_to(stores[0] if stores else None):
        for run_name, summary in backend.map(todo):  # not `name`: that is the grid's
            results[run_name] = summary
            if on_done:
                on_done(summary)
    if len(results) < len(runs):
        return None  # the other parts' runs are missing
    ordered = []
    for r in runs:
        s = dict(results[r.name])
        s.update(r.params)
        ordered.append(s)
    comparison = compare_runs([out / r.name for r in runs], out, extra=[r.params for r in runs])
    comparison.summaries = ordered
    prov = sweep_provenance(name or out.name, [results[r.name] for r in runs])
    if stores:
        prov["store"] = _store_provenance([results[r.name] for r in runs], rejected)
    atomic_write_text(out / "provenance.json", dumps(prov, indent=2) + "\n")
    return comparison


@contextmanager
def _writing_to(store: Path | None) -> Iterator[None]:
    """``$FEDSHIELD_STORE`` set to ``store`` while runs are made: each run's process (this
    one, a spawned one) writes its record there as it finishes."""
    from fedshield.results.store import STORE_ENV

    before = os.environ.get(STORE_ENV)
    if store is not None:
        os.environ[STORE_ENV] = str(store.resolve())
    try:
        yield
    finally:
        if before is None:
            os.environ.pop(STORE_ENV, None)
        else:
            os.environ[STORE_ENV] = before


def _from_stores(
    runs: list[RunSpec], out: Path, stores: Sequence[Path], part: tuple[int, int] | None
) -> tuple[dict[str, str], dict[str, list[str]]]:
    """Each run's cell key; the runs whose cell has a record that counts written back as
    their folders (a folder written from a record that no longer counts is removed); and,
    per run, the records of its cell that do not count (named in the provenance). With
    ``part``, records needing a replay are replayed by their cell's part only."""
    import shutil

    from fedshield.results.campaign import FROM_STORE, index, lookup, materialize, part_of
    from fedshield.results.store import cell_key

    by_cell = index(*stores)
    keys: dict[str, str] = {}
    rejected: dict[str, list[str]] = {}
    for r in runs:
        folder = out / r.name
        keys[r.name] = key = cell_key(cfgmod.dump(cfgmod.validate(r.raw)))
        summary = folder / "summary.json"
        if summary.exists() and FROM_STORE in json.loads(summary.read_text()):
            shutil.rmtree(folder)  # looked up again: the code may have changed since
        if finished_summary(r.raw, str(folder)) is not None:
            continue
        found = lookup(key, by_cell, replay=part is None or part_of(key, part[1]) == part[0])
        rejected[r.name] = [st.line() for st in found.rejected]
        if found.counted is not None:
            if folder.exists():
                shutil.rmtree(folder)  # an unfinished run: the record replaces it
            materialize(found.counted, folder)
    return keys, rejected


def _store_provenance(
    summaries: list[dict[str, Any]], rejected: dict[str, list[str]]
) -> dict[str, Any]:
    """Which runs came from the store (by status: ``valid``, ``replayed``, with their
    commits) and the records that were left out (stale or unchecked), named."""
    from fedshield.results.campaign import FROM_STORE

    used: dict[str, list[str]] = {}
    for s in summaries:
        if FROM_STORE in s:
            used.setdefault(s[FROM_STORE]["state"], []).append(s["name"])
    return {**used, "left_out": {k: v for k, v in sorted(rejected.items()) if v}}
