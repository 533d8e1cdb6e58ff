"""Render the results tables of README.md and docs/**/*.md from committed result files.

Tables are never typed by hand: a document holds marker blocks

    <!-- fedshield:table source=docs/results/data/brdrag-attacks-20-cpu-cells.csv
         pivot=variant,attack.name value=final_test_acc -->
    (generated)
    <!-- fedshield:end -->

and this script replaces what lies between the markers by the table computed from
``source`` (a sweep's ``comparison.csv`` or ``cells.csv``, copied under docs/results/data/ by
``--collect``). Options of a block:

* ``pivot=ROW,COL`` — a ROW × COL table of ``value``; or ``columns=a,b,c`` — those columns;
* ``value=KEY`` — the metric (default ``final_test_acc``); from a cells file a cell reads
  ``mean ± h [min, max]`` with h the half-width of the 95 % Student-t interval over the
  seeds and the lowest and highest seed in brackets (when the file has them: a collapsed
  seed must show); ``spread=seeds`` lists every seed's value instead, ``spread=none``
  drops the brackets;
* ``where=KEY:V1|V2`` — keep only rows whose KEY is one of the values (repeatable, ``;``);
* ``digits=N`` — decimals (default 3);
* ``include=FILE`` (with optional ``lines=A-B``) — a benchmark's saved output, verbatim, in
  a code block; ``text=FILE`` — a Markdown file as it is (a bench's ``header.md``: commit,
  command, attack mode, faults);
* ``worst=ROW,OVER`` with ``source=a.csv,b.csv`` and ``labels=A,B`` — per ROW value, the
  lowest mean of ``value`` over OVER in each source, with the OVER value where it occurs
  (e.g. a defense's worst case over the attacks at each Byzantine share);
* ``page=NAME`` — the page's header: its jobs in ``docs/results/pages.toml``, the commit
  each job's data was made at (its provenance) and ``make results PAGE=NAME``
  (``tools/results.py``);
* ``paired=A,B`` with ``source=<a sweep's per-run comparison CSV>`` and ``value=m1,m2`` —
  variant A minus B paired by seed, per metric: mean ± 95 % t interval, every seed's
  difference, the sign test and "undecided" where the interval covers zero
  (``tools/paired.py``; ``by=KEY`` pairs within each KEY value too, ``scale=100`` points;
  ``variant=COLUMN`` names the variants' column, e.g. ``defense`` in a bench's runs.csv,
  and ``where=`` applies as for tables).

    python tools/render_results.py                 # rewrite every block in place
    python tools/render_results.py --check         # exit 1 if a document is out of date
    python tools/render_results.py --collect runs/brdrag-attacks-20-cpu  # copy its CSVs only
    python tools/render_results.py --collect-bench runs/bench-robustness-digits-cpu

Every result file records what produced it: ``--collect`` writes beside the CSVs
``<name>.provenance.json`` — the sweep's ``provenance.json`` (the commits its runs ran from,
each run's config hash and one hash over them, the command) plus the SHA-256 of every file
it covers. :func:`check_provenance` (``--check`` and tests/test_docs.py) refuses a result
file without such a record or changed since it was collected.

A table with ``mean ± h`` cells is followed by the line :data:`PM_NOTE`, so ``±`` says what
it is wherever it is rendered.

``--collect`` also writes ``<sweep>-rounds.csv`` when the runs logged evaluator metrics in
more than the last round (``eval.metrics_every``): per cell and round, the mean, interval,
min and max over the seeds of the robust and per-group accuracies, for curves that show
when rankings cross (``pivot=round,variant value=robust/worst``); and ``<sweep>-budget.csv``,
the same metrics per run and round, so that ``paired=A,B by=round`` gives the paired
verdict at every budget and ``tools/curves.py`` draws them with a band over the
seeds.
"""

from __future__ import annotations

import argparse
import csv
import hashlib
import importlib.util
import json
import re
import shutil
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "docs" / "results" / "data"
BLOCK = re.compile(
    r"(<!-- fedshield:table (?P<opts>.*?)-->\n)(?P<body>.*?)(<!-- fedshield:end -->)", re.S
)


