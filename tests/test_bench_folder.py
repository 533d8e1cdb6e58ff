"""A finished ``fedshield bench`` folder as a product: every run keeps its
resolved config and per-round metrics, the report is re-drawn from the run files alone,
``--only`` merges into the folder, every bad flag or file is one line before any work,
and the plots carry the spread across seeds and the runner-up."""

from __future__ import annotations

import csv
import json
import shutil
import tomllib
from pathlib import Path
from typing import Any

import pytest
import tomli_w

from fedshield import config as cfgmod
from fedshield.bench import runner
from fedshield.bench.curves import band, read_metrics
from fedshield.bench.folder import REPORT_FILES
from fedshield.bench.render import spread
from fedshield.bench.select import AttackCell
from fedshield.cli import main
from fedshield.provenance import sha256_text

TINY = Path(__file__).parents[1] / "src/fedshield/presets/benches/tiny-cpu.toml"
#: The tables: what --render and a merge must reproduce byte for byte.
TABLES = ("worst.md", "worst.csv", "cells.csv", "choice.csv", "asr.csv", "asr.md", "best.md")


def _bench_file(where: Path) -> Path:
    """tiny-cpu with two seeds (a spread to show) and no tuning: 8 runs of 3 rounds."""
    raw = tomllib.loads(TINY.read_text())
    raw |= {"name": "tiny-seeds", "seeds": [0, 1]}
    raw.pop("tune")
    path = where / "tiny-seeds.toml"
    path.write_text(tomli_w.dumps(raw))
    return path


