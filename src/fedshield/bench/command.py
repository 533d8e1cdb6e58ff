"""The ``fedshield bench`` command: read a bench (file or bundled name), plan its runs
(every config checked before anything trains), run what is not done yet, apply the
protocol and write the tables and heat maps.

    fedshield bench --bench robustness-digits-cpu --out runs/robustness -j 2
    fedshield bench my-bench.toml --only defense=median,attack=ipm
    fedshield bench my-bench.toml --backend ray --cpus-per-run 1
"""

from __future__ import annotations

import argparse
import sys
import tomllib
from importlib import resources
from pathlib import Path
from typing import Any

from fedshield import config as cfgmod
from fedshield.bench.folder import check_out, narrowed, render, write_manifest
from fedshield.bench.plan import Plan, plan
from fedshield.bench.spec import BenchSpec, parse_spec
from fedshield.errors import ConfigError, FedshieldError

PACKAGE = "fedshield.presets.benches"
SELECT_KEYS = ("defense", "attack", "share", "heterogeneity", "fault", "mode", "seed")


def bench_names() -> list[str]:
    files = resources.files(PACKAGE).iterdir()
    return sorted(f.name[:-5] for f in files if f.name.endswith(".toml"))


def read_bench(path: str | None = None, name: str | None = None) -> tuple[BenchSpec, Path]:
    """A bundled bench (``--bench NAME``, did-you-mean) or a bench file, validated."""
    if name is not None:
        names = bench_names()
        if name not in names:
            import difflib

            close = difflib.get_close_matches(name, names, n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            raise ConfigError(f"--bench: unknown bench {name!r}{hint}; known: {', '.join(names)}")
        text = resources.files(PACKAGE).joinpath(f"{name}.toml").read_text()
        return parse_spec(tomllib.loads(text), f"bench {name}"), Path(".")
    assert path is not None
    if Path(path).is_dir():
        raise ConfigError(f"{path}: is a directory; give a bench TOML file")
    raw = cfgmod.read_toml(path)
    return parse_spec(raw, str(path)), Path(path).parent


def parse_only(text: str) -> dict[str, set[str]]:
    """``--only defense=median,attack=ipm`` (a key may repeat: ``attack=ipm,attack=alie``)."""
    out: dict[str, set[str]] = {}
    for item in filter(None, (x.strip() for x in text.split(","))):
        key, sep, value = item.partition("=")
        if not sep or key not in SELECT_KEYS or not value:
            raise ConfigError(
                f"--only {item!r}: expected KEY=VALUE with KEY one of {', '.join(SELECT_KEYS)}"
            )
        out.setdefault(key, set()).add(value)
    return out


def restrict(p: Plan, only: dict[str, set[str]]) -> Plan:
    """The plan's runs that match every ``--only`` key (what runs; the report is drawn from
    every run the folder then has, :func:`fedshield.bench.folder.render`)."""

    def keep(run: Any) -> bool:
        s = run.setting
        vals = {"defense": run.defense, "attack": run.attack, "share": f"{s.share:g}",
                "heterogeneity": s.heterogeneity, "fault": s.fault, "mode": s.mode,
                "seed": str(run.seed)}  # fmt: skip
        for key, allowed in only.items():
            v = vals[key]
            if key == "share":
                allowed = {f"{float(a):g}" for a in allowed if _is_float(a)}
            if v not in allowed:
                return False
        return True

    runs = [r for r in p.runs if keep(r)]
    if not runs:
        raise ConfigError(f"--only: no run of bench {p.spec.name!r} matches {only}")
    return narrowed(p, runs)


def _is_float(x: str) -> bool:
    try:
        float(x)
    except ValueError:
        return False
    return True


def backend_of(args: argparse.Namespace, ray: Any) -> Any:
    """``ray``: the sweep's Ray backend of the same flags (None: local, ``-j`` processes);
    either runs the bench's group task."""
    from fedshield.bench.runner import run_task
    from fedshield.sweep import LocalBackend

    if ray is None:
        return LocalBackend(args.jobs, task=run_task)
    ray.task = run_task
    return ray


def cmd_bench(args: argparse.Namespace, ray: Any, console: Any) -> int:
    """The command; ``ray`` and ``console`` come from :mod:`fedshield.cli` (the sweep's
    backend flags and checks, the CLI's console). Every flag and file is checked before
    anything trains; the report is drawn from the folder's run files
    (:func:`fedshield.bench.folder.render`), so ``--only`` merges into a finished folder."""
    from fedshield.bench.render import worst_table
    from fedshield.bench.runner import config_shas, execute

    if args.list:
        return _list(args, console)
    if args.render is not None:
        return _render_only(args, console)
    if (args.bench_file is None) == (args.bench is None):
        raise FedshieldError("give a bench file or --bench NAME (see `fedshield list benches`)")
    if args.backend == "local":
        from fedshield.sweep import check_jobs

        check_jobs(args.jobs)
    only = parse_only(args.only) if args.only else {}
    spec, where = read_bench(args.bench_file, args.bench)
    if args.out is not None and not args.out.strip():
        raise ConfigError("--out: empty; give a folder (default runs/bench-<name>)")
    out = Path(args.out) if args.out is not None else Path("runs") / f"bench-{spec.name}"
    check_out(out, spec.name)
    full = plan(spec, where)
    p = restrict(full, only) if only else full
    shas = config_shas(full.runs)
    command = ["fedshield", *sys.argv[1:]]
    try:
        write_manifest(full, out, shas, command, bool(only))
    except OSError as err:
        raise ConfigError(f"--out {out}: cannot write there ({err.strerror or err})") from None
    backend = backend_of(args, ray)
    console.print(
        f"bench {spec.name}: {len(p.runs)} runs ({len(p.infeasible)} defense × setting cells "
        f"infeasible) → {out}"
    )
    done = [0]

    def tick(rec: dict[str, Any]) -> None:
        done[0] += 1
        if not args.quiet and (done[0] % 25 == 0 or done[0] == len(p.runs)):
            console.print(f"{done[0]}/{len(p.runs)} runs", highlight=False)

    execute(p.runs, out, backend, args.group, not args.no_lockstep, tick, shas)
    files = render(out)
    console.print(worst_table(files["worst"].parent), highlight=False)
    console.print(
        f"tables and plots in {out} (worst.md, best.md, heatmap-*.png, curves-*.png, runs.csv;"
        f" per run: runs/<run>/config.toml, metrics.csv)"
    )
    return 0


def _render_only(args: argparse.Namespace, console: Any) -> int:
    """``--render DIR``: the tables and plots re-drawn from DIR's run files, nothing run."""
    given = [f for f, v in (("a bench file", args.bench_file), ("--bench", args.bench),
                            ("--out", args.out), ("--only", args.only)) if v]  # fmt: skip
    if given:
        raise ConfigError(f"--render DIR re-draws a finished folder; drop {given[0]}")
    from fedshield.bench.render import worst_table

    files = render(Path(args.render))
    console.print(worst_table(files["worst"].parent), highlight=False)
    console.print(f"tables and plots re-drawn in {args.render}")
    return 0


def _list(args: argparse.Namespace, console: Any) -> int:
    """``--list``: the registered benches and the checkout's measurement scripts, each with
    how to run it (:mod:`fedshield.bench.scripts`, docs/bench.md)."""
    given = [f for f, v in (("a bench file", args.bench_file), ("--bench", args.bench),
                            ("--render", args.render), ("--only", args.only)) if v]  # fmt: skip
    if given:
        raise ConfigError(f"--list lists the benches and runs nothing; drop {given[0]}")
    from rich.table import Table
    from rich.text import Text

    from fedshield.bench.scripts import BENCH_DIR, scripts

    reg = Table(
        title="registered benches — result-producing sweeps of cells: fedshield bench --bench NAME",
        title_justify="left",
    )
    reg.add_column("name")
    reg.add_column("description")
    for name in bench_names():
        reg.add_row(name, Text(read_bench(name=name)[0].description))
    console.print(reg)
    found = scripts()
    if not found:
        console.print(f"measurement scripts: none here (they are the checkout's {BENCH_DIR})")
        return 0
    meas = Table(
        title="measurement scripts — timings and side-by-side checks: python bench/NAME.py "
        "(from the repository root)",
        title_justify="left",
    )
    meas.add_column("script")
    meas.add_column("measures")
    for sc in found:
        meas.add_row(f"bench/{sc.name}", Text(sc.summary))
    console.print(meas)
    return 0


def add_parser(sub: Any, parents: list[argparse.ArgumentParser], func: Any) -> None:
    b = sub.add_parser(
        "bench", parents=parents,
        help="the robustness benchmark: defenses × attacks × shares × heterogeneity × seeds "
        "(--list: these benches and the bench/ measurement scripts)",
    )  # fmt: skip
    b.add_argument("bench_file", nargs="?", help="bench TOML file (or --bench NAME)")
    b.add_argument("--bench", help="a bundled bench (see `fedshield list benches`)")
    b.add_argument("--out", help="output directory (default runs/bench-<name>)")
    b.add_argument(
        "--only",
        help="run a selection, e.g. defense=median,attack=ipm; the tables and plots are "
        "re-drawn from every run in --out (a finished folder keeps its other runs)",
    )
    b.add_argument(
        "--render",
        metavar="DIR",
        help="re-draw the tables and plots of a bench folder from its run files; runs nothing",
    )
    b.add_argument(
        "--list",
        action="store_true",
        help="list the registered benches and the measurement scripts of bench/ (runs nothing)",
    )
    b.add_argument("-j", "--jobs", type=int, default=1, help="parallel processes (local)")
    b.add_argument("--group", type=int, default=24, help="runs trained in lockstep per task")
    b.add_argument("--no-lockstep", action="store_true", help="train run by run (for checks)")
    b.add_argument(
        "--backend",
        choices=("local", "ray"),
        default="local",
        help="where runs execute: this machine (-j processes), or Ray tasks (as sweep)",
    )
    b.add_argument("--address", help="Ray cluster address (default: a local Ray)")
    b.add_argument("--cpus-per-run", type=float, help="Ray: CPUs per task (default 1)")
    b.add_argument("--gpus-per-run", type=float, help="Ray: GPUs per task (default 0)")
    b.add_argument("-q", "--quiet", action="store_true", help="no progress lines")
    b.set_defaults(func=func)


__all__ = ["add_parser", "bench_names", "cmd_bench", "parse_only", "read_bench", "restrict"]