#: The label under every rendered table with ``±`` cells (the same words as fedshield's
#: own cells tables, ``fedshield.report.PM_NOTE``).
PM_NOTE = "± : half-width of the 95 % Student-t interval over the seeds (n_seeds)"
PROVENANCE = ".provenance.json"


def parse_opts(text: str) -> dict[str, str]:
    return dict(item.split("=", 1) for item in text.split() if "=" in item)


def _rows(source: Path, where: str | None) -> list[dict[str, str]]:
    rows = list(csv.DictReader(source.open()))
    for cond in (where or "").split(";"):
        if not cond:
            continue
        key, _, values = cond.partition(":")
        allowed = set(values.split("|"))
        rows = [r for r in rows if r.get(key) in allowed]
    return rows


def _diverged(row: dict[str, str]) -> str:
    """``diverged (seed …)`` for a cell with diverged runs, ``diverged`` for a diverged run
    ("" when none)."""
    from fedshield.report import diverged_label

    if label := diverged_label(row):
        return label
    count = row.get("diverged_seeds", "") if "n_diverged" not in row else ""
    if count.isdigit() and int(count) > 0:  # a bench's cells.csv counts them
        return f"diverged ({count} of {row.get('n_seeds', '?')} seeds)"
    return ""


#: Columns of a per-run row that describe how the run ended, not a result of it.
RUN_STATE = ("rounds", "status", "diverged_round")


def _measured(row: dict[str, str], column: str) -> bool:
    """Whether ``column`` of ``row`` is a measurement rather than a run's parameter
    (``data.beta``, ``seed``): in a cells row (``n_seeds``), a metric with statistics
    (``<metric>_n`` or ``_mean``); in a per-run row, a column after its parameters — those
    come first, before ``rounds`` (a sweep's comparison.csv, fedshield.report) or
    ``status`` (a bench's runs.csv, fedshield.bench.render)."""
    if "n_seeds" in row:
        return f"{column}_n" in row or f"{column}_mean" in row
    cols = list(row)
    first = next((i for i, c in enumerate(cols) if c in ("rounds", "status")), len(cols))
    return column in cols[first:] and column not in RUN_STATE


def _cell(row: dict[str, str], value: str, digits: int, spread: str = "minmax") -> str:
    """A table cell; a diverged run's measurement (or a cell's, with diverged seeds) is shown
    as diverged, never as the numbers it stopped at; the other seeds' statistics
    follow. Its parameters read as they are."""
    bad = _diverged(row) if _measured(row, value) else ""
    if bad:
        rest = _cell_value(row, value, digits, spread) if bad != "diverged" else ""
        return bad if rest in ("", "-") else f"{bad}; others {rest}"
    return _cell_value(row, value, digits, spread)


def _cell_value(row: dict[str, str], value: str, digits: int, spread: str = "minmax") -> str:
    mean, half = row.get(f"{value}_mean"), row.get(f"{value}_ci95")
    if mean not in (None, ""):
        m = float(mean)
        h = float(half) if half not in (None, "", "nan") else float("nan")
        text = f"{m:.{digits}f}" if h != h else f"{m:.{digits}f} ± {h:.{digits}f}"
        lo, hi, seeds = row.get(f"{value}_min"), row.get(f"{value}_max"), row.get(f"{value}_seeds")
        if h != h or spread == "none":
            return text
        if spread == "seeds" and seeds:
            vals = [f"{float(v.split(':')[1]):.{digits}f}" for v in seeds.split()]
            return f"{text} ({', '.join(vals)})"
        if lo not in (None, "") and hi not in (None, ""):
            return f"{text} [{float(lo):.{digits}f}, {float(hi):.{digits}f}]"
        return text
    v = row.get(value, "")
    if v.lstrip("-").isdigit():  # counts stay integers
        return v
    try:
        return f"{float(v):.{digits}f}"
    except ValueError:
        return v or "-"


