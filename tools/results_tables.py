"""Turn sweep outputs into the Markdown tables of docs/results/ (run after the sweeps).

    python tools/results_tables.py runs/brdrag-attacks-20-cpu --pivot variant attack.name
    python tools/results_tables.py runs/drag-baselines-cpu --pivot variant data.beta
"""

from __future__ import annotations

import argparse
import csv
from pathlib import Path


def pivot(rows: list[dict[str, str]], row_key: str, col_key: str, value: str) -> str:
    rkeys = list(dict.fromkeys(r[row_key] for r in rows))
    ckeys = list(dict.fromkeys(r[col_key] for r in rows))
    cell = {(r[row_key], r[col_key]): r.get(value, "") for r in rows}
    lines = [f"| {row_key} \\ {col_key} | " + " | ".join(ckeys) + " |"]
    lines.append("|---" * (len(ckeys) + 1) + "|")
    for rk in rkeys:
        vals = []
        for ck in ckeys:
            v = cell.get((rk, ck), "")
            try:
                vals.append(f"{float(v):.3f}")
            except ValueError:
                vals.append(v or "-")
        lines.append(f"| {rk} | " + " | ".join(vals) + " |")
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("sweep_dir")
    ap.add_argument("--pivot", nargs=2, metavar=("ROW", "COL"))
    ap.add_argument("--value", default="final_test_acc")
    args = ap.parse_args()
    rows = list(csv.DictReader((Path(args.sweep_dir) / "comparison.csv").open()))
    if args.pivot:
        print(pivot(rows, *args.pivot, args.value))


if __name__ == "__main__":
    main()
