"""Every results page is made by one command at a stated commit:
docs/results/pages.toml declares each page's jobs, `make results PAGE=...` (`fedshield
results page`, fedshield.results.make) regenerates it from nothing into a chosen folder,
the page names the commit of its data, a diverged run is shown as diverged, and a sampled
cell of every page re-run at the current commit must lie in the published seeds' range
(the check fails on a stale page)."""

from __future__ import annotations

import csv
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from fedshield.results import collect, header, make, pages, render, sampling
from fedshield.results.__main__ import main as results_main

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "docs" / "results" / "data"


PAGES = pages.load_pages()
#: Pages whose sampled cell another test re-runs already.
SAMPLED_ELSEWHERE = {
    "demo": "tests/test_results_fresh.py (the demo's median cell)",
    # timings are the measuring machine's; the parity the page states is asserted bit for
    # bit by tests/test_flower.py and tests/test_flower_sim.py in every run
    "flower": "tests/test_flower.py, tests/test_flower_sim.py",
    # replays of recorded 20-round FedCART runs under every CART variant (~10 min a seed):
    # no cell is cheap; the chosen defaults' own behaviour is tests/test_fedcart.py's
    "cart_step": "tests/test_fedcart.py",
}


def _blocks(doc: Path) -> list[dict[str, str]]:
    return [render.parse_opts(m.group("opts")) for m in render.BLOCK.finditer(doc.read_text())]


def _produced(page) -> set[str]:  # type: ignore[no-untyped-def]
    """The file names a page's jobs write (collect's and collect_bench's naming)."""
    return {pages.TIMES, *(f for j in page.jobs for f in j.outputs())}


@pytest.mark.parametrize("name", sorted(PAGES))
def test_a_page_reads_only_what_its_own_jobs_make(name: str) -> None:
    """`make results PAGE=name` regenerates every table of the page: no block reads a file
    another page's command (or no command) makes, and the page names its jobs' commits."""
    page = PAGES[name]
    blocks = _blocks(ROOT / page.doc)
    assert {"page": name} in [{k: v for k, v in b.items() if k == "page"} for b in blocks], (
        f"{page.doc}: no <!-- fedshield:table page={name} --> header block"
    )
    if page.doc == "README.md":  # the README quotes every page: test below
        return
    made = _produced(page)
    for f in _reads(ROOT / page.doc):
        assert Path(f).name in made, f"{page.doc} reads {f}, which no job of [{name}] makes"


def _reads(doc: Path) -> list[str]:
    """The result files the document's blocks read (the page command's own reading)."""
    return [f for f in render.reads(doc.read_text()) if f.startswith("docs/results/")]


def test_every_result_a_document_quotes_is_made_by_some_page() -> None:
    """README.md and docs/**: each data file a table reads comes from a page's command (the
    timing outputs docs/results/bench_*.txt are their bench scripts' ``--save``)."""
    made = set().union(*(_produced(p) for p in PAGES.values()))
    for doc in render.documents():
        for f in _reads(doc):
            if not f.startswith("docs/results/data/"):
                continue
            assert Path(f).name in made, f"{doc.relative_to(ROOT)} reads {f}: no page makes it"


@pytest.mark.parametrize("name", sorted(PAGES))
def test_the_published_data_is_what_the_page_command_makes(name: str) -> None:
    """Each grid job's data was made with the job's seeds and overrides (its provenance
    command), from one commit per job, so the header's commit is the data's — or from
    several, where the runs of other commits came from the run store, counting at the
    code that made the page (docs/results-store.md; the header says how many)."""
    page = PAGES[name]
    for j in page.jobs:
        if j.kind == "command":
            continue
        stem = j.stem if j.kind == "grid" else f"bench-{j.name}"
        prov = json.loads((DATA / f"{stem}.provenance.json").read_text())
        stored = {k: v for k, v in (prov.get("store") or {}).items() if k != "left_out"}
        assert len(prov["commits"]) == 1 or any(stored.values()), (
            f"{stem}: data from several commits {prov['commits']}"
        )
        if j.kind == "grid":
            cmd = prov["command"]
            seeds = cmd[cmd.index("--seeds") + 1] if "--seeds" in cmd else ""
            sets = tuple(cmd[i + 1] for i, a in enumerate(cmd) if a == "--set")
            assert (seeds, sets) == (j.seeds, j.sets), f"{stem}: made by {' '.join(cmd)}"


