"""How much the demo table depends on the CPU's float kernels.

    python tools/demo_kernels.py                 # 3 demo sweeps (~1 min each), then the table
    python tools/demo_kernels.py --from runs/demo-kernels   # only the table, from done sweeps

Runs ``fedshield sweep --grid demo`` once on this machine's own kernels (``native``) and
once under each kernel variant of ``tools/kernel_variants.sh`` (its ``variant ...`` lines:
MKL's ``COMPATIBLE`` and ``AVX2`` paths with ATen's and oneDNN's matching ISA), each into
``<work>/<variant>``, and writes ``docs/results/data/demo-kernels.csv``: per demo row the
final and best test accuracy under every variant, their min, max and spread (max − min),
with ``demo-kernels.provenance.json`` beside it (the sweeps' commits, config hashes and
the kernel signature of every variant, and the file's SHA-256). The config hashes must be
the same for every variant: only the kernels differ.

Why: the coordinate-wise median and the attacked FedAvg amplify last-bit differences of the
convolution and matmul kernels (tests/test_results_fresh.py), so the demo's third digit is
not the same on every CPU. ``fedshield results render`` renders the file like any other
(``columns=label,final_test_acc_native,...,final_test_acc_spread``).
"""

from __future__ import annotations

import argparse
import csv
import hashlib
import json
import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "docs" / "results" / "data"
VARIANTS_SH = ROOT / "tools" / "kernel_variants.sh"
METRICS = ("final_test_acc", "best_test_acc")
NAME = "demo-kernels"


def kernel_variants() -> dict[str, dict[str, str]]:
    """``{name: env}``: ``native`` (no change) and each ``variant`` line of
    tools/kernel_variants.sh, named by its ``MKL_CBWR`` value (``compatible``, ``avx2``)."""
    out: dict[str, dict[str, str]] = {"native": {}}
    for line in VARIANTS_SH.read_text().splitlines():
        m = re.match(r"\s*variant\s+\w+\s+((?:\w+=\S+\s*)+)$", line)
        if m:
            env = dict(item.split("=", 1) for item in m.group(1).split())
            out[env.get("MKL_CBWR", f"v{len(out)}").lower()] = env
    if len(out) < 2:
        raise SystemExit(f"{VARIANTS_SH}: no `variant LEVEL VAR=value ...` lines")
    return out


def run_sweeps(work: Path, variants: dict[str, dict[str, str]]) -> None:
    for name, env in variants.items():
        out = work / name
        print(f"== demo under {name}: {' '.join(f'{k}={v}' for k, v in env.items()) or '-'}")
        subprocess.run(
            [sys.executable, "-m", "fedshield", "sweep", "--grid", "demo", "-j", "1", "-q",
             "--out", str(out)],
            env={**os.environ, "OMP_NUM_THREADS": "1", **env}, check=True,
        )  # fmt: skip


def table(work: Path, variants: list[str]) -> tuple[list[dict[str, str]], list[str]]:
    """One row per demo run: every metric under every variant, min, max and spread."""
    per = {
        v: {r["label"]: r for r in csv.DictReader((work / v / "comparison.csv").open())}
        for v in variants
    }
    labels = list(per[variants[0]])
    cols = ["label"]
    for m in METRICS:
        cols += [f"{m}_{v}" for v in variants] + [f"{m}_min", f"{m}_max", f"{m}_spread"]
    rows = []
    for label in labels:
        row = {"label": label}
        for m in METRICS:
            vals = [float(per[v][label][m]) for v in variants]
            row |= {f"{m}_{v}": f"{x:.4f}" for v, x in zip(variants, vals)}
            lo, hi = min(vals), max(vals)
            row |= {f"{m}_min": f"{lo:.4f}", f"{m}_max": f"{hi:.4f}"}
            row[f"{m}_spread"] = f"{hi - lo:.4f}"
        rows.append(row)
    return rows, cols


def provenance(work: Path, variants: list[str], files: list[Path]) -> dict[str, object]:
    provs = {v: json.loads((work / v / "provenance.json").read_text()) for v in variants}
    hashes = {p["config_sha256"] for p in provs.values()}
    if len(hashes) != 1:
        raise SystemExit(f"the variants ran different configs ({sorted(hashes)}): not comparable")
    first = provs[variants[0]]
    return {
        "grid": "demo",
        "recorded": "tools/demo_kernels.py: the demo grid under each kernel variant",
        "command": ["python", "tools/demo_kernels.py"],
        "commits": sorted({c for p in provs.values() for c in p["commits"]}),
        "dirty": any(p["dirty"] for p in provs.values()),
        "config_sha256": first["config_sha256"],
        "runs": first["runs"],
        "variants": {v: provs[v]["kernels"] for v in variants},
        "kernels": [k for v in variants for k in provs[v]["kernels"]],
        "fedshield": first["fedshield"],
        "torch": first["torch"],
        "python": first["python"],
        "machine": first["machine"],
        "files": {f.name: hashlib.sha256(f.read_bytes()).hexdigest() for f in files},
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--work", default="runs/demo-kernels", help="where the sweeps go")
    ap.add_argument("--from", dest="done", action="store_true",
                    help="do not run: tabulate the sweeps already in --work")  # fmt: skip
    ap.add_argument("--data", default=str(DATA), help="where the CSV and provenance go")
    args = ap.parse_args(argv)
    work, data = Path(args.work), Path(args.data)
    variants = kernel_variants()
    if not args.done:
        run_sweeps(work, variants)
    rows, cols = table(work, list(variants))
    data.mkdir(parents=True, exist_ok=True)
    out = data / f"{NAME}.csv"
    with out.open("w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=cols)
        w.writeheader()
        w.writerows(rows)
    prov = provenance(work, list(variants), [out])
    side = data / f"{NAME}.provenance.json"
    side.write_text(json.dumps(prov, indent=2, sort_keys=True) + "\n")
    for r in rows:
        print(r["label"], *(f"{m}: {r[f'{m}_min']}-{r[f'{m}_max']}" for m in METRICS))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
