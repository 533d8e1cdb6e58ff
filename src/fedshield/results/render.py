"""The results tables of README.md and docs/**/*.md, rendered from committed result files.

Tables are never typed by hand: a document holds marker blocks

    <!-- fedshield:table source=docs/results/data/brdrag-attacks-20-cpu-cells.csv
         pivot=variant,attack.name value=final_test_acc -->
    (generated)
    <!-- fedshield:end -->

and :func:`render_document` replaces what lies between the markers by the table computed
from ``source`` (a sweep's ``comparison.csv`` or ``cells.csv``, copied under docs/results/data/ by
``--collect``: :mod:`fedshield.results.collect`). Options of a block:

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
  (:mod:`fedshield.results.header`);
* ``paired=A,B`` with ``source=<a sweep's per-run comparison CSV>`` and ``value=m1,m2`` —
  variant A minus B paired by seed, per metric: mean ± 95 % t interval, every seed's
  difference, the sign test and "undecided" where the interval covers zero
  (:mod:`fedshield.results.paired`; ``by=KEY`` pairs within each KEY value too,
  ``scale=100`` points; ``variant=COLUMN`` names the variants' column, e.g. ``defense`` in
  a bench's runs.csv, and ``where=`` applies as for tables; ``worst=KEY`` pairs each
  seed's worst case over KEY; ``labels=`` tests each of several sources on its own).

    fedshield results render            # rewrite every block in place
    fedshield results render --check    # exit 1 if a document (or a data file's
                                        # provenance) is out of date
    fedshield results render --collect runs/brdrag-attacks-20-cpu  # copy its CSVs only
    fedshield results render --collect-bench runs/bench-robustness-digits-cpu

(``python -m fedshield.results render ...`` the same.) Collecting and the provenance
records: :mod:`fedshield.results.collect`.

A table with ``mean ± h`` cells is followed by the line :data:`PM_NOTE`, so ``±`` says what
it is wherever it is rendered.
"""

from __future__ import annotations

import argparse
import csv
import re
import shlex
from pathlib import Path

from fedshield.results import collect
from fedshield.results.pages import ROOT

BLOCK = re.compile(
    r"(<!-- fedshield:table (?P<opts>.*?)-->\n)(?P<body>.*?)(<!-- fedshield:end -->)", re.S
)


#: The label under every rendered table with ``±`` cells (the same words as fedshield's
#: own cells tables, ``fedshield.report.PM_NOTE``).
PM_NOTE = "± : half-width of the 95 % Student-t interval over the seeds (n_seeds)"


def parse_opts(text: str) -> dict[str, str]:
    """``key=value`` options, space-separated; a value holding spaces is quoted
    (``columns="defense,drop0 fixed"``)."""
    return dict(item.split("=", 1) for item in shlex.split(text) if "=" in item)


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


def render(opts: dict[str, str], root: Path = ROOT) -> str:
    """A block's body from the files under ``root``; ``SystemExit`` naming the file when one
    it reads is not there (``render_document`` reports it)."""
    if "page" in opts:
        from fedshield.results.header import render_header

        return render_header(opts["page"], root)
    for f in [*opts.get("source", "").split(","), opts.get("text", ""), opts.get("include", "")]:
        if f and not (root / f).exists():
            raise SystemExit(f"{f}: no such result file")
    if "text" in opts:
        return (root / opts["text"]).read_text()
    if "include" in opts:
        return render_include(opts, root)
    if "paired" in opts:  # before ``worst``: a paired block's ``worst=KEY`` is its own
        from fedshield.results.paired import render_paired

        return render_paired(opts, root, lambda p: _rows(p, opts.get("where")))
    if "worst" in opts:
        return render_worst(opts, root)
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
    repository's layout: ``fedshield results page --out``). With ``missing`` (a list), a block
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


def reads(text: str) -> list[str]:
    """The files (repository paths) a document's blocks read."""
    out: list[str] = []
    for m in BLOCK.finditer(text):
        opts = parse_opts(m.group("opts"))
        out += [*opts.get("source", "").split(","), opts.get("text", ""), opts.get("include", "")]
    return [f for f in dict.fromkeys(out) if f]


def main(args: argparse.Namespace) -> int:
    """``fedshield results render`` (its arguments: :mod:`fedshield.results.__main__`)."""
    for d in args.collect:
        for p in collect.collect(Path(d)):
            print(f"collected {p.relative_to(ROOT)}")
    for d in args.collect_bench:
        for p in collect.collect_bench(Path(d)):
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
        problems = collect.check_provenance()
        for problem in problems:
            print(f"provenance: {problem}")
        if stale:
            print("out of date: " + ", ".join(str(p.relative_to(ROOT)) for p in stale))
        if stale or problems:
            return 1
    for p in stale:
        print(f"rendered {p.relative_to(ROOT)}")
    for line in dict.fromkeys(missing):
        print(f"not rendered: {line}")
    return 1 if missing else 0