def test_the_header_names_every_job_and_its_commit() -> None:
    text = header.render_header("brdrag")
    assert "`make results PAGE=brdrag`" in text
    for j in PAGES["brdrag"].jobs:
        prov = json.loads((DATA / f"{j.stem}.provenance.json").read_text())
        line = next(x for x in text.splitlines() if f"--grid {j.name} " in x + " ")
        assert f"`{prov['commits'][0][:7]}`" in line


def test_an_unknown_page_is_one_line_and_exit_2() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "fedshield.results", "page", "nosuchpage"],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert proc.returncode == 2
    assert proc.stderr.strip().count("\n") == 0 and "nosuchpage" in proc.stderr


def test_a_diverged_run_is_shown_as_diverged_never_as_a_number(tmp_path: Path) -> None:
    """A cell with a diverged seed names it and reads the other seeds only; the worst case
    over attacks is that cell; a per-run row is "diverged"."""
    from fedshield.report import pivot_table, seed_cells

    summaries = [
        {"final_test_acc": 0.8, "status": "ok"},
        {"final_test_acc": 0.1, "status": "diverged"},
        {"final_test_acc": 0.9, "status": "ok"},
        {"final_test_acc": 0.5, "status": "ok"},
    ]
    params = [{"variant": "median", "attack": a, "seed": s}
              for a, s in (("ipm", 0), ("ipm", 1), ("ipm", 2), ("noise", 0))]  # fmt: skip
    cells = seed_cells(summaries, params, ["final_test_acc"])
    ipm = next(c for c in cells if c["attack"] == "ipm")
    assert (ipm["n_seeds"], ipm["n_diverged"], ipm["diverged_seeds"]) == (3, 1, "1")
    assert ipm["final_test_acc_mean"] == pytest.approx(0.85)  # seeds 0 and 2 only
    pivot = pivot_table(cells, "variant", "attack", "final_test_acc_mean").rows
    assert pivot == [["median", "diverged (seed 1); others 0.850", "0.500"]]
    runs = [s | p for s, p in zip(summaries, params)]
    assert pivot_table(runs, "seed", "attack").rows[1] == ["1", "diverged", "-"]
    rows = [{k: str(v) for k, v in c.items()} for c in cells]
    assert render._cell(rows[0], "final_test_acc", 3).startswith("diverged (seed 1); others 0.850")
    src = tmp_path / "cells.csv"
    with src.open("w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=sorted({k for r in rows for k in r}))
        w.writeheader()
        w.writerows(rows)
    worst = render.render(
        {"worst": "variant,attack", "source": "cells.csv", "labels": "w"}, tmp_path
    )
    assert "| median | diverged (ipm) |" in worst
    assert (
        render._cell({"status": "diverged", "final_test_acc": "0.1"}, "final_test_acc", 3)
        == "diverged"
    )


@pytest.mark.slow
def test_make_results_regenerates_a_page_from_nothing_into_a_chosen_folder(tmp_path: Path) -> None:
    """A two-cell page (digits MLP, 2 rounds, 2 seeds) from an empty folder: the sweep runs,
    its data is collected with provenance, the page names the commit and shows the cells."""
    out = tmp_path / "out"
    pages_dir = out / "docs" / "results"
    pages_dir.mkdir(parents=True)
    grid = tmp_path / "tiny.toml"
    grid.write_text(
        'name = "tiny"\nbase = "brdrag-digits-cpu"\nset = ["rounds=2"]\n'
        '[[variant]]\nname = "fedavg"\nset = [\'server.aggregator="mean"\']\n'
        '[[variant]]\nname = "median"\nset = [\'server.aggregator="median"\']\n'
    )
    (pages_dir / "pages.toml").write_text(
        f'[tiny]\ndoc = "docs/results/tiny.md"\ngrid = [{{ name = "{grid}", seeds = "0,1" }}]\n'
    )
    (pages_dir / "tiny.md").write_text(
        "# tiny\n\n<!-- fedshield:table page=tiny -->\n<!-- fedshield:end -->\n\n"
        "<!-- fedshield:table source=docs/results/data/tiny-cells.csv columns=variant,n_seeds,"
        "final_test_acc spread=seeds -->\n<!-- fedshield:end -->\n"
    )
    page = pages.load_pages(pages_dir / "pages.toml")["tiny"]
    doc = make.run_page(page, out)
    text = doc.read_text()
    prov = json.loads((pages_dir / "data" / "tiny.provenance.json").read_text())
    assert f"`{prov['commits'][0][:7]}`" in text and "make results PAGE=tiny" in text
    cell = r"^\| (fedavg|median) \| 2 \| (\d\.\d{3}) ± \d\.\d{3} \((\d\.\d{3}), (\d\.\d{3})\)"
    rows = re.findall(cell, text, re.M)
    assert [r[0] for r in rows] == ["fedavg", "median"], text
    times = list(csv.DictReader((pages_dir / "data" / pages.TIMES).open()))
    assert [t["runs"] for t in times] == ["4"]
    assert collect.check_provenance(pages_dir / "data") == []


SAMPLED = sorted(n for n, p in PAGES.items() if p.sample)


@pytest.mark.slow
def test_a_page_made_in_parts_on_two_machines_then_merged(tmp_path: Path) -> None:
    """docs/results-store.md: ``PART=1/2`` and ``PART=2/2`` (two machines, two stores) make
    every run once and render nothing; their stores merged by copying files, the page is
    made without running any run again, and its header says where the runs came from."""
    grid = tmp_path / "tiny.toml"
    grid.write_text('name = "tiny"\nbase = "brdrag-digits-cpu"\nset = ["rounds=2"]\n')
    jobs = f'grid = [{{ name = "{grid}", seeds = "0,1,2" }}]\n'
    block = "<!-- fedshield:table page=t -->\n<!-- fedshield:end -->"
    page = _page_in(tmp_path / "page", block, jobs)
    merged = tmp_path / "merged"
    for k in (1, 2):
        out = tmp_path / f"machine{k}"
        assert make.run_page(page, out, part=f"{k}/2") is None
        assert not (out / "docs" / "results" / "data" / "tiny.csv").exists()
        made = out / "docs" / "results" / "store"  # absent where the part had no run
        if made.exists():
            shutil.copytree(made, merged, dirs_exist_ok=True)
    assert len(list(merged.glob("*.jsonl.gz"))) == 3  # each run in exactly one part
    out = tmp_path / "page"
    doc = make.run_page(page, out, store=merged)
    assert doc is not None and "— 3 runs from the run store" in doc.read_text()
    assert len(list(merged.glob("*.jsonl.gz"))) == 3  # none made again


def test_every_page_has_a_sampled_cell() -> None:
    assert set(SAMPLED) | set(SAMPLED_ELSEWHERE) == set(PAGES)


@pytest.mark.slow
@pytest.mark.parametrize("name", SAMPLED)
def test_the_sampled_cell_reproduces_at_the_current_commit(name: str) -> None:
    """The page's sampled cell (its cheapest training cell) re-run now lies in the range of
    the seeds the page published, widened by the kernel tolerance measured for the demo: a
    page whose numbers this commit no longer makes fails here."""
    got = sampling.sample(name)
    assert got.ok, got.line()


# -- input checks: one line naming the key, exit 2, before any work -----------------------------
_P = '[p]\ndoc = "x.md"\n'
_SAMPLE = _P + 'grid = [{ name = "demo" }]\nsample = '
BAD_PAGES = [
    (_P + "grids = []\n", r"\[p\]: unknown key 'grids'"),
    ('[p]\nwhat = "x"\n', r"\[p\]: missing key 'doc'"),
    (_P + 'grid = [{ name = "demo", seed = "0,1" }]\n', r"grid\[0\]: unknown key 'seed'"),
    (_P + 'grid = [{ name = "demo", seeds = [0, 1] }]\n', r"grid\[0\]\.seeds: .*\[0, 1\]"),
    (_P + 'grid = [{ seeds = "0" }]\n', r"grid\[0\]: missing key 'name'"),
    (_P + 'grid = [{ name = "demo", jobs = 0 }]\n', r"grid\[0\]\.jobs: .*0"),
    (_P + 'grid = { name = "demo" }\n', r"\[p\]\.grid: expected a list"),
    (_P + 'command = [{ run = "{py} t.py --out {outdir}" }]\n', r"command\[0\]\.run: 'outdir'"),
    (_P + 'command = [{ run = "{py} t.py --set a={}" }]\n', r"command\[0\]\.run: .*literal"),
    (_P + "command = [{ run = \"{py} t.py 'a\" }]\n", r"command\[0\]\.run: No closing"),
    (_SAMPLE + '{ grid = "drag-c-cpu", run = "a", metric = "m" }\n',
     r"sample\.grid: 'drag-c-cpu' is not a grid job"),
    (_SAMPLE + '{ grid = "demo", run = "a" }\n', r"sample: missing key 'metric'"),
    (_SAMPLE + '{ grid = "demo", bench = "b", run = "a", metric = "m" }\n', r"sample: give one"),
    (_P + 'bench = [{ name = "b" }]\nsample = { bench = "b", run = "a", metric = "m", '
     "round = 3 }\n", r"sample\.round"),
    ('[p\ndoc = "x.md"\n', r"pages\.toml: "),
]  # fmt: skip


@pytest.mark.parametrize(("text", "message"), BAD_PAGES)
def test_a_bad_pages_toml_names_its_key_in_one_line(
    tmp_path: Path, text: str, message: str
) -> None:
    f = tmp_path / "pages.toml"
    f.write_text(text)
    with pytest.raises(pages.BadInput) as err:
        pages.load_pages(f)
    assert re.search(message, str(err.value.code)), err.value.code
    assert "\n" not in str(err.value.code)


def test_every_declared_sample_names_a_run_and_metric_of_its_job() -> None:
    """pages.toml's own samples pass the checks (the rest is the slow test's)."""
    for page in PAGES.values():
        if page.sample:
            pages._check_sample(page.name, page.sample, page.jobs)


def _main(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str]:
    rc = results_main(["page", *argv])
    err = capsys.readouterr().err
    return rc, err


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["nosuchpage"], "error: PAGE='nosuchpage': not a page"),
        (["brdrag", "--only", "nosuch,clean-digits-cpu"], "error: --only nosuch: not a job"),
        (["brdrag", "--only", ""], "error: --only '': expected job labels"),
        (["brdrag", "-j", "0"], "error: -j 0: expected a positive number"),
        (["brdrag", "--sample", "--only", "clean-digits-cpu"], "error: --sample re-runs one cell"),
    ],
)  # fmt: skip
def test_bad_command_line_input_is_one_error_line_exit_2_before_any_work(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], argv: list[str], message: str
) -> None:
    out = tmp_path / "out"
    rc, err = _main(capsys, *argv, "--out", str(out))
    assert rc == 2
    assert err.startswith(message) and err.count("\n") == 1, err
    assert not out.exists()  # nothing made