def _mean(row: dict[str, str], value: str) -> float | None:
    for key in (f"{value}_mean", value):
        try:
            return float(row[key])
        except (KeyError, ValueError):
            continue
    return None


def render_worst(opts: dict[str, str], root: Path) -> str:
    rk, over = opts["worst"].split(",")
    value = opts.get("value", "final_test_acc")
    digits = int(opts.get("digits", "3"))
    sources = opts["source"].split(",")
    labels = opts.get("labels", opts["source"]).split(",")
    if len(labels) != len(sources):
        raise SystemExit(f"worst={opts['worst']}: {len(labels)} labels for {len(sources)} sources")
    tables = [_rows(root / s, opts.get("where")) for s in sources]
    rkeys = list(dict.fromkeys(r[rk] for t in tables for r in t))
    lines = [f"| {rk} | " + " | ".join(labels) + " |", "|---" * (len(labels) + 1) + "|"]
    for a in rkeys:
        cells = []
        for t in tables:
            rows = [r for r in t if r[rk] == a]
            bad = [r[over] for r in rows if _diverged(r)]
            if bad:  # a diverged cell is the worst case, whatever its other seeds read
                cells.append(f"diverged ({', '.join(bad)})")
                continue
            vals = [(m, r[over]) for r in rows if (m := _mean(r, value)) is not None]
            if not vals:
                cells.append("-")
                continue
            m, where = min(vals)
            cells.append(f"{m:.{digits}f} ({where})")
        lines.append(f"| {a} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def render_include(opts: dict[str, str], root: Path) -> str:
    text = (root / opts["include"]).read_text().splitlines()
    if "lines" in opts:
        a, _, b = opts["lines"].partition("-")
        text = text[int(a) - 1 : int(b or a)]
    return "```\n" + "\n".join(text) + "\n```\n"


def _tool(name: str) -> Any:
    """A sibling module of tools/ (this script is run by path, not as a package)."""
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, Path(__file__).with_name(f"{name}.py"))
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod  # dataclasses look their module up there
    spec.loader.exec_module(mod)
    return mod


def render(opts: dict[str, str], root: Path = ROOT) -> str:
    """A block's body from the files under ``root``; ``SystemExit`` naming the file when one
    it reads is not there (``render_document`` reports it)."""
    if "page" in opts:
        return _tool("results").render_header(opts["page"], root)
    for f in [*opts.get("source", "").split(","), opts.get("text", ""), opts.get("include", "")]:
        if f and not (root / f).exists():
            raise SystemExit(f"{f}: no such result file")
    if "text" in opts:
        return (root / opts["text"]).read_text()
    if "include" in opts:
        return render_include(opts, root)
    if "worst" in opts:
        return render_worst(opts, root)
    if "paired" in opts:
        return _tool("paired").render_paired(opts, root, lambda p: _rows(p, opts.get("where")))
    source = root / opts["source"]
    rows = _rows(source, opts.get("where"))
    value = opts.get("value", "final_test_acc")
    digits = int(opts.get("digits", "3"))
    spread = opts.get("spread", "minmax")
    if "pivot" in opts:
        rk, ck = opts["pivot"].split(",")
        rkeys = list(dict.fromkeys(r[rk] for r in rows))
        ckeys = list(dict.fromkeys(r[ck] for r in rows))
        cell = {(r[rk], r[ck]): _cell(r, value, digits, spread) for r in rows}
        lines = [f"| {rk} \\ {ck} | " + " | ".join(ckeys) + " |", "|---" * (len(ckeys) + 1) + "|"]
        for a in rkeys:
            lines.append(f"| {a} | " + " | ".join(cell.get((a, b), "-") for b in ckeys) + " |")
    else:
        cols = opts.get("columns", f"label,{value}").split(",")
        lines = ["| " + " | ".join(cols) + " |", "|---" * len(cols) + "|"]
        for r in rows:
            vals = [
                _cell(r, c, digits, spread)
                if (f"{c}_mean" in r or _is_float(r.get(c)))
                else r.get(c, "")
                for c in cols
            ]
            lines.append("| " + " | ".join(vals) + " |")
    return _labelled(lines)


