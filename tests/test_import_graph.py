"""No import circle in src/fedshield: every import counts — at module level,
inside a function, under TYPE_CHECKING (fedshield.testing.imports)."""

from __future__ import annotations

from pathlib import Path

from fedshield.testing.imports import cycles, import_graph

SRC = Path(__file__).resolve().parents[1] / "src" / "fedshield"


def test_no_import_circle_in_the_package() -> None:
    graph = import_graph(SRC, "fedshield")
    assert len(graph) > 100  # the whole package was read
    found = cycles(graph)
    assert not found, [" -> ".join(c) for c in found]


def test_the_reader_finds_a_circle_and_lazy_and_type_only_imports(tmp_path) -> None:
    pkg = tmp_path / "pkg"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "sub" / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from pkg.sub import b\n")
    (pkg / "sub" / "b.py").write_text("def f():\n    from pkg import c\n")
    (pkg / "c.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from . import a\n"
    )
    (pkg / "d.py").write_text("import pkg.a\n")
    graph = import_graph(pkg, "pkg")
    assert graph["pkg.a"] == {"pkg.sub.b"} and graph["pkg.d"] == {"pkg.a"}
    assert cycles(graph) == [["pkg.a", "pkg.c", "pkg.sub.b"]]


#: The round loop and everything that drives it. Nothing below them imports them (the
#: simulator once imported ``privacy`` and ``tracking``, which imported the simulator
#: back): components, mechanisms and trackers are used by the loop, never the other way.
UPPER = ("sim", "flower", "runner", "cli", "sweep", "sweep_cells", "sweep_ray", "bench",
         "report", "console_summary", "results", "testing", "search", "__main__")  # fmt: skip


def test_no_module_below_the_round_loop_imports_it() -> None:
    graph = import_graph(SRC, "fedshield")

    def layer(module: str) -> str:
        return module.split(".")[1] if "." in module else ""

    found = sorted(
        f"{m} -> {d}"
        for m, deps in graph.items()
        if layer(m) and layer(m) not in UPPER
        for d in deps
        if layer(d) in UPPER
    )
    assert not found, found


def test_only_the_results_command_imports_the_results_pages() -> None:
    """The results pages' modules (fedshield.results.make, render, paired, ...) are imported
    by each other and by the ``fedshield results`` command when it runs, never by the run
    side (:data:`fedshield.results.RUN_SIDE`: store, validity, campaign) or anything else of
    the package: a run's record hashes the modules its process loaded, so changing how pages
    are made or rendered leaves every stored run valid (tests/test_run_store.py runs one)."""
    from fedshield.results import RUN_SIDE

    graph = import_graph(SRC, "fedshield")
    pages = {m for m in graph if m.startswith("fedshield.results.") and m not in RUN_SIDE}
    assert {"fedshield.results.make", "fedshield.results.render"} <= pages
    entry = pages | {"fedshield.results.__main__"}
    found = sorted(f"{m} -> {d}" for m, deps in graph.items() if m not in entry
                   for d in deps & pages)  # fmt: skip
    assert not found, found
