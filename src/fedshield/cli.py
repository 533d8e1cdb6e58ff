"""``fedshield`` command line: run, list, report, sweep.

Every user error (bad config, missing data, impossible partition) is printed as one line
``error: ...`` on stderr with exit status 2; no traceback.
"""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.progress import Progress
from rich.table import Table

from fedshield.errors import ConfigError, FedshieldError
from fedshield.progress import round_columns

console = Console(stderr=False)


def _out_dir(requested: str | None, name: str, resume: bool) -> Path:
    if requested:
        return Path(requested)
    base = Path("runs") / name
    if resume or not base.exists():
        return base
    i = 2
    while (base.parent / f"{name}-{i}").exists():
        i += 1
    return base.parent / f"{name}-{i}"


def check_set_keys(items: list[str]) -> None:
    """``--set KEY=VALUE``: a KEY with an empty part (``=3``, ``.=3``, ``data..beta``) is
    refused quoting the item, instead of reaching the schema as a key named ""."""
    for item in items:
        if "=" not in item:
            continue  # config.apply_overrides says "expected KEY=VALUE"
        key = item.split("=", 1)[0].strip()
        if not key or any(not part or part != part.strip() for part in key.split(".")):
            raise ConfigError(
                f"--set {item!r}: malformed key {key!r}; expected dotted names, "
                f"e.g. server.aggregator=krum"
            )


def cmd_run(args: argparse.Namespace) -> int:
    from fedshield.sim import rundir

    # A kill from here on leaves a run --resume continues: mark --out before the config is
    # loaded and torch imported (seconds), and unmark it if the input is refused.
    out = Path(args.out) if args.out else None
    created = rundir.mark_starting(out, sys.argv) if out and not args.resume else None
    try:
        return _cmd_run(args)
    except FedshieldError:
        if out and created is not None:
            rundir.unmark_starting(out, created)
        raise


def _cmd_run(args: argparse.Namespace) -> int:
    from fedshield import config as cfgmod
    from fedshield.runner import check_inputs, check_out_dir
    from fedshield.sim.rundir import finished, started

    check_set_keys(args.set or [])
    if args.config is not None and not args.config.strip():
        raise ConfigError("the config path is empty; give an experiment TOML file or --preset")
    if args.config is not None and Path(args.config).is_dir():
        raise ConfigError(f"{args.config}: is a directory; give an experiment TOML file")
    cfg = cfgmod.load(args.config, preset=args.preset, overrides=args.set or [])
    target = _out_dir(args.out, cfg.name, args.resume)
    check_out_dir(target, "--out" if args.out else None)
    if args.resume and not started(target):
        raise FedshieldError(
            f"--resume: no run to resume in {target}: nothing was started there (no "
            ".starting, config.toml, metrics.jsonl or checkpoint.pt: a run killed before it "
            "read its command line leaves none); run it without --resume"
        )
    # Components first (schemas, sizes), then the run directory (a run already there, a
    # corrupt or different checkpoint), which writes the config back: errors before data.
    components = check_inputs(cfg, target, args.resume)
    if not args.quiet:
        print_start(cfg, target, args.resume, args.backend)
    if args.backend == "flower":  # same config on Flower's simulation engine (Ray)
        from fedshield.flower import run_simulation
        from fedshield.progress import RoundProgress

        out = _out_dir(args.out, cfg.name, args.resume)
        quiet = args.quiet or not cfg.run.progress
        verbose = getattr(args, "verbose", False)
        done = args.resume and finished(out, cfg.rounds)  # nothing to train: no 0/N bar
        show = not (quiet or done)
        with RoundProgress(cfg.name, cfg.rounds, console=console, enabled=show) as bar:
            summary = run_simulation(
                cfg, out, args.resume, on_round=bar.on_round, quiet=quiet, verbose=verbose,
                components=components,
            )
        summary["out"] = str(out)
        print_summaries([summary])
        return _exit_status(summary)
    out = _out_dir(args.out, cfg.name, args.resume)
    store = Path(args.store) if args.store else None
    summary = run_config(cfg, out, args.resume, args.quiet, components, store)
    print_summaries([summary])
    return _exit_status(summary)


