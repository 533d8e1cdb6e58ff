"""The README and docs/results are produced from result files, and the presets from their
generator: both checked here, so neither can go stale."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

from fedshield.results import collect, curves, render
from fedshield.results.__main__ import main as results_main

ROOT = Path(__file__).resolve().parents[1]


def _tool(name: str):
    spec = importlib.util.spec_from_file_location(name, ROOT / "tools" / f"{name}.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    spec.loader.exec_module(mod)
    return mod


def test_every_results_table_equals_its_rendering_from_the_data() -> None:
    stale = [
        p.name for p in render.documents() if render.render_document(p.read_text()) != p.read_text()
    ]
    assert not stale, f"run `fedshield results render`: {stale}"


def test_a_quoted_option_keeps_its_spaces(tmp_path) -> None:
    """Column names with spaces (a bench's "drop0 fixed") are one option when quoted; the
    unquoted form split them and rendered a table of one column and empty cells."""
    opts = render.parse_opts('source=w.csv columns="defense,drop0 fixed" labels=a,b ')
    assert opts == {"source": "w.csv", "columns": "defense,drop0 fixed", "labels": "a,b"}
    (tmp_path / "w.csv").write_text("defense,drop0 fixed,drop60 fixed\nmedian,0.1 (ipm),0.2\n")
    out = render.render({"source": "w.csv", "columns": opts["columns"]}, tmp_path)
    assert "| median | 0.1 (ipm) |" in out.splitlines()


def test_rendering_a_pivot_with_seed_intervals(tmp_path) -> None:
    data = tmp_path / "cells.csv"
    data.write_text(
        "variant,attack.name,n_seeds,final_test_acc,final_test_acc_mean,final_test_acc_ci95\n"
        "fedavg,noise,3,x,0.5,0.1\nbrdrag,noise,3,x,0.875,0.0125\nbrdrag,ipm,1,x,0.9,nan\n"
    )
    text = render.render({"source": "cells.csv", "pivot": "variant,attack.name"}, tmp_path)
    assert text.splitlines() == [
        "| variant \\ attack.name | noise | ipm |",
        "|---|---|---|",
        "| fedavg | 0.500 ± 0.100 | - |",
        "| brdrag | 0.875 ± 0.013 | 0.900 |",
        "",
        render.PM_NOTE,  # ± says what it is
    ]


def test_every_result_file_records_the_commit_and_config_that_made_it() -> None:
    assert collect.check_provenance() == []


def test_collect_records_provenance_and_a_changed_file_is_noticed(tmp_path) -> None:
    import json

    import pytest

    sweep = tmp_path / "runs" / "g"
    sweep.mkdir(parents=True)
    (sweep / "comparison.csv").write_text("label,final_test_acc\na,0.5\n")
    (sweep / "cells.csv").write_text("variant,n_seeds\na,1\n")
    data = tmp_path / "data"
    with pytest.raises(SystemExit, match="provenance.json: missing"):
        collect.collect(sweep, data)
    prov = {"grid": "demo", "commits": ["abc"], "config_sha256": "f00", "runs": {"a": "f00"}}
    (sweep / "provenance.json").write_text(json.dumps(prov))
    collect.collect(sweep, data)
    side = json.loads((data / "g.provenance.json").read_text())
    assert side["commits"] == ["abc"] and set(side["files"]) == {"g.csv", "g-cells.csv"}
    assert collect.check_provenance(data) == []
    (data / "g.csv").write_text("label,final_test_acc\na,0.9\n")  # edited afterwards
    (data / "other.csv").write_text("x\n")  # never collected
    problems = collect.check_provenance(data)
    assert any(p.startswith("g.csv: changed since") for p in problems)
    assert any(p.startswith("other.csv: no *.provenance.json") for p in problems)
    # a sweep's record named its last finished run as the grid
    (data / "g.provenance.json").write_text(json.dumps(side | {"grid": "a"}))
    problem = "g.provenance.json: grid 'a' is neither a bundled grid nor 'g'"
    assert problem in collect.check_provenance(data)


def test_rendering_shows_the_seed_spread_next_to_the_interval(tmp_path) -> None:
    """mean ± h [min, max] by default; spread=seeds lists every seed; spread=none hides it."""
    (tmp_path / "cells.csv").write_text(
        "variant,n_seeds,acc_mean,acc_ci95,acc_min,acc_max,acc_seeds\n"
        "fedcart,3,0.621,0.320,0.474,0.714,0:0.714 1:0.474 2:0.676\n"
    )
    opts = {"source": "cells.csv", "columns": "variant,acc"}

    def row(extra: dict[str, str]) -> str:  # the table's last row (PM_NOTE follows it)
        return [ln for ln in render.render(opts | extra, tmp_path).splitlines() if ln][-2]

    assert row({}) == "| fedcart | 0.621 ± 0.320 [0.474, 0.714] |"
    assert row({"spread": "seeds"}) == "| fedcart | 0.621 ± 0.320 (0.714, 0.474, 0.676) |"
    assert row({"spread": "none"}) == "| fedcart | 0.621 ± 0.320 |"


def test_collect_writes_per_round_curves_over_the_seeds(tmp_path) -> None:
    import json

    sweep = tmp_path / "g"
    rows = []
    for seed, vals in ((0, (0.2, 0.5)), (1, (0.4, 0.7))):
        run = sweep / f"a_seed={seed}"
        run.mkdir(parents=True)
        recs = [{"round": r, "robust/worst": v, "test_acc": 0.9} for r, v in zip((5, 10), vals)]
        run.joinpath("metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))
        rows.append(f"a_seed={seed},a,{seed},10")
    (sweep / "comparison.csv").write_text("label,variant,seed,rounds\n" + "\n".join(rows) + "\n")
    out, cols = collect.round_rows(sweep)
    assert cols[:3] == ["variant", "round", "n_seeds"]
    assert [r["round"] for r in out] == [5, 10]
    assert [r["robust/worst_mean"] for r in out] == pytest.approx([0.3, 0.6])
    assert out[0]["robust/worst_min"] == 0.2 and out[1]["robust/worst_max"] == 0.7


def test_the_generated_presets_equal_their_generator(tmp_path, monkeypatch) -> None:
    gen = _tool("make_presets")
    out = tmp_path / "presets"
    (out / "grids").mkdir(parents=True)
    monkeypatch.setattr(gen, "OUT", out)
    gen.main()
    made = sorted(p.relative_to(out) for p in out.rglob("*.toml"))
    assert len(made) > 40
    pkg = ROOT / "src" / "fedshield" / "presets"
    stale = [str(p) for p in made if (pkg / p).read_text() != (out / p).read_text()]
    assert not stale, f"run `python tools/make_presets.py`: {stale}"
    # the ones the generator does not make say so (hand-written presets)
    for p in pkg.rglob("*.toml"):
        if p.relative_to(pkg) not in made:
            assert "generated by" not in p.read_text(), p


def test_rendering_worst_cases_over_several_sources(tmp_path) -> None:
    data = {
        "a.csv": "fedavg,noise,0.5\nfedavg,ipm,0.8\nbrdrag,noise,0.9\n",
        "b.csv": "fedavg,noise,0.2\nbrdrag,ipm,0.7\nbrdrag,noise,0.85\n",
    }
    for name, rows in data.items():
        (tmp_path / name).write_text("variant,attack.name,final_test_acc_mean\n" + rows)
    opts = {"worst": "variant,attack.name", "source": "a.csv,b.csv", "labels": "20%,40%"}
    assert render.render(opts, tmp_path).splitlines() == [
        "| variant | 20% | 40% |",
        "|---|---|---|",
        "| fedavg | 0.500 (noise) | 0.200 (noise) |",
        "| brdrag | 0.900 (noise) | 0.700 (ipm) |",
    ]


def test_the_readme_defense_and_attack_example_benches_as_printed(tmp_path) -> None:
    """The README's "Add your own defense and attack" — a plugin module and a
    bench file, as printed there — benched from the command line without editing the
    library: both plugins run, the tables name them, and a misspelt parameter of the
    plugin's schema is one line with a did-you-mean."""
    import csv
    import re

    from fedshield.cli import main

    text = (ROOT / "README.md").read_text()
    module = re.search(r"```python\n(# my_rules\.py.*?)```", text, re.S)
    bench = re.search(r"```toml\n(# my-bench\.toml.*?)```", text, re.S)
    assert module and bench, "the README's plugin example moved"
    (tmp_path / "my_rules.py").write_text(module.group(1))
    spec = bench.group(1).replace("rounds = 5", "rounds = 4")  # the same bench, shorter
    (tmp_path / "my-bench.toml").write_text(spec)
    out = tmp_path / "out"
    assert main(["bench", str(tmp_path / "my-bench.toml"), "--out", str(out), "-q"]) == 0
    rows = list(csv.DictReader((out / "runs.csv").open()))
    assert {r["defense"] for r in rows} == {"fedavg", "median", "drop_copies"}
    assert {r["attack"] for r in rows} == {"reverse_mean", "ipm"}
    acc = {(r["defense"], r["attack"]): float(r["test_acc"]) for r in rows}
    # the plugin attack takes FedAvg to chance; the plugin defense drops the attackers'
    # identical rows and trains on the honest ones
    assert acc[("fedavg", "reverse_mean")] < 0.15
    assert acc[("drop_copies", "reverse_mean")] > acc[("fedavg", "reverse_mean")] + 0.2
    bad = tmp_path / "bad.toml"
    typo = '{ name = "drop_copies", set = ["server.aggregator_args.rtl=0.1"] }'
    bad.write_text(spec.replace('"drop_copies"', typo))
    assert main(["bench", str(bad), "--out", str(tmp_path / "bad"), "-q"]) == 2


def test_the_usage_plugin_example_runs_from_the_cli(tmp_path, small_cfg) -> None:
    """docs/usage.md's "Your own components" code, as printed there, used from a TOML config."""
    import re
    import tomllib

    import tomli_w

    from fedshield.cli import main

    text = (ROOT / "docs" / "usage.md").read_text()
    module = re.search(r"```python\n(# my_rules\.py\n.*?)```", text, re.S)
    toml = re.search(r'```toml\n(plugins = \["my_rules\.py"\].*?)```', text, re.S)
    assert module and toml, "the plugin example of docs/usage.md moved"
    (tmp_path / "my_rules.py").write_text(module.group(1))
    snippet = tomllib.loads(toml.group(1))
    cfg = small_cfg | {"rounds": 2, "plugins": snippet["plugins"]}
    cfg["server"] = {**cfg["server"], **snippet["server"]}
    path = tmp_path / "exp.toml"
    path.write_text(tomli_w.dumps(cfg))
    assert main(["run", str(path), "--out", str(tmp_path / "run"), "-q"]) == 0
    saved = tomllib.loads((tmp_path / "run" / "config.toml").read_text())
    assert saved["server"]["aggregator"] == "half_mean"
    assert saved["server"]["aggregator_args"] == {"factor": 0.25}
    bad = tmp_path / "bad.toml"
    cfg["server"]["aggregator_args"] = {"facter": 0.25}
    bad.write_text(tomli_w.dumps(cfg))
    assert main(["run", str(bad), "--out", str(tmp_path / "bad")]) == 2  # did-you-mean


def test_the_python_api_section_runs_as_printed(tmp_path, monkeypatch) -> None:
    """A notebook-style Python API section (docs/usage.md since the README became
    a front page); `runner.run` returns the history."""
    import re

    text = (ROOT / "docs" / "usage.md").read_text()
    block = re.search(
        r"<!-- fedshield:api -->\n```python\n(.*?)```\n<!-- fedshield:end-api -->", text, re.S
    )
    assert block, "the Python API section of docs/usage.md moved"
    monkeypatch.chdir(tmp_path)
    ns: dict = {}
    exec(compile(block.group(1), "docs/usage.md (Python API)", "exec"), ns)
    result, history = ns["result"], ns["history"]
    assert result["status"] == "ok" and 0.0 < result["final_test_acc"] <= 1.0
    assert [r["round"] for r in history] == [1, 2, 3, 4, 5]
    assert ns["accuracy"][-1] == (5, result["final_test_acc"])
    # the history is what metrics.jsonl holds
    import json

    lines = (tmp_path / "runs" / "api-demo" / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(x)["round"] for x in lines] == [1, 2, 3, 4, 5]
    assert json.loads(lines[-1])["test_acc"] == history[-1]["test_acc"]


def test_a_verdict_per_budget_and_curves_from_the_per_run_budget_file(tmp_path) -> None:
    """The per-run, per-round file ``--collect`` writes beside the cells gives the
    paired verdict at every budget (``paired=A,B by=round``) and the curves with a band over
    the seeds (fedshield.results.curves). Worked example: B ahead at round 10 on 3 of 3 seeds, A
    ahead at round 20 on 3 of 3 (a crossing the final-round table alone would not show)."""
    import csv
    import json

    sweep = tmp_path / "s"
    comp = ["label,variant,seed,rounds"]
    worst = {"a": {10: [0.30, 0.32, 0.31], 20: [0.70, 0.72, 0.69]},
             "b": {10: [0.50, 0.55, 0.52], 20: [0.60, 0.61, 0.60]}}  # fmt: skip
    for v, by_round in worst.items():
        for seed in range(3):
            label = f"{v}_seed={seed}"
            (sweep / label).mkdir(parents=True)
            recs = [{"round": 5, "test_acc": 0.1}]  # a round without evaluators: no row
            recs += [{"round": r, "test_acc": 0.9, "robust/worst": by_round[r][seed]}
                     for r in (10, 20)]  # fmt: skip
            lines = "".join(json.dumps(r) + "\n" for r in recs)
            (sweep / label / "metrics.jsonl").write_text(lines)
            comp.append(f"{label},{v},{seed},20")
    (sweep / "comparison.csv").write_text("\n".join(comp) + "\n")
    rows, cols = collect.budget_rows(sweep)
    assert cols == ["variant", "seed", "round", "test_acc", "robust/worst"]
    assert len(rows) == 12 and {r["round"] for r in rows} == {10, 20}
    src = tmp_path / "budget.csv"
    with src.open("w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=cols)
        w.writeheader()
        w.writerows(rows)
    opts = {"paired": "a,b", "source": "budget.csv", "value": "robust/worst", "by": "round",
            "scale": "100"}  # fmt: skip
    table = render.render(opts, tmp_path)
    at10 = next(line for line in table.splitlines() if "@ round=10" in line)
    at20 = next(line for line in table.splitlines() if "@ round=20" in line)
    assert "b ahead" in at10 and "0 / 3" in at10 and "-21.3" in at10
    assert "a ahead" in at20 and "3 / 0" in at20 and "+10.0" in at20
    png = tmp_path / "fig.png"
    assert results_main(["curves", str(src), "--metrics", "robust/worst,test_acc",
                         "--out", str(png), "--budgets", "10,20"]) == 0  # fmt: skip
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    by_variant = curves.series(list(csv.DictReader(src.open())), "robust/worst", "variant")
    assert by_variant["a"][1] == (20, pytest.approx(0.70333333), 0.69, 0.72, 3)
    with pytest.raises(SystemExit, match="no column nope"):
        results_main(["curves", str(src), "--metrics", "nope", "--out", str(png)])

# -- the docs' enumerations and counts against the registries ------------------
_WORDS = {"three": 3, "four": 4, "five": 5, "six": 6, "seven": 7, "eight": 8, "nine": 9}


def _registered(kind: str) -> set[str]:
    from fedshield import cli

    return set(cli._registries()[kind].package_names())  # not test plugins


def test_config_help_lists_every_registered_member() -> None:
    from fedshield.config import ServerConfig

    for field, kind in (
        ("round_defenses", "round-defenses"),
        ("pre_aggregators", "pre-aggregators"),
    ):
        desc = ServerConfig.model_fields[field].description or ""
        listed = set(desc.split("(", 1)[1].split(";", 1)[0].replace(" ", "").split(","))
        assert listed == _registered(kind), (field, listed)


def test_readme_config_comments_and_counts_match_the_registries() -> None:
    import re

    text = (ROOT / "docs" / "usage.md").read_text()  # the config reference
    block = text[text.index('aggregator = "mean"') : text.index("e.g. { f = 2 }")]
    assert _registered("aggregators") <= set(re.findall(r"[a-z_]+", block))
    defenses = text[text.index("# round_defenses = ") : text.index("# pre_aggregators = ")]
    assert _registered("round-defenses") <= set(re.findall(r"[a-z_]+", defenses))
    n = re.search(r"\b(\w+) routing policies", (ROOT / "README.md").read_text())
    assert n and _WORDS[n.group(1)] == len(_registered("routing-policies"))
    for doc in ("README.md", "docs/bench.md"):
        for m in re.finditer(r"\bthe (\d+) attacks\b", (ROOT / doc).read_text()):
            assert int(m.group(1)) == len(_registered("attacks")), doc


def test_every_citation_resolves_in_the_repository() -> None:
    """Code, tests and docs cite a paper and its equation (short names in docs/references.md)
    or the docs page that explains a decision, never something a reader of the repository
    cannot open: a section of the specification, an issue number or a source file's number.
    The patterns are built from pieces so that this file does not match them itself."""
    import re

    spec = "SP" + "EC"
    patterns = {
        # prose only: the word before a section sign or 's, alone in parentheses, or after
        # "the"; never a code name that contains it
        "a specification section": re.compile(
            rf"(?<![\w.]){spec}(?:\s*§|'s\b)|(?<=\s)\({spec}[;,)]|\bthe {spec}\b"
        ),
        "an issue number": re.compile(r"\bissues?[\s-]+#?\d", re.IGNORECASE),
        "a seed file's number": re.compile(r"\bseeds?[\s-]+0" + r"0\d\b", re.IGNORECASE),
    }
    binary = {".png", ".pt", ".pdf", ".jpg", ".gz", ".npz", ".pyc"}
    import subprocess

    tops = ("src", "tests", "docs", "bench", "tools", "examples", ".ci")
    # the repository's own files: tracked or not ignored (an installed package's metadata,
    # src/*.egg-info, copies an older README)
    listed = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard", *tops],
        cwd=ROOT, capture_output=True, text=True, check=False,
    )  # fmt: skip
    paths = [ROOT / name for name in ("README.md", "Makefile", "pyproject.toml")]
    if listed.returncode == 0:
        paths += [ROOT / line for line in listed.stdout.splitlines()]
    else:  # not a git checkout (an sdist)
        for top in tops:
            paths += sorted(
                p for p in (ROOT / top).rglob("*") if p.is_file() and ".egg-info" not in str(p)
            )
    found = []
    for path in paths:
        if path.suffix in binary or "__pycache__" in path.parts or not path.exists():
            continue
        try:
            text = path.read_text(encoding="utf-8")
        except UnicodeDecodeError:
            continue
        for what, pattern in patterns.items():
            for m in pattern.finditer(text):
                line = text.count("\n", 0, m.start()) + 1
                found.append(f"{path.relative_to(ROOT)}:{line}: {what} ({m.group(0)!r})")
    assert not found, "cite the paper (docs/references.md) or a docs page instead:\n" + "\n".join(
        found
    )