def _labelled(lines: list[str]) -> str:
    """The table, followed by :data:`PM_NOTE` when a cell holds ``±``."""
    text = "\n".join(lines) + "\n"
    return text + f"\n{PM_NOTE}\n" if any(" ± " in line for line in lines[2:]) else text


def _is_float(v: str | None) -> bool:
    try:
        float(v)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return False
    return True


def render_document(text: str, missing: list[str] | None = None, root: Path = ROOT) -> str:
    """Every block re-rendered from the result files under ``root`` (another folder with the
    repository's layout: ``tools/results.py --out``). With ``missing`` (a list), a block
    whose result file is not there yet keeps its body and the file is appended to
    ``missing``; without, it raises."""

    def repl(m: re.Match[str]) -> str:
        try:
            body = render(parse_opts(m.group("opts")), root)
        except SystemExit as err:
            if missing is None:
                raise
            missing.append(str(err))
            body = m.group("body")
        return m.group(1) + body + m.group(4)

    return BLOCK.sub(repl, text)


def documents() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def collect(sweep_dir: Path, data: Path = DATA) -> list[Path]:
    """Copy a sweep's comparison.csv (and cells.csv, curves.csv) to
    docs/results/data/<name>[-cells|-curves].csv with ``<name>.provenance.json``: the
    sweep's provenance.json and the files' SHA-256."""
    prov_file = sweep_dir / "provenance.json"
    if not prov_file.exists():
        raise SystemExit(
            f"{prov_file}: missing; re-run the sweep with this version of fedshield (it "
            f"records the commit and config hashes that produced the results)"
        )
    data.mkdir(parents=True, exist_ok=True)
    out = []
    for src, suffix in (("comparison.csv", ""), ("cells.csv", "-cells"), ("curves.csv", "-curves")):
        if (sweep_dir / src).exists():
            dst = data / f"{sweep_dir.name}{suffix}.csv"
            shutil.copyfile(sweep_dir / src, dst)
            out.append(dst)
    for suffix, (rows, cols) in (("-rounds", round_rows(sweep_dir)),
                                 ("-budget", budget_rows(sweep_dir))):  # fmt: skip
        if rows:
            dst = data / f"{sweep_dir.name}{suffix}.csv"
            with dst.open("w", newline="") as fh:
                w = csv.DictWriter(fh, fieldnames=cols, extrasaction="ignore")
                w.writeheader()
                w.writerows(rows)
            out.append(dst)
    prov = json.loads(prov_file.read_text())
    prov["files"] = {p.name: _sha256(p) for p in out}
    side = data / f"{sweep_dir.name}{PROVENANCE}"
    side.write_text(json.dumps(prov, indent=2, sort_keys=True) + "\n")
    return [*out, side]


#: The files of a ``fedshield bench`` output that are results (copied as
#: ``bench-<name>-<file>``); the per-run JSON files stay in the run folder.
BENCH_FILES = ("worst.csv", "asr.csv", "cells.csv", "runs.csv", "choice.csv", "best.md",
               "header.md", "steps.csv", "steps.md")  # fmt: skip


def collect_bench(bench_dir: Path, data: Path = DATA) -> list[Path]:
    """Copy a ``fedshield bench`` output's tables to docs/results/data/bench-<name>-*.{csv,md}
    with ``bench-<name>.provenance.json``: the bench's provenance.json (commits, each run's
    config hash, the command, attack modes, faults) and the files' SHA-256."""
    prov_file = bench_dir / "provenance.json"
    if not prov_file.exists():
        raise SystemExit(f"{prov_file}: missing; is {bench_dir} a `fedshield bench` output?")
    prov = json.loads(prov_file.read_text())
    name = f"bench-{prov['bench']}"
    data.mkdir(parents=True, exist_ok=True)
    out = []
    for f in BENCH_FILES:
        if (bench_dir / f).exists():
            dst = data / f"{name}-{f}"
            shutil.copyfile(bench_dir / f, dst)
            out.append(dst)
    prov["files"] = {p.name: _sha256(p) for p in out}
    prov.setdefault("grid", name)  # what check_provenance matches a sidecar's runs against
    side = data / f"{name}{PROVENANCE}"
    side.write_text(json.dumps(prov, indent=2, sort_keys=True) + "\n")
    return [*out, side]