#: Exit status of a run that diverged (a loss or accuracy turned NaN/inf): not 0, so a
#: script notices; not 2 (bad input) or 1 (a crash).
EXIT_DIVERGED = 3


def _exit_status(summary: dict[str, Any]) -> int:
    if summary.get("status") != "diverged":
        return 0
    from fedshield.sim.outputs import describe_divergence

    print(f"error: {describe_divergence(summary)}", file=sys.stderr)
    return EXIT_DIVERGED


def print_start(cfg: Any, out: Path, resume: bool, backend: str) -> None:
    """One line before the start-up (data, model, and on Flower the Ray engine: seconds to
    tens of seconds with no other output), saying what is being set up and where it goes."""
    d = cfg.data
    what = "resuming" if resume else "starting"
    engine = " on Flower's simulation engine (Ray)" if backend == "flower" else ""
    console.print(
        f"[dim]{what} {cfg.name}{engine}: {d.dataset} over {d.num_clients} clients, "
        f"{cfg.model.name}, {cfg.rounds} rounds → {out} (loading data, building the "
        f"model)[/]",
        highlight=False,
    )


def run_config(
    cfg: Any,
    out: Path,
    resume: bool = False,
    quiet: bool = False,
    components: Any = None,
    store: Path | None = None,
) -> dict[str, Any]:
    """Build and run one experiment with a progress bar (see :func:`fedshield.runner.run`;
    ``components``: those :func:`~fedshield.runner.check_inputs` built for it; ``store``:
    the run store its record goes to)."""
    from fedshield.runner import run

    return run(
        cfg, out, resume=resume, quiet=quiet, console=console, components=components, store=store
    )


def print_summaries(summaries: list[dict[str, Any]], where: bool = True) -> None:
    """The results at the width of the console (:mod:`fedshield.console_summary`): one run's
    accuracy and headline metrics, or a table of runs; with ``where``, the folder(s) the
    runs are in (a report names its own output instead)."""
    from fedshield.console_summary import summary_renderables

    # a line naming a path is printed whole (soft_wrap): rich would break a path wider than
    # the console inside its name, and a copied path must work
    for part in summary_renderables(summaries):
        console.print(part, highlight=False, soft_wrap=isinstance(part, str))
    if not where:
        return
    outs = sorted({str(Path(s["out"]).parent) for s in summaries if s.get("out")})
    if len(summaries) == 1 and summaries[0].get("out"):
        console.print(f"outputs: {summaries[0]['out']}", highlight=False, soft_wrap=True)
    elif outs:
        console.print(f"outputs under: {', '.join(outs)}", highlight=False, soft_wrap=True)


LIST_KINDS = (
    "presets",
    "grids",
    "benches",
    "datasets",
    "partitioners",
    "models",
    "aggregators",
    "pre-aggregators",
    "attacks",
    "client-algorithms",
    "server-algorithms",
    "evaluators",
    "routing-policies",
    "eval-attacks",
    "faults",
    "round-defenses",
)


def _registries() -> dict[str, Any]:
    from fedshield.adversarial.registry import EVAL_ATTACKS
    from fedshield.aggregators.base import AGGREGATORS
    from fedshield.algorithms.client import CLIENT_ALGORITHMS
    from fedshield.algorithms.server import SERVER_ALGORITHMS
    from fedshield.attacks.base import ATTACKS
    from fedshield.crossround import ROUND_DEFENSES
    from fedshield.data import DATASETS, PARTITIONERS
    from fedshield.eval import EVALUATORS
    from fedshield.faults import FAULT_MODELS
    from fedshield.models import MODELS
    from fedshield.preaggregators.base import PRE_AGGREGATORS
    from fedshield.routing import POLICIES
    from fedshield.sim.builder import load_plugins

    load_plugins()
    return {
        "datasets": DATASETS,
        "partitioners": PARTITIONERS,
        "models": MODELS,
        "aggregators": AGGREGATORS,
        "pre-aggregators": PRE_AGGREGATORS,
        "attacks": ATTACKS,
        "client-algorithms": CLIENT_ALGORITHMS,
        "server-algorithms": SERVER_ALGORITHMS,
        "evaluators": EVALUATORS,
        "routing-policies": POLICIES,
        "eval-attacks": EVAL_ATTACKS,
        "faults": FAULT_MODELS,
        "round-defenses": ROUND_DEFENSES,
    }