def test_a_command_job_fills_its_placeholders_per_argument() -> None:
    """{py}, {out}, {runs} substituted after splitting (a folder with a space stays one
    argument), {{}} a literal brace pair; the label of `-m package.module sub` is
    package-sub, of a script its stem."""
    line = "{py} -m fedshield.cli run --set eval.params={{}} --out {runs}/x"
    job = pages.Job("command", line)
    assert job.command(Path("/a b")) == [sys.executable, "-m", "fedshield.cli", "run", "--set",
                                         "eval.params={}", "--out", "/a b/runs/x"]  # fmt: skip
    assert job.label == "fedshield-run"
    assert job.shown() == "fedshield run --set eval.params={} --out OUT/runs/x"
    script = pages.Job("command", "{py} tools/cart_step_sweep.py round {runs}")
    assert script.label == "cart_step_sweep"
    assert pages.Job("grid", "bench/tiny.toml").label == "tiny"


def test_campaign_times_record_the_commit_sha(tmp_path: Path) -> None:
    make._record_time(tmp_path, pages.Job("grid", "demo", "0,1"), 4, 12.3)
    (row,) = csv.DictReader((tmp_path / pages.TIMES).open())
    assert re.fullmatch(r"[0-9a-f]{7}|unknown", row["commit"]), row
    assert (row["grid"], row["seeds"], row["runs"], row["wall_s"]) == ("demo", "0,1", "4", "12")