@pytest.fixture(scope="module")
def finished(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """(bench file, its finished output folder); tests copy the folder before changing it."""
    where = tmp_path_factory.mktemp("bench")
    bench = _bench_file(where)
    assert main(["bench", str(bench), "--out", str(where / "out"), "-q"]) == 0
    return bench, where / "out"


def _copy(finished: tuple[Path, Path], tmp_path: Path) -> Path:
    out = tmp_path / "out"
    shutil.copytree(finished[1], out)
    return out


def test_each_run_keeps_its_resolved_config_and_round_metrics(
    finished: tuple[Path, Path],
) -> None:
    out = finished[1]
    records = [json.loads(p.read_text()) for p in sorted((out / "cells").glob("*.json"))]
    assert len(records) == 2 * 2 * 2  # defenses × attacks × seeds
    for rec in records:
        folder = out / "runs" / rec["id"]
        text = (folder / "config.toml").read_text()
        assert sha256_text(text) == rec["config_sha256"]  # the config that made the record
        cfg = cfgmod.validate(tomllib.loads(text))
        assert cfg.attack.name == rec["attack"] and cfg.seed == rec["seed"]
        rows = list(csv.DictReader((folder / "metrics.csv").open()))
        assert [int(r["round"]) for r in rows] == [1, 2, 3]
        assert all(r["test_acc"] and r["test_loss"] and r["train/loss"] for r in rows)
        assert float(rows[-1]["test_acc"]) == rec["test_acc"]
        if rec["attack"] == "backdoor":  # the ASR over rounds, its last the record's
            assert all(r["backdoor/asr"] for r in rows)
            assert float(rows[-1]["backdoor/asr"]) == rec["backdoor_asr"]


def test_the_report_is_redrawn_from_the_run_files_alone(
    finished: tuple[Path, Path], tmp_path: Path
) -> None:
    out = _copy(finished, tmp_path)
    before = {f: (out / f).read_bytes() for f in (*TABLES, "runs.csv", "header.md")}
    for f in REPORT_FILES:
        (out / f).unlink(missing_ok=True)
    for png in out.glob("*.png"):
        png.unlink()
    assert main(["bench", "--render", str(out)]) == 0
    assert {f: (out / f).read_bytes() for f in before} == before
    for d in ("median", "nnm+trimmed_mean"):
        assert (out / f"heatmap-{d}.png").stat().st_size > 0
        assert (out / f"curves-{d}.png").stat().st_size > 0
    assert (out / "best.png").stat().st_size > 0


def test_only_merges_into_a_finished_folder(
    finished: tuple[Path, Path], tmp_path: Path, monkeypatch: Any
) -> None:
    """Re-running one cell keeps the rest: the tables are drawn from every run present
    (one of another commit included, named in the header), stale plots are removed."""
    bench, _ = finished
    out = _copy(finished, tmp_path)
    before = {f: (out / f).read_text() for f in TABLES}
    for p in (out / "cells").glob("median__ipm__*.json"):
        p.unlink()
    other = next((out / "cells").glob("nnm+trimmed_mean__ipm__*.json"))
    rec = json.loads(other.read_text())
    other.write_text(json.dumps(rec | {"commit": "0123456789abcdef"}))
    (out / "heatmap-krum.png").write_bytes(b"stale")  # a defense the bench no longer has
    ran: list[int] = []
    real = runner.run_group

    def counting(raws: Any, lockstep: bool = True) -> Any:
        ran.append(len(raws))
        return real(raws, lockstep)

    monkeypatch.setattr(runner, "run_group", counting)
    argv = ["bench", str(bench), "--out", str(out), "-q", "--only", "defense=median,attack=ipm"]
    monkeypatch.setattr("sys.argv", ["fedshield", *argv])  # what the header quotes
    assert main(argv) == 0
    assert sum(ran) == 2  # the two seeds of median × ipm, nothing else
    assert {f: (out / f).read_text() for f in TABLES} == before
    header = (out / "header.md").read_text()
    assert "defense=median,attack=ipm" in header and "`0123456789ab`" in header
    assert not (out / "heatmap-krum.png").exists()
    assert (out / "heatmap-nnm+trimmed_mean.png").exists()


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["--bench", "tiny-cpu", "--out", "{file}"], "--out {file}: is a file"),
        (["--bench", "tiny-cpu", "--out", "{finished}"], "holds bench 'tiny-seeds'"),
        (["--bench", "tiny-cpu", "--out", ""], "--out: empty"),
        (["--bench", "tiny-cpu", "--out", "{file}/o"], "--out {file}/o: cannot write there"),
        (["--render", "{tmp}/missing"], "no such folder"),
        (["--render", "{file}"], "is a file, not a bench folder"),
        (["--render", "{tmp}"], "no bench.json"),
        (["--render", "{finished}", "--only", "defense=median"], "drop --only"),
        (["--bench", "tiny-cpu", "--out", "{tmp}/o", "--only", "seed=7"], "no run of bench"),
    ],
)
def test_bad_flags_and_files_are_one_line_before_any_work(
    args: list[str], needle: str, finished: tuple[Path, Path], tmp_path: Path, capsys: Any,
    monkeypatch: Any,
) -> None:  # fmt: skip
    def no_work(*_: Any, **__: Any) -> Any:
        raise AssertionError("trained")

    monkeypatch.setattr(runner, "run_group", no_work)
    (tmp_path / "file").write_text("x")
    names = {"file": str(tmp_path / "file"), "finished": str(finished[1]), "tmp": str(tmp_path)}
    argv = ["bench", *(a.format(**names) for a in args)]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and err.count("\n") == 1, err
    assert needle.format(**names) in err
    assert not (tmp_path / "o").exists()


def test_heat_map_cells_show_the_spread_and_best_names_the_runner_up(
    finished: tuple[Path, Path],
) -> None:
    assert spread(AttackCell("ipm", [0.4, 0.6], 0)) == "0.50 ± 0.14"  # sd of {0.4, 0.6}
    assert spread(AttackCell("ipm", [0.4], 0)) == "0.40"
    assert spread(AttackCell("ipm", [0.4], 1)) == "div. (1/2)"
    best = (finished[1] / "best.md").read_text()
    assert "runner-up" in best
    assert "median" in best and "nnm+trimmed_mean" in best


def test_curves_band_is_the_mean_and_sd_over_the_seeds(
    finished: tuple[Path, Path], tmp_path: Path
) -> None:
    xs, mean, sd = band([{1: 0.2, 2: 0.4}, {1: 0.4, 2: float("nan")}, {1: 0.6}])
    assert xs == [1, 2]  # a diverged seed's non-finite value is left out
    assert mean == pytest.approx([0.4, 0.4]) and sd == pytest.approx([0.2, 0.0])
    run = next((finished[1] / "runs").glob("median__backdoor__*"))
    m = read_metrics(run / "metrics.csv")
    assert sorted(m["test_acc"]) == [1, 2, 3] and sorted(m["backdoor/asr"]) == [1, 2, 3]
    assert read_metrics(tmp_path / "missing.csv") == {}