def cmd_list(args: argparse.Namespace) -> int:
    """One table per kind: each entry's name, its one-sentence description, then its
    parameters as ``key=default`` (TOML literals, what a config would say) and its tags."""
    from pydantic import BaseModel
    from pydantic_core import PydanticUndefined
    from rich.text import Text

    from fedshield.config import preset_names, read_preset

    def literal(value: Any) -> str:
        if value is None:
            return "unset"
        if isinstance(value, bool):
            return "true" if value else "false"
        if isinstance(value, float):  # 0.0 stays a float literal; 8/255 stays short
            return f"{value:.1f}" if value.is_integer() else f"{value:.6g}"
        if isinstance(value, str):
            return f'"{value}"'
        if isinstance(value, tuple | list):
            return "[" + ",".join(literal(v) for v in value) + "]"  # no space: no line break
        if isinstance(value, BaseModel):
            return "{" + ", ".join(f"{k}={literal(v)}" for k, v in value) + "}"
        if isinstance(value, dict):
            return "{" + ", ".join(f"{k}={literal(v)}" for k, v in value.items()) + "}"
        return str(value)

    def params_text(schema: type[BaseModel]) -> str:
        out = []
        for key, field in schema.model_fields.items():
            if field.default is PydanticUndefined and field.default_factory is None:
                out.append(f"{key}=<required>")
            else:
                out.append(f"{key}={literal(field.get_default(call_default_factory=True))}")
        return ", ".join(out)

    def details(entry: Any) -> Text:
        text = Text(entry.help or "(no description)")
        for label, value in (("params", params_text(entry.schema)), ("tags", entry.tag_text)):
            if value:
                text.append(f"\n{label}: ", style="dim")
                text.append(value, style="cyan")
        return text

    kinds = [args.kind] if args.kind else list(LIST_KINDS)
    regs = _registries()
    for kind in kinds:
        table = Table(title=kind, show_header=False, title_justify="left")
        table.add_column("name", style="bold", no_wrap=True)
        table.add_column("description")
        if kind == "presets":
            for name in preset_names():
                table.add_row(name, Text(read_preset(name).get("description", "")))
        elif kind == "grids":
            from fedshield.sweep import grid_names, read_grid

            for name in grid_names():
                table.add_row(name, Text(read_grid(grid=name)[0].get("description", "")))
        elif kind == "benches":
            from fedshield.bench.command import bench_names, read_bench

            for name in bench_names():
                table.add_row(name, Text(read_bench(name=name)[0].description))
        else:
            for entry in regs[kind].entries():
                table.add_row(entry.name, details(entry))
        console.print(table)
    return 0


def cmd_report(args: argparse.Namespace) -> int:
    from fedshield.report import compare_runs
    from fedshield.sim.rundir import check_out_dir

    check_out_dir(Path(args.out), "--out")
    comparison = compare_runs([Path(d) for d in args.dirs], Path(args.out))
    print_summaries(comparison.summaries, where=False)
    for table in comparison.tables:
        console.print(table.rich())
    out = comparison.out
    console.print(
        f"report in {out}: {out / 'comparison.md'}, {out / 'comparison.csv'}, curves "
        f"{comparison.png}"
    )
    return 0