#: Data files that record their own origin row by row (tools/results.py appends
#: each grid's wall time with its commit): no sidecar needed.
SELF_RECORDING = frozenset({"campaign-times.csv"})


def check_provenance(data: Path = DATA) -> list[str]:
    """What is wrong with the provenance of the result files in ``data``: a file no
    ``*.provenance.json`` covers, one changed since it was recorded (another SHA-256), a
    record without a commit or a config hash, a sweep's record whose ``grid`` is neither a
    bundled grid nor the file's own name (it used to name the last run to finish).
    Empty: every file records its origin."""
    from fedshield.sweep import grid_names

    grids = set(grid_names())
    problems = []
    covered: dict[str, str] = {}
    for side in sorted(data.glob(f"*{PROVENANCE}")):
        prov = json.loads(side.read_text())
        if not prov.get("commits") or not prov.get("config_sha256"):
            problems.append(f"{side.name}: no commit or config hash")
        stem = side.name.removesuffix(PROVENANCE)
        if prov.get("runs") and prov.get("grid") not in grids | {stem}:
            problems.append(
                f"{side.name}: grid {prov.get('grid')!r} is neither a bundled grid nor {stem!r}"
            )
        for name, digest in prov.get("files", {}).items():
            covered[name] = side.name
            f = data / name
            if not f.exists():
                problems.append(f"{side.name}: names {name}, which is not there")
            elif _sha256(f) != digest:
                problems.append(
                    f"{name}: changed since {side.name} recorded it; collect it again "
                    f"(python tools/render_results.py --collect <sweep dir>)"
                )
    for f in sorted(data.iterdir()):
        skip = f.name.endswith(PROVENANCE) or f.name in SELF_RECORDING
        if not skip and f.name not in covered:
            problems.append(f"{f.name}: no *{PROVENANCE} records the commit and config")
    return problems


#: Per-round metrics kept in <sweep>-rounds.csv.
ROUND_KEYS = re.compile(
    r"^(robust/(natural|fgsm|pgd20|cw|aa|worst)|groups/minority/(natural|pgd20|worst))$"
)


def _run_records(sweep_dir: Path) -> tuple[list[str], list[tuple[dict[str, str], list[dict]]]]:
    """The parameter columns of a sweep's comparison.csv (seed included) and, per run whose
    metrics.jsonl is there, its row and its per-round records."""
    comp = sweep_dir / "comparison.csv"
    if not comp.exists():
        return [], []
    runs = list(csv.DictReader(comp.open()))
    fixed = ("label", "name", "rounds", "final_test_acc", "best_test_acc", "best_round",
             "rounds_to_target")  # fmt: skip
    keys = [k for k in (runs[0] if runs else {}) if k not in fixed and "/" not in k]
    out = []
    for run in runs:
        path = sweep_dir / run["label"] / "metrics.jsonl"
        if path.exists():
            lines = path.read_text().splitlines()
            out.append((run, [json.loads(line) for line in lines if line.strip()]))
    return keys, out


def budget_rows(sweep_dir: Path) -> tuple[list[dict[str, object]], list[str]]:
    """Per run and evaluated round (a verdict per budget, docs/results/fedcart.md): the run's
    parameters, its seed, the round, ``test_acc`` and every ``ROUND_KEYS`` metric logged that round
    — the rows ``paired=A,B by=round`` pairs by seed at each budget. Empty when no run logged
    an evaluator metric before its last round (a one-budget sweep)."""
    keys, runs = _run_records(sweep_dir)
    rows: list[dict[str, object]] = []
    metrics: set[str] = set()
    early = False
    for run, records in runs:
        last = max((r.get("round", 0) for r in records), default=0)
        for r in records:
            vals = {k: v for k, v in r.items() if ROUND_KEYS.match(k) and isinstance(v, float)}
            if not vals:
                continue
            early |= r["round"] < last
            metrics |= set(vals)
            acc = r.get("test_acc")
            rows.append({k: run[k] for k in keys} | {"round": r["round"], "test_acc": acc} | vals)
    if not early:
        return [], []
    return rows, [*keys, "round", "test_acc", *sorted(metrics)]


