"""The README and docs/results are produced from result files, and the presets from their
generator: both checked here, so neither can go stale."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _tool(name: str):  # noqa: ANN202
    spec = importlib.util.spec_from_file_location(name, ROOT / "tools" / f"{name}.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    spec.loader.exec_module(mod)
    return mod


def test_every_results_table_equals_its_rendering_from_the_data() -> None:
    render = _tool("render_results")
    stale = [
        p.name for p in render.documents() if render.render_document(p.read_text()) != p.read_text()
    ]
    assert not stale, f"run `python tools/render_results.py`: {stale}"


def test_rendering_a_pivot_with_seed_intervals(tmp_path) -> None:  # noqa: ANN001
    render = _tool("render_results")
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
    ]