def cmd_sweep(args: argparse.Namespace) -> int:
    from fedshield.results.campaign import parse_part
    from fedshield.sweep import expand, read_grid, run_sweep

    if (args.grid_file is None) == (args.grid is None):
        raise FedshieldError("give a grid file or --grid NAME (see `fedshield list grids`)")
    check_set_keys(args.set or [])
    spec, where = read_grid(args.grid_file, args.grid)
    if args.set:
        given = spec.get("set", [])
        if not isinstance(given, list):
            raise FedshieldError(f"grid.set: expected a list of 'key=value' strings, got {given!r}")
        spec["set"] = [*given, *args.set]
    seeds = None
    # -j is checked before the runs are listed (and before anything is printed)
    if args.backend == "local":
        from fedshield.sweep import check_jobs

        check_jobs(args.jobs)
    if args.seeds is not None:
        seeds = parse_seeds(args.seeds)
    name, runs = expand(spec, where, seeds, local=args.backend != "ray")
    out = Path(args.out) if args.out else Path("runs") / name
    if args.resume and not any((out / r.name).is_dir() for r in runs):
        raise FedshieldError(f"--resume: no sweep to resume in {out} (none of its runs is there)")
    backend = _sweep_backend(args)
    console.print(f"sweep {name}: {len(runs)} runs → {out}")
    show = not args.quiet
    stores = [Path(s) for s in args.store or []]
    part = parse_part(args.part) if args.part else None
    if part is not None and not stores:
        raise FedshieldError("--part needs --store (where the parts' runs are gathered)")
    eta = _Eta(console, enabled=args.quiet and bool(stores))
    with Progress(*round_columns(), console=console, disable=not show) as bar:
        task = bar.add_task(name, total=len(runs), acc="", last="")

        def done(s: dict[str, Any]) -> None:
            bar.update(task, advance=1, acc=f"{s['name']}: {s.get('final_test_acc', 0):.4f}")
            eta.done(s)

        comparison = run_sweep(
            runs, out, jobs=args.jobs, on_done=done, backend=backend, name=name,
            stores=stores, part=part, on_todo=eta.start,
        )  # fmt: skip
    if comparison is None:
        assert part is not None
        console.print(
            f"sweep {name}: part {part[0]}/{part[1]} done ({eta.made} runs made, records in "
            f"{stores[0]}); the grid's tables are written once every part's records are in "
            f"the store (run it again without --part)"
        )
        return 0
    print_summaries(comparison.summaries)
    for table in comparison.tables:
        console.print(table.rich())
    diverged = [s["name"] for s in comparison.summaries if s.get("status") == "diverged"]
    if diverged:
        console.print(
            f"[yellow]{len(diverged)} of {len(runs)} runs diverged (a loss or accuracy turned "
            f"non-finite; status column):[/] {', '.join(diverged)}"
        )
    console.print(
        f"table: {out / 'comparison.md'}  curves: {out / 'accuracy.png'}  "
        f"provenance: {out / 'provenance.json'}"
    )
    return 0


class _Eta:
    """One line per run a quiet sweep with a store makes: how many of how many, the time
    so far and the time left at the mean pace of the runs made."""

    def __init__(self, con: Console, enabled: bool) -> None:
        self.console, self.enabled = con, enabled
        self.todo, self.made, self.t0 = 0, 0, 0.0

    def start(self, todo: int) -> None:
        import time

        self.todo, self.t0 = todo, time.monotonic()
        if self.enabled:
            self.console.print(f"{todo} runs to make", highlight=False)

    def done(self, s: dict[str, Any]) -> None:
        import time

        if not self.todo:  # kept or from the store: before any run is made
            return
        self.made += 1
        if not self.enabled:
            return
        spent = time.monotonic() - self.t0
        left = spent / self.made * (self.todo - self.made)
        self.console.print(
            f"[{self.made}/{self.todo}] {s['name']}: {s.get('final_test_acc', 0):.4f}  "
            f"{spent / 60:.1f} min, ETA {left / 60:.1f} min",
            highlight=False,
        )


def parse_seeds(text: str) -> list[int]:
    """``--seeds 0,1,2``: a non-empty list of integers (``--seeds ''`` ran the whole grid
    without seeds; ``1,,2`` or ``x`` are refused, not dropped)."""
    parts = [x.strip() for x in text.split(",")]
    try:
        seeds = [int(x) for x in parts]
    except ValueError:
        seeds = []
    if not seeds:
        raise FedshieldError(f"--seeds {text!r}: expected seeds separated by commas, e.g. 0,1,2")
    return seeds


def _sweep_backend(args: argparse.Namespace) -> Any:
    """The sweep backend of ``--backend`` (None: the local one with ``-j`` processes)."""
    ray_only = {"--address": args.address, "--cpus-per-run": args.cpus_per_run}
    ray_only["--gpus-per-run"] = args.gpus_per_run
    if args.backend == "local":
        given = [flag for flag, value in ray_only.items() if value is not None]
        if given:
            raise FedshieldError(f"{given[0]} needs --backend ray")
        return None
    if args.jobs != 1:
        raise FedshieldError(
            "-j/--jobs is for --backend local; on Ray the cluster's resources decide how "
            "many runs go at once (see --cpus-per-run, --gpus-per-run)"
        )
    from fedshield.sweep_ray import RayBackend

    cpus = 1.0 if args.cpus_per_run is None else args.cpus_per_run
    gpus = 0.0 if args.gpus_per_run is None else args.gpus_per_run
    return RayBackend(args.address, cpus=cpus, gpus=gpus)