def round_rows(sweep_dir: Path) -> tuple[list[dict[str, object]], list[str]]:
    """Per cell (a comparison.csv row's parameters but the seed) and round: n_seeds and the
    mean, 95 % interval half-width, min and max over the seeds of every ``ROUND_KEYS``
    metric. Empty when no run logged such a metric before its last round."""
    import math

    from scipy.stats import t

    keys, runs = _run_records(sweep_dir)
    params = [k for k in keys if k != "seed"]
    series: dict[tuple[str, ...], dict[int, dict[str, list[float]]]] = {}
    early = False
    for run, records in runs:
        last = max((r.get("round", 0) for r in records), default=0)
        cell = series.setdefault(tuple(run[k] for k in params), {})
        for r in records:
            vals = {k: v for k, v in r.items() if ROUND_KEYS.match(k) and isinstance(v, float)}
            if not vals:
                continue
            early |= r["round"] < last
            slot = cell.setdefault(int(r["round"]), {})
            for k, v in vals.items():
                slot.setdefault(k, []).append(v)
    if not early:
        return [], []
    metrics = sorted({k for c in series.values() for s in c.values() for k in s})
    rows: list[dict[str, object]] = []
    for cell_key, by_round in series.items():
        for rnd in sorted(by_round):
            row: dict[str, object] = dict(zip(params, cell_key)) | {"round": rnd}
            for k, vals in by_round[rnd].items():
                n = len(vals)
                mean = sum(vals) / n
                sd = math.sqrt(sum((v - mean) ** 2 for v in vals) / (n - 1)) if n > 1 else 0.0
                half = float(t.ppf(0.975, n - 1)) * sd / math.sqrt(n) if n > 1 else float("nan")
                row |= {f"{k}_mean": mean, f"{k}_ci95": half, f"{k}_min": min(vals),
                        f"{k}_max": max(vals), f"{k}_n": n}  # fmt: skip
            row["n_seeds"] = max(len(v) for v in by_round[rnd].values())
            rows.append(row)
    stats = ("mean", "ci95", "min", "max", "n")
    cols = [*params, "round", "n_seeds", *[f"{m}_{x}" for m in metrics for x in stats]]
    return rows, cols


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--check", action="store_true", help="fail if a document is out of date")
    ap.add_argument("--collect", nargs="*", default=[], metavar="SWEEP_DIR")
    ap.add_argument("--collect-bench", nargs="*", default=[], metavar="BENCH_DIR")
    args = ap.parse_args()
    for d in args.collect:
        for p in collect(Path(d)):
            print(f"collected {p.relative_to(ROOT)}")
    for d in args.collect_bench:
        for p in collect_bench(Path(d)):
            print(f"collected {p.relative_to(ROOT)}")
    # collecting only copies; the documents render once all data is in
    if args.collect or args.collect_bench:
        return 0
    stale: list[Path] = []
    missing: list[str] = []
    for doc in documents():
        text = doc.read_text()
        new = render_document(text, missing)
        if new != text:
            stale.append(doc)
            if not args.check:
                doc.write_text(new)
    if args.check:
        problems = check_provenance()
        for p in problems:
            print(f"provenance: {p}")
        if stale:
            print("out of date: " + ", ".join(str(p.relative_to(ROOT)) for p in stale))
        if stale or problems:
            return 1
    for p in stale:
        print(f"rendered {p.relative_to(ROOT)}")
    for line in dict.fromkeys(missing):
        print(f"not rendered: {line}")
    return 1 if missing else 0


if __name__ == "__main__":
    sys.exit(main())