# -- rendering: every page renders into a fresh folder, or fails naming what is missing -----------
def test_the_readme_page_renders_into_a_fresh_folder_as_published(tmp_path: Path) -> None:
    """The README quotes every page: with no job run (``--only`` none), its tables render in
    OUT from the published files, copied with their provenance records, exactly as in the
    repository."""
    doc = make.run_page(PAGES["demo"], tmp_path, only=set())
    assert doc == tmp_path / "README.md"
    assert doc.read_text() == render.render_document((ROOT / "README.md").read_text())
    assert collect.check_provenance(tmp_path / "docs" / "results" / "data") == []


def _page_in(tmp_path: Path, body: str, jobs: str = "") -> pages.Page:
    folder = tmp_path / "docs" / "results"
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "t.md").write_text(f"# t\n\n{body}\n")
    (folder / "pages.toml").write_text(f'[t]\ndoc = "docs/results/t.md"\n{jobs}')
    return pages.load_pages(folder / "pages.toml")["t"]


@pytest.mark.parametrize(
    "block",
    [
        "source=docs/results/data/nosuch-cells.csv columns=variant,final_test_acc",
        "worst=variant,attack source=docs/results/data/nosuch-cells.csv labels=x",
        "paired=a,b source=docs/results/data/nosuch.csv value=final_test_acc",
        "include=docs/results/nosuch.txt",
        "page=nosuch",
    ],
)
def test_a_page_whose_data_is_missing_fails_naming_it(tmp_path: Path, block: str) -> None:
    page = _page_in(tmp_path, f"<!-- fedshield:table {block} -->\nold\n<!-- fedshield:end -->")
    with pytest.raises(pages.PageFailed, match="not rendered: .*nosuch"):
        make.run_page(page, tmp_path, only=set())