def _source_arguments(
    p: argparse.ArgumentParser,
    file: tuple[str, str],
    named: tuple[str, str],
    *,
    set_help: str,
    out_help: str,
    resume_help: str,
) -> None:
    """What ``run`` and ``sweep`` both take: a TOML file or a bundled one by name (each
    ``(argument, help)``), ``--set`` overrides, ``--out`` and ``--resume``."""
    p.add_argument(file[0], nargs="?", help=file[1])
    p.add_argument(named[0], help=named[1])
    p.add_argument("--set", action="append", metavar="KEY=VALUE", help=set_help)
    p.add_argument("--out", help=out_help)
    p.add_argument("--resume", action="store_true", help=resume_help)


def _verbose_parent(help: str) -> argparse.ArgumentParser:
    """``-v`` after the subcommand (``fedshield run -v``), with the subcommand's own help;
    SUPPRESS keeps a ``-v`` given before it."""
    parent = argparse.ArgumentParser(add_help=False)
    parent.add_argument(
        "-v", "--verbose", action="store_true", default=argparse.SUPPRESS, help=help
    )
    return parent


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="fedshield", description=__doc__.splitlines()[0])
    p.add_argument(
        "-v", "--verbose", action="store_true", help="log round-level events (run, sweep)"
    )
    # -v is also accepted after the subcommand (`fedshield run -v`); SUPPRESS keeps a -v
    # given before it.
    verbose = _verbose_parent("log round-level events (rejected uploads, resumes, degraded rules)")
    # list and report run no rounds: -v is accepted there but has nothing more to log.
    quiet_verbose = _verbose_parent("accepted, no effect here (run and sweep log round events)")
    sub = p.add_subparsers(dest="command")

    r = sub.add_parser(
        "run", parents=[verbose], help="run one experiment (default: the demo preset)"
    )
    _source_arguments(
        r,
        ("config", "experiment TOML file (default: --preset demo)"),
        ("--preset", "a bundled preset (see `fedshield list presets`)"),
        set_help="override a config key, e.g. --set server.aggregator=krum (repeatable)",
        out_help="output directory (default runs/<name>, or runs/<name>-N)",
        resume_help="continue the run in --out from its last checkpoint (after a crash or "
        "Ctrl-C)",
    )
    r.add_argument(
        "--backend", choices=("sim", "flower"), default="sim",
        help="sim: the in-process simulator (default); flower: Flower's Ray simulation",
    )  # fmt: skip
    r.add_argument("-q", "--quiet", action="store_true", help="no progress bar")
    r.add_argument(
        "--store", metavar="DIR",
        help="run store that gets the finished run's record (docs/results-store.md; "
        "default $FEDSHIELD_STORE, none when unset)",
    )  # fmt: skip
    r.set_defaults(func=cmd_run)

    ls = sub.add_parser(
        "list", parents=[quiet_verbose], help="list presets and registered components"
    )
    ls.add_argument(
        "kind", nargs="?", choices=LIST_KINDS, metavar="KIND",
        help=f"only this kind: {', '.join(LIST_KINDS)} (default: all)",
    )  # fmt: skip
    ls.set_defaults(func=cmd_list)

    rep = sub.add_parser(
        "report", parents=[quiet_verbose],
        help="compare runs: a table and overlaid accuracy curves",
    )  # fmt: skip
    rep.add_argument("dirs", nargs="+", help="run directories (each with a metrics.jsonl)")
    rep.add_argument(
        "--out", default="report",
        help="directory for comparison.md/.csv and accuracy.png (default ./report)",
    )  # fmt: skip
    rep.set_defaults(func=cmd_report)
    sw = sub.add_parser(
        "sweep", parents=[verbose],
        help="run a grid of configs; one comparison table + curves",
    )  # fmt: skip
    _source_arguments(
        sw,
        ("grid_file", "grid TOML file (or --grid NAME)"),
        ("--grid", "a bundled grid (see `fedshield list grids`)"),
        set_help="override a config key in every run of the grid (repeatable)",
        out_help="output directory (default runs/<grid name>)",
        resume_help="continue the sweep in --out: finished runs are kept, unfinished ones "
        "continue from their checkpoints (running the same command again does the same)",
    )
    sw.add_argument("-j", "--jobs", type=int, default=1, help="parallel processes (local)")
    sw.add_argument(
        "--seeds", help="repeat every run for these seeds, e.g. 0,1,2 (cells: mean ± 95%% CI)"
    )
    sw.add_argument(
        "--backend",
        choices=("local", "ray"),
        default="local",
        help="where runs execute: this machine, or one Ray task per run (docs/deployment.md)",
    )
    sw.add_argument(
        "--address", help="Ray cluster: auto, HOST:6379 or ray://HOST:10001 (default: a local Ray)"
    )
    sw.add_argument("--cpus-per-run", type=float, help="Ray: CPUs per run (default 1)")
    sw.add_argument("--gpus-per-run", type=float, help="Ray: GPUs per run (default 0)")
    sw.add_argument("-q", "--quiet", action="store_true", help="no progress bar")
    sw.add_argument(
        "--store", action="append", metavar="DIR",
        help="run store (docs/results-store.md): runs with a record there that counts at "
        "this code are not run again; each run made writes its record to the first",
    )  # fmt: skip
    sw.add_argument(
        "--part", metavar="K/N", help="of the runs missing from --store, make part K of N"
    )
    sw.set_defaults(func=cmd_sweep)
    from fedshield.bench.command import add_parser as add_bench

    add_bench(sub, [verbose], cmd_bench)
    from fedshield.search.command import add_parser as add_recommend

    add_recommend(sub, [verbose], cmd_recommend)
    from fedshield.results.__main__ import add_arguments as add_results

    res = sub.add_parser(
        "results", parents=[quiet_verbose],
        help="the run store's records at this code (status, replay: docs/results-store.md) "
        "and the results pages made from them (page, render, paired, curves: "
        "docs/results/index.md)",
    )  # fmt: skip
    add_results(res)
    res.set_defaults(func=cmd_results)
    return p


