"""Record, afterwards, the provenance of result files collected before sweeps recorded it.

    python tools/backfill_provenance.py            # write the missing *.provenance.json

For every ``docs/results/data/<grid>[-cells].csv`` that no ``<grid>.provenance.json``
covers: the commit is the last one that changed the file (the commit that collected it),
and the config hashes are those of the grid's runs as that commit's code resolves them
(``fedshield sweep --grid <grid>`` with the seeds read from the run labels and the
``--set`` options of the grid jobs in docs/results/pages.toml), i.e. the
``config_sha256`` each run's summary would have recorded. The record says
``"recorded": "afterwards ..."``; re-measuring a grid and collecting it replaces it with
the sweep's own record. ``robustness.csv`` (made by ``tools/robustness_report.py``, not a
sweep) gets the hash of the fuzz's definition at that commit instead.
"""

from __future__ import annotations

import csv
import hashlib
import json
import re
import subprocess
import sys
import tarfile
import tempfile
from io import BytesIO
from pathlib import Path

from fedshield.results.collect import PROVENANCE, SELF_RECORDING, check_provenance

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "docs" / "results" / "data"

#: The ``--set`` options the grid jobs of docs/results/pages.toml pass.
MEASURE_SETS = {g: ["eval.every=20", "eval.metrics_every=20"] for g in (
    "fedcart-ablations-cpu", "fedcart-rho-cpu", "fedcart-plugins-cpu", "fedcart-baselines-cpu",
)}  # fmt: skip

#: Run in a subprocess against one commit's sources: the config hash of every run.
INNER = """
import hashlib, json, sys
from fedshield import config
from fedshield.sim.builder import build_components
from fedshield.sweep import expand, read_grid
grid, seeds, sets = sys.argv[1], json.loads(sys.argv[2]), json.loads(sys.argv[3])
spec, where = read_grid(grid=grid)
spec["set"] = [*spec.get("set", []), *sets]
_, runs = expand(spec, where, seeds or None)
out = {}
for r in runs:
    cfg = config.validate(r.raw)
    build_components(cfg)  # resolves defaults (an algorithm's own aggregator), as a run does
    out[r.name] = hashlib.sha256(config.dump(cfg).encode()).hexdigest()
print(json.dumps(out))
"""


def git(*args: str) -> str:
    return subprocess.run(
        ["git", "-C", str(ROOT), *args], check=True, capture_output=True, text=True
    ).stdout.strip()


def export(commit: str, dest: Path) -> Path:
    """The ``src`` and ``tools`` trees of ``commit`` under ``dest`` (no work tree)."""
    raw = subprocess.run(
        ["git", "-C", str(ROOT), "archive", commit, "src", "tools"], check=True, capture_output=True
    ).stdout
    with tarfile.open(fileobj=BytesIO(raw)) as tar:
        tar.extractall(dest, filter="data")
    return dest


def run_hashes(src: Path, grid: str, seeds: list[int], sets: list[str]) -> dict[str, str]:
    res = subprocess.run(
        [sys.executable, "-c", INNER, grid, json.dumps(seeds), json.dumps(sets)],
        env={"PYTHONPATH": str(src / "src"), "PATH": "/usr/bin:/bin"},
        check=True, capture_output=True, text=True,
    )  # fmt: skip
    return json.loads(res.stdout.strip().splitlines()[-1])


def combined(hashes: dict[str, str]) -> str:
    text = "".join(f"{k} {v}\n" for k, v in sorted(hashes.items()))
    return hashlib.sha256(text.encode()).hexdigest()


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def backfill(name: str, files: list[Path], tmp: Path) -> dict:
    commit = git("log", "-1", "--format=%H", "--", *[str(f) for f in files])
    src = tmp / commit
    if not src.exists():
        export(commit, src)
    record = {
        "recorded": "afterwards (tools/backfill_provenance.py): commit = the commit that "
        "collected the files; config hashes = the grid's runs resolved by that commit's code",
        "commits": [commit],
        "files": {f.name: sha256(f) for f in files},
    }
    if name == "robustness":
        defs = ("tools/robustness_report.py", "src/fedshield/testing/fuzz.py")
        text = "".join((src / d).read_text() for d in defs)
        record["config_sha256"] = hashlib.sha256(text.encode()).hexdigest()
        record["config"] = "the fuzz's definition: " + " + ".join(defs)
        record["command"] = ["python", "tools/robustness_report.py"]
        return record
    labels = [row["label"] for row in csv.DictReader((DATA / f"{name}.csv").open())]
    seeds = sorted({int(m.group(1)) for lb in labels if (m := re.search(r"_seed=(\d+)$", lb))})
    sets = MEASURE_SETS.get(name, [])
    runs = run_hashes(src, name, seeds, sets)
    if sorted(runs) != sorted(labels):
        raise SystemExit(f"{name}: the grid at {commit[:8]} does not give the runs of the file")
    command = ["fedshield", "sweep", "--grid", name]
    if seeds:
        command += ["--seeds", ",".join(map(str, seeds))]
    for s in sets:
        command += ["--set", s]
    record.update(grid=name, command=command, config_sha256=combined(runs), runs=runs)
    return record


def main() -> int:
    groups: dict[str, list[Path]] = {}
    covered = {
        n for side in DATA.glob(f"*{PROVENANCE}") for n in json.loads(side.read_text())["files"]
    }
    for f in sorted(DATA.glob("*.csv")):
        if f.name not in covered and f.name not in SELF_RECORDING:
            stem = f.name.removesuffix(".csv").removesuffix("-cells").removesuffix("-curves")
            stem = stem.removesuffix("-rounds")
            groups.setdefault(stem, []).append(f)
    with tempfile.TemporaryDirectory() as tmp:
        for name, files in groups.items():
            record = backfill(name, files, Path(tmp))
            side = DATA / f"{name}{PROVENANCE}"
            side.write_text(json.dumps(record, indent=2, sort_keys=True) + "\n")
            print(f"recorded {side.relative_to(ROOT)} ({record['commits'][0][:8]})")
    problems = check_provenance()
    for p in problems:
        print(f"provenance: {p}")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