@pytest.mark.parametrize(
    ("jobs", "message"),
    [
        ('grid = [{ name = "brdrag-atacks-20-cpu" }]\n',
         r"\.grid: 'brdrag-atacks-20-cpu': not a bundled grid"),
        ('bench = [{ name = "nosuch" }]\n',
         r"\.bench: 'nosuch': not a bundled bench \(see `fedshield list benches`\)"),
        ('grid = [{ name = "nosuch/g.toml" }]\n', r"\.grid: 'nosuch/g.toml': no such grid file"),
        ('bench = [{ name = "b.toml" }]\n', r"\.bench: 'b.toml': not a bundled bench"),
    ],
)  # fmt: skip
def test_an_unknown_grid_or_bench_fails_before_any_job_runs(
    tmp_path: Path, jobs: str, message: str
) -> None:
    first = 'command = [{ run = "{py} -c \'open(\\"{out}/ran\\", \\"w\\")\'" }]\n'
    page = _page_in(tmp_path / "src", "", jobs + first)
    with pytest.raises(pages.BadInput, match=message):
        make.run_page(page, tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_a_grid_folder_with_runs_of_another_commit_is_refused(tmp_path: Path) -> None:
    """The sweep would keep them (it resumes by config): the page would mix commits."""
    page = _page_in(tmp_path / "src", "", 'grid = [{ name = "demo" }]\n')
    run = tmp_path / "out" / "runs" / "demo" / "fedavg"
    run.mkdir(parents=True)
    (run / "summary.json").write_text(json.dumps({"provenance": {"commit": "0123456789ab"}}))
    with pytest.raises(pages.BadInput, match=r"runs/demo: holds runs made at commit 0123456"):
        make.run_page(page, tmp_path / "out")
    assert not (tmp_path / "out" / "docs").exists()


def test_a_job_that_writes_nothing_fails_the_page(tmp_path: Path) -> None:
    page = _page_in(tmp_path, "", 'command = [{ run = "{py} -c pass", writes = ["made.csv"] }]\n')
    with pytest.raises(pages.PageFailed, match="did not write made.csv, made.provenance.json"):
        make.run_page(page, tmp_path)
    (tmp_path / "docs" / "results" / "made.csv").write_text("a\n1\n")  # an earlier run's
    with pytest.raises(pages.PageFailed, match="did not write made.csv"):
        make.run_page(page, tmp_path)


def test_a_failing_job_is_one_error_line(tmp_path: Path) -> None:
    page = _page_in(tmp_path, "", "command = [{ run = \"{py} -c 'raise SystemExit(4)'\" }]\n")
    with pytest.raises(pages.PageFailed, match=r"failed \(exit 4\)"):
        make.run_page(page, tmp_path)


def _prov(data: Path, stem: str, commit: str) -> None:
    (data / f"{stem}.provenance.json").write_text(json.dumps({"commits": [commit]}))


def test_the_header_claims_no_commit_while_a_job_is_unmeasured(tmp_path: Path) -> None:
    jobs = 'grid = [{ name = "demo" }, { name = "drag-c-cpu", seeds = "0,1" }]\n'
    _page_in(tmp_path, "", jobs)
    data = tmp_path / "docs" / "results" / "data"
    data.mkdir()
    _prov(data, "demo", "abcdef0123")
    text = header.render_header("t", tmp_path)
    assert "- `fedshield sweep --grid demo` — commit `abcdef0`\n" in text
    assert "- `fedshield sweep --grid drag-c-cpu --seeds 0,1` — not yet measured\n" in text
    assert "Not yet measured: drag-c-cpu" in text and "All of this page's data" not in text
    _prov(data, "drag-c-cpu", "abcdef0999")
    assert "All of this page's data was made at commit `abcdef0`." in header.render_header(
        "t", tmp_path
    )


def test_the_header_says_which_runs_came_from_the_store_and_names_those_left_out(
    tmp_path: Path,
) -> None:
    """docs/results-store.md: runs of older commits that count here are said as such (and
    how many were replayed); stored runs that do not count are named, not used."""
    _page_in(tmp_path, "", 'grid = [{ name = "demo" }]\n')
    data = tmp_path / "docs" / "results" / "data"
    data.mkdir()
    stale = "stale     ab-s0-cd.jsonl.gz  median seed 0  @ 1234567  changed: fedshield.x"
    prov = {"commits": ["abcdef0123", "1234567999"],
            "store": {"valid": ["fedavg", "median"], "replayed": ["drag"],
                      "left_out": {"median": [stale]}}}  # fmt: skip
    (data / "demo.provenance.json").write_text(json.dumps(prov))
    text = header.render_header("t", tmp_path)
    line = next(x for x in text.splitlines() if "--grid demo" in x)
    assert "`abcdef0`, `1234567` (mixed" in line
    assert "3 runs from the run store, 1 of them replayed valid at the page's code" in line
    assert f"- `{stale}`" in text and "Left out of every number (1 stored runs" in text


def test_a_diverged_run_marks_its_results_not_its_parameters(tmp_path: Path) -> None:
    """A per-run row (comparison.csv: parameters before ``rounds``) and a cells row with a
    diverged seed: the parameter columns read as they are."""
    run = {"label": "beta=0.1", "data.beta": "0.1", "seed": "1", "rounds": "3",
           "final_test_acc": "0.1", "status": "diverged", "route/full/acc": "0.2"}  # fmt: skip
    cells = [render._cell(run, c, 3) for c in ("data.beta", "seed", "rounds", "final_test_acc")]
    assert cells == ["0.100", "1", "3", "diverged"]
    assert render._cell(run, "route/full/acc", 3) == "diverged"
    cell = {"server.clients_per_round": "10", "n_seeds": "3", "n_diverged": "1",
            "diverged_seeds": "2", "final_test_acc_mean": "0.5", "final_test_acc_ci95": "0.1",
            "final_test_acc_n": "2"}  # fmt: skip
    assert render._cell(cell, "server.clients_per_round", 3) == "10"
    assert render._cell(cell, "final_test_acc", 3) == "diverged (seed 2); others 0.500 ± 0.100"
    bench = {"defense": "median", "n_seeds": "3", "diverged_seeds": "2", "test_acc_mean": "0.3"}
    assert render._cell(bench, "test_acc", 3) == "diverged (2 of 3 seeds); others 0.300"


# -- the sampled cell: what was published, per seed ------------------------------------------------
def _csv(path: Path, rows: list[dict[str, object]]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)


def _grid_page(sample: dict[str, object]) -> pages.Page:
    return pages.Page("p", "d.md", "", [pages.Job("grid", "g", "0,1,2")], sample)


def test_the_published_cell_leaves_out_diverged_seeds_final_and_per_round(
    tmp_path: Path,
) -> None:
    data = tmp_path / "docs" / "results" / "data"
    _csv(data / "g.csv", [
        {"label": f"{c}_seed={s}", "final_test_acc": v, "status": st}
        for c, s, v, st in (("a=1", 0, 0.8, "ok"), ("a=1", 1, 0.1, "diverged"),
                            ("a=1", 12, 0.7, "ok"), ("a=10", 1, 0.5, "ok"))
    ])  # fmt: skip
    _csv(data / "g-curves.csv", [
        {"label": f"a=1_seed={s}", "round": r, "test_acc": v}
        for s, r, v in ((0, 5, 0.6), (1, 5, 0.2), (12, 5, 0.5), (0, 6, 0.9))
    ])  # fmt: skip
    s = {"grid": "g", "run": "a=1_seed=0", "metric": "final_test_acc"}
    assert sampling._published_grid(_grid_page(s), s, tmp_path) == ({"0": 0.8, "12": 0.7}, {"1"})
    s = {"grid": "g", "run": "a=1_seed=0", "metric": "test_acc", "round": 5}
    assert sampling._published_grid(_grid_page(s), s, tmp_path) == ({"0": 0.6, "12": 0.5}, {"1"})
    s = {"grid": "g", "run": "a=1_seed=0", "metric": "robust/worst"}
    with pytest.raises(pages.BadInput, match=r"metric: 'robust/worst' is not a column of g\.csv"):
        sampling._published_grid(_grid_page(s), s, tmp_path)


def test_the_published_cell_of_a_grid_without_seeds(tmp_path: Path) -> None:
    data = tmp_path / "docs" / "results" / "data"
    _csv(data / "g.csv", [{"label": "m_noise=1.0", "final_test_acc": 0.7},
                          {"label": "m_noise=1.0x", "final_test_acc": 0.1}])  # fmt: skip
    s = {"grid": "g", "run": "m_noise=1.0", "metric": "final_test_acc"}
    assert sampling._published_grid(_grid_page(s), s, tmp_path) == ({"-": 0.7}, set())


def test_the_published_bench_cell_by_id_and_seed(tmp_path: Path) -> None:
    f = tmp_path / "docs" / "results" / "data" / "bench-b-runs.csv"
    _csv(f, [
        {"id": i, "status": st, "test_acc": v}
        for i, st, v in (("m__sign_flip__t0__s0", "ok", 0.8),
                         ("m__sign_flip__t0__s1", "diverged", 0.1),
                         ("m__sign_flip__t0__s10", "ok", 0.6), ("m__sign_flip__t1__s0", "ok", 0.2))
    ])  # fmt: skip
    page = pages.Page("p", "d.md", "", [pages.Job("bench", "b")])
    s = {"bench": "b", "run": "m__sign_flip__t0__s0", "metric": "test_acc"}
    assert sampling._published_bench(page, s, tmp_path) == ({"0": 0.8, "10": 0.6}, {"1"})
    assert sampling.split_seed("m__sign_flip", "__s") == ("m__sign_flip", "-")


@pytest.mark.parametrize(
    ("value", "seed", "ok"),
    [
        (0.75, "0", True),
        (0.9, "0", False),
        (None, "0", False),
        (None, "1", True),
        (0.75, "1", False),
    ],  # fmt: skip
)
def test_a_sample_matches_what_was_published_diverged_included(
    value: float | None, seed: str, ok: bool
) -> None:
    """In the range (± tolerance) of the seeds that did not diverge; a run that diverges now
    matches only a seed published as diverged, and a seed published as diverged must diverge."""
    got = sampling.Sample("p", "c", "m", value, {"0": 0.7, "2": 0.8}, seed, frozenset({"1"}), 0.02)
    assert got.ok is ok, got.line()
    assert ("→ ok" if ok else "→ STALE") in got.line()


def test_the_sample_of_a_grid_file_expands_it(tmp_path: Path) -> None:
    grid = tmp_path / "tiny.toml"
    grid.write_text('name = "tiny"\nbase = "brdrag-digits-cpu"\nset = ["rounds=2"]\n')
    page = pages.Page("p", "d.md", "", [pages.Job("grid", str(grid), "0,1", ("rounds=3",))])
    raw = sampling._grid_run(page, {"grid": str(grid), "run": "tiny_seed=1"})
    assert (raw["rounds"], raw["seed"]) == (3, 1)
    with pytest.raises(pages.BadInput, match="sample.run: 'tiny_seed=7' is not a run of"):
        sampling._grid_run(page, {"grid": str(grid), "run": "tiny_seed=7"})


def test_a_page_published_in_place_renders_the_repository_itself(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``OUT=.``: the page's own file is rendered where it is (no copy over itself), the
    job writes into the repository's layout, nothing else is copied in."""
    write = "open('{out}/docs/results/x.txt', 'w').write('hi')"
    job = f'command = [{{ run = """{{py}} -c "{write}"""", writes = ["x.txt"] }}]\n'
    block = "<!-- fedshield:table include=docs/results/x.txt -->\n<!-- fedshield:end -->"
    page = _page_in(tmp_path, block, job)
    monkeypatch.setattr(make, "ROOT", tmp_path)
    doc = make.run_page(page, tmp_path)
    assert doc == tmp_path / "docs" / "results" / "t.md"
    assert "include=docs/results/x.txt -->\n```\nhi\n```\n<!-- fedshield:end -->" in doc.read_text()
    made = sorted(str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*") if p.is_file())
    assert made == [
        "docs/results/data/x.provenance.json",  # the commit x.txt was made at (no table)
        "docs/results/pages.toml",
        "docs/results/t.md",
        "docs/results/x.txt",
    ]


def test_a_command_output_that_is_no_table_records_the_commit_it_ran_at(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A report or JSON study carries no provenance of its own: the page run records the
    commit it ran the command at, and the page's header names it (flower.md and
    cart_step.md said "its output records no commit")."""
    from fedshield.provenance import source_commit

    write = "open('{out}/docs/results/x.txt', 'w').write('hi')"
    job = f'command = [{{ run = """{{py}} -c "{write}"""", writes = ["x.txt"] }}]\n'
    page = _page_in(tmp_path, "", job)
    assert "` — its output records no commit\n" in header.render_header("t", tmp_path)
    monkeypatch.setattr(make, "ROOT", tmp_path)
    make.run_page(page, tmp_path / "out")
    side = tmp_path / "out" / "docs" / "results" / "data" / "x.provenance.json"
    prov = json.loads(side.read_text())
    commit = source_commit()["commit"] or "unknown"
    assert prov["commits"] == [commit] and prov["output"] == "x.txt"
    assert collect.check_provenance(side.parent) == []
    data = tmp_path / "docs" / "results" / "data"
    data.mkdir()
    _prov(data, "x", "abcdef0123")
    text = header.render_header("t", tmp_path)
    assert "` — commit `abcdef0`\n" in text
    assert "All of this page's data was made at commit `abcdef0`." in text


def test_a_sample_drops_evaluators_only_where_they_run_after_the_compared_round() -> None:
    """`skip_metrics` is refused for a run whose robust evaluation runs before the compared
    round (fedcart-methods-cpu: every 5 rounds) and drops it where it runs at the end."""
    page = PAGES["fedcart"]
    every5 = sampling._grid_run(page, {"grid": "fedcart-methods-cpu", "run": "fedcart_seed=0"})
    with pytest.raises(pages.BadInput, match="every 5 rounds, before the compared round 20"):
        sampling._without_metrics(every5, None, "sample")
    assert sampling._without_metrics(every5, 5, "sample")["eval"]["metrics"] == []
    last = sampling._grid_run(page, {"grid": "fedcart-baselines-cpu", "run": "fedpgd_seed=0"})
    assert last["eval"]["metrics"]
    assert sampling._without_metrics(last, None, "sample")["eval"]["metrics"] == []
