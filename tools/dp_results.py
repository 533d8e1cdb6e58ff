"""docs/results/dp.md from the result files of the ``dp-cpu`` sweep (accuracy vs ε).

    fedshield sweep --grid dp-cpu --out runs/dp-cpu
    python tools/dp_results.py runs/dp-cpu --out docs/results/dp.md

Reads ``comparison.csv`` (final test accuracy per run, with the sweep's parameters) and
each run's ``privacy.json`` (the ε(δ) the run's accountant reported after its last round).
Rows: defense × attack (the variant ``<defense>-<attack>``); columns: ε, largest first.
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import tomllib
from pathlib import Path

Z_KEY = "privacy.central.noise_multiplier"
DEFENSES = {"fedavg": "FedAvg (mean)", "brdrag": "BR-DRAG", "median": "Median"}
ATTACKS = {"none": "no attack", "noise": "20 % noise", "signflip": "20 % sign flip"}


def load(sweep: Path) -> tuple[list[dict[str, str]], dict[str, dict]]:
    rows = list(csv.DictReader((sweep / "comparison.csv").open()))
    for r in rows:  # the run's folder: comparison.csv names it `label`
        r.setdefault("name", r["label"])
    privacy = {
        r["name"]: json.loads((sweep / r["name"] / "privacy.json").read_text()) for r in rows
    }
    return rows, privacy


def eps_label(eps: float | None) -> str:
    return "∞ (clip only)" if eps is None or not math.isfinite(eps) else f"{eps:.2f}"


def table(rows: list[dict[str, str]], privacy: dict[str, dict]) -> str:
    # ε per noise multiplier (the same for every variant: same q, steps, δ)
    eps_of: dict[float, float | None] = {}
    cell: dict[tuple[str, float], float] = {}
    for r in rows:
        z = float(r[Z_KEY])
        eps_of[z] = privacy[r["name"]]["central"]["epsilon"]
        cell[(r["variant"], z)] = float(r["final_test_acc"])
    zs = sorted(eps_of)  # ε decreases as z grows
    head = "| defense | attack | " + " | ".join(f"ε = {eps_label(eps_of[z])}" for z in zs) + " |"
    lines = [head, "|---|---|" + "---:|" * len(zs)]
    variants = list(dict.fromkeys(r["variant"] for r in rows))
    order = [f"{d}-{a}" for d in DEFENSES for a in ATTACKS]
    for v in sorted(variants, key=lambda v: order.index(v) if v in order else len(order)):
        d, _, a = v.partition("-")
        vals = " | ".join(f"{cell[(v, z)]:.3f}" if (v, z) in cell else "-" for z in zs)
        lines.append(f"| {DEFENSES.get(d, d)} | {ATTACKS.get(a, a)} | {vals} |")
    zrow = "| noise multiplier z | | " + " | ".join(f"{z:g}" for z in zs) + " |"
    return "\n".join([*lines, zrow]) + "\n"


def setting(sweep: Path, rows: list[dict[str, str]], privacy: dict[str, dict]) -> str:
    cfg = tomllib.loads((sweep / rows[0]["name"] / "config.toml").read_text())
    c = next(iter(privacy.values()))["central"]
    d, s = cfg["data"], cfg["server"]
    return (
        f"Setting (grid `dp-cpu`, base preset `brdrag-digits-cpu`): scikit-learn `digits`, "
        f"{cfg['data']['root_size']} root samples for BR-DRAG, the rest split over "
        f"M = {d['num_clients']} clients by Dirichlet β = {d['beta']}, "
        f"S = {s['clients_per_round']} per round (q = {c['sample_rate']:g}), MLP "
        f"({cfg['model']['params']['hidden']} hidden), U = {cfg['client']['local_steps']} local "
        f"steps, lr {cfg['client']['lr']}, {cfg['rounds']} rounds, uniform weighting, seed "
        f"{cfg['seed']}. Client-level DP-FedAvg: C = {c['clip']}, δ = {c['delta']:g}, ε from "
        f"Opacus' RDP accountant after the last round. Attacks: ⌊0.2·S⌋ Byzantine clients in "
        f'every round (`attack.mode = "per_round"`), noise σ = 1 / sign flip k = 1, their '
        f"rows clipped like every other. Entries: final test accuracy (360 test images).\n"
    )


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("sweep_dir")
    ap.add_argument("--out", help="write the Markdown page here (default: print the table)")
    args = ap.parse_args()
    sweep = Path(args.sweep_dir)
    rows, privacy = load(sweep)
    tab = table(rows, privacy)
    if not args.out:
        print(tab)
        return
    text = (
        "# Differential privacy: accuracy vs ε (client-level DP-FedAvg)\n\n"
        # the data's commit and the command (`make results PAGE=dp`), from its provenance
        "<!-- fedshield:table page=dp -->\n<!-- fedshield:end -->\n\n"
        + setting(sweep, rows, privacy)
        + "\n"
        + tab
        + "\n<!-- observations -->\n"
    )
    out = Path(args.out)
    old = out.read_text() if out.exists() else ""
    if "<!-- observations -->" in old:  # keep the hand-written reading of the table
        text += old.split("<!-- observations -->", 1)[1].lstrip("\n")
    out.write_text(text)


if __name__ == "__main__":
    main()
