"""Run the full round-loop fuzz cross product and write docs/results/robustness.md.

    python tools/robustness_report.py [--out docs/results/robustness.md]

Every (server algorithm, aggregator) pair the registries allow, with and without coverage
masks, × every corruption of ``fedshield.testing.fuzz.CORRUPTIONS`` × 1, 5 and 10 bad rows
of 10. The tables are computed from the case results, never typed by hand.
"""

from __future__ import annotations

import argparse
import collections
import logging
import time
from pathlib import Path

import torch

from fedshield.testing import fuzz

#: Everything after this line of the output file is kept as it is.
KEEP = "<!-- robustness_report: everything below is kept -->"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="docs/results/robustness.md")
    args = ap.parse_args()
    torch.set_num_threads(1)
    logging.disable(logging.WARNING)
    t0 = time.perf_counter()
    results, refused = [], []
    for masks in (False, True):
        for server, agg in fuzz.pairs(masks):
            pair = fuzz.make_pair(server, agg, masks)
            if pair is None:
                refused.append((server, agg, masks))
                continue
            for c in fuzz.CORRUPTIONS:
                for k in fuzz.POSITIONS:
                    results.append(fuzz.run_case(pair, c, k))
    ran = [r for r in results if not r.skipped]
    poisoned = [r for r in ran if not r.finite or r.error]
    unbounded = [r for r in ran if not r.bounded]
    robust_minor = [r for r in ran if r.robust and 2 * r.bad_rows < 10]
    frozen = [r for r in robust_minor if r.held]
    reasons: collections.Counter[str] = collections.Counter()
    for r in ran:
        for k, v in r.rejected.items():
            reasons[k.removeprefix("sys/rejected/")] += int(v)
    by_corruption: dict[str, collections.Counter[str]] = collections.defaultdict(
        collections.Counter
    )
    for r in ran:
        c = by_corruption[r.corruption]
        c["cases"] += 1
        c["rejected rows"] += int(sum(r.rejected.values()))
        c["θ kept (all rejected / rule could not run / non-finite step)"] += int(r.held)
        c["poisoned"] += int(not r.finite or bool(r.error))
    pairs = {(r.server, r.aggregator, r.masks) for r in ran}
    lines = [
        "# Robustness of the round loop (SPEC §12)",
        "",
        "Produced by `python tools/robustness_report.py` (the full cross product of the "
        "fuzz harness `fedshield.testing.fuzz`; `tests/test_round_fuzz.py` runs a seeded "
        "sample of it in every test run).",
        "",
        f"- server × aggregator pairs: **{len(pairs)}** "
        f"({sum(1 for p in pairs if not p[2])} without, {sum(1 for p in pairs if p[2])} with "
        f"coverage masks); refused at build time by their tags: {len(refused)}",
        f"- crafted cases run: **{len(ran)}** ({len(results) - len(ran)} not applicable, "
        f"e.g. buffer corruptions on a model without buffers)",
        f"- **poisoned (θ, buffers or server state non-finite, or an exception): {len(poisoned)}**",
        f"- robust rule, minority of bad rows: {len(robust_minor)} cases; step above the "
        f"bound ‖θ⁺ − θ‖ ≤ {fuzz.BOUND:g}·max(η_g, 1)·B: **{len(unbounded)}**; round frozen "
        f"(θ kept although a robust rule had a majority of valid rows): **{len(frozen)}**",
        f"- wall time: {time.perf_counter() - t0:.0f} s on one thread",
        "",
        "B is the largest of the honest rows' norms, the root reference's norm and the "
        "clipping radius τ. Bad rows are 1, 5 or 10 of the cohort's 10: the widest-coverage "
        "clients first (with masks, the smallest coverage groups), else the first rows.",
        "",
        "## Rejections by reason (rows)",
        "",
        "| reason | rows |",
        "|---|---|",
        *[f"| `{k}` | {v} |" for k, v in sorted(reasons.items())],
        "",
        "## By corruption",
        "",
    ]
    cols = ["cases", "rejected rows", "θ kept (all rejected / rule could not run / "
            "non-finite step)", "poisoned"]  # fmt: skip
    lines += ["| corruption | " + " | ".join(cols) + " |", "|---" * (len(cols) + 1) + "|"]
    for name in fuzz.CORRUPTIONS:
        c = by_corruption.get(name)
        if c:
            lines.append(f"| `{name}` | " + " | ".join(str(c[k]) for k in cols) + " |")
    if refused:
        lines += ["", "## Refused at build time", ""]
        lines += [f"- `{s}` × `{a}`{' (masks)' if m else ''}" for s, a, m in refused]
    for title, rows in (("Poisoned cases", poisoned), ("Unbounded steps", unbounded)):
        if rows:
            lines += ["", f"## {title}", ""]
            lines += [
                f"- {r.server} × {r.aggregator}{' (masks)' if r.masks else ''}: "
                f"{r.corruption} ×{r.bad_rows} {r.error} {r.step_norm:.3g}/{r.bound:.3g}"
                for r in rows
            ]
    out = Path(args.out)
    # The attack-grid section below the marker (tools/attack_grid.py, rendered by
    # tools/render_results.py) is not this report's: keep it.
    kept = ""
    if out.exists() and KEEP in out.read_text():
        kept = "\n" + KEEP + out.read_text().split(KEEP, 1)[1]
    out.write_text("\n".join(lines) + "\n" + kept)
    # One summary row for the README (rendered by tools/render_results.py).
    summary = {
        "pairs": len(pairs),
        "pairs_with_masks": sum(1 for p in pairs if p[2]),
        "cases": len(ran),
        "rejected_rows": sum(reasons.values()),
        "poisoned": len(poisoned),
        "robust_minority_cases": len(robust_minor),
        "unbounded": len(unbounded),
        "frozen": len(frozen),
    }
    data = Path(args.out).parent / "data" / "robustness.csv"
    data.parent.mkdir(parents=True, exist_ok=True)
    data.write_text(",".join(summary) + "\n" + ",".join(str(v) for v in summary.values()) + "\n")
    print("\n".join(lines[:16]))


if __name__ == "__main__":
    main()