def cmd_recommend(args: argparse.Namespace) -> int:
    """``fedshield recommend`` (:mod:`fedshield.search.command`)."""
    from fedshield.search.command import cmd_recommend as run

    return run(args, console)


def cmd_results(args: argparse.Namespace) -> int:
    from fedshield.results.__main__ import run

    return run(args)


def cmd_bench(args: argparse.Namespace) -> int:
    """``fedshield bench`` (:mod:`fedshield.bench.command`) with the sweep's backend flags."""
    from fedshield.bench.command import cmd_bench as run

    if args.group < 1:  # before Ray is started
        raise FedshieldError(f"--group {args.group}: expected a number of runs >= 1")
    return run(args, _sweep_backend(args), console)


def _interrupted(args: argparse.Namespace) -> str:
    """What to type to continue after Ctrl-C, for the command that was interrupted."""
    if args.command == "sweep":
        return (
            "interrupted; to continue, run the same sweep command again (or add --resume): "
            "finished runs are kept, unfinished ones continue from their checkpoints"
        )
    if args.command in (None, "run"):
        return "interrupted; continue with the same command and --resume"
    return "interrupted"


def main(argv: list[str] | None = None) -> int:
    global console
    console = Console(stderr=False)  # the terminal's width as of this command (COLUMNS)
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command is None:  # plain `fedshield` behaves like `fedshield run`
        args = parser.parse_args(["run", *(argv or [])])
    logging.basicConfig(
        level=logging.INFO if args.verbose else logging.WARNING, format="%(levelname)s %(message)s"
    )
    statement = logging.getLogger("fedshield.statement")  # builder.py's recommendation line
    level = statement.level
    if args.command == "run" and not getattr(args, "quiet", False):
        statement.setLevel(logging.INFO)
    try:
        return args.func(args)
    except FedshieldError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(_interrupted(args), file=sys.stderr)
        return 130
    finally:  # for this command only: a later sweep in the same process stays quiet
        statement.setLevel(level)


if __name__ == "__main__":
    sys.exit(main())
