"""Run the robustness fuzz and write docs/results/robustness.md with its data files.

    python tools/robustness_report.py [--out docs/results/robustness.md]

1. The round loop (``fedshield.testing.fuzz``): every (server algorithm, aggregator) pair the
   registries allow, with and without coverage masks, × every corruption × 1, 2, 5 and 10
   bad rows of 10 (the widest coverage first: with masks 2 rows are a minority of the cohort
   and the majority of the deepest tier), self-reported counts trusted (the count cap must
   hold by itself), and every rule with hyper-parameters also named without arguments.
2. Per rule, the worst step under a cohort minority placed in the smallest tier, as a
   multiple of the same round's honest step (finite forgeries only: what passes the checks).
3. The Flower transport (``fedshield.testing.flower_fuzz``): every Flower-native strategy ×
   duplicated, misrouted, unsampled, count-buying and count-less replies.
4. Resumed state: tampered checkpoints (``fedshield.sim.resume``).

Every table is computed from the case results, never typed by hand; the data files record
the commit that produced them.
"""

from __future__ import annotations

import argparse
import collections
import copy
import csv
import logging
import subprocess
import tempfile
import time
from pathlib import Path

import torch

from fedshield.testing import flower_fuzz, fuzz

#: Forgeries that pass every upload check (finite, right shape): what a rule must bound.
FINITE = ("huge_1e30", "huge_3e38", "norm_1e30", "scaled_minus_100", "count_2e53_huge")


def _commit() -> str:
    try:
        out = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=True
        )
        dirty = subprocess.run(["git", "status", "--porcelain"], capture_output=True, text=True)
        return out.stdout.strip() + ("+dirty" if dirty.stdout.strip() else "")
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def round_loop() -> tuple[list[fuzz.CaseResult], list[tuple[str, str, bool, bool]]]:
    results, refused = [], []
    variants = [(m, False) for m in (False, True)] + [(m, True) for m in (False, True)]
    for masks, defaults in variants:
        for server, agg in fuzz.pairs(masks):
            if defaults and agg not in fuzz.AGGREGATOR_ARGS:
                continue
            pair = fuzz.make_pair(server, agg, masks, defaults, trust_counts=True)
            if pair is None:
                refused.append((server, agg, masks, defaults))
                continue
            honest = fuzz.pair_honest_step(pair)
            for c in fuzz.CORRUPTIONS:
                for k in fuzz.POSITIONS:
                    results.append(fuzz.run_case(pair, c, k))
                    results[-1].honest_step = honest
    return results, refused


def tampered_checkpoints() -> tuple[int, int, list[str]]:
    """(refused, total, failures): every tamper kind on runs of three server × rule pairs."""
    from fedshield import config
    from fedshield.errors import DataError
    from fedshield.sim.builder import build
    from fedshield.sim.engine import Simulator

    kinds = {
        "theta_nan": lambda s: s.params.__setitem__(0, float("nan")),
        "theta_1e30": lambda s: s.params.fill_(1e30),
        "theta_float64": lambda s: setattr(s, "params", s.params.double()),
        "theta_shape": lambda s: setattr(s, "params", s.params[:-1]),
        "buffers_negative": lambda s: s.buffers.fill_(-1.0),
        "state_1e30": lambda s: [v.fill_(1e30) for v in s.server_state.values()],
        "state_shape": lambda s: [s.server_state.__setitem__(k, s.server_state[k][:3])
                                  for k in list(s.server_state)],  # fmt: skip
    }
    refused = total = 0
    failures = []
    for server, agg in (("fedavg", "centered_clipping"), ("drag", "drag"), ("fedacg", "median")):
        raw = fuzz.base_config(server, agg)
        raw |= {"rounds": 2}
        raw["eval"] = {"every": 1}
        raw["checkpoint"] = {"every": 1}
        with tempfile.TemporaryDirectory() as tmp:
            out = Path(tmp) / "run"
            Simulator(build(config.validate(raw)), out).run()
            saved = torch.load(out / "checkpoint.pt", weights_only=True)
            for name, tamper in kinds.items():
                from fedshield.sim.engine import RunState

                state = RunState.from_dict(copy.deepcopy(saved["state"]), torch.device("cpu"))
                if name.startswith("state") and not state.server_state:
                    continue
                tamper(state)
                torch.save({**saved, "state": state.to_dict()}, out / "checkpoint.pt")
                total += 1
                try:
                    Simulator(build(config.validate(raw)), out, resume=True)
                except DataError:
                    refused += 1
                else:
                    failures.append(f"{server} × {agg}: {name}")
            torch.save(saved, out / "checkpoint.pt")
    return refused, total, failures


#: Everything after this line of the output file is kept as it is.
KEEP = "<!-- robustness_report: everything below is kept -->"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="docs/results/robustness.md")
    args = ap.parse_args()
    torch.set_num_threads(1)
    logging.disable(logging.WARNING)
    commit = _commit()
    t0 = time.perf_counter()
    results, refused = round_loop()
    t_loop = time.perf_counter() - t0
    flower = flower_fuzz.run_cases()
    ck_refused, ck_total, ck_failures = tampered_checkpoints()
    wall = time.perf_counter() - t0

    ran = [r for r in results if not r.skipped]
    poisoned = [r for r in ran if not r.finite or r.error]
    unbounded = [r for r in ran if not r.bounded]
    robust_minor = [r for r in ran if r.robust and r.in_budget]
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
    pairs = {(r.server, r.aggregator, r.masks, r.defaults) for r in ran}

    # 2. the worst step per rule, attackers a cohort minority in the smallest tier
    tier: dict[tuple[str, bool], tuple[float, str]] = {}
    for r in ran:
        if not (r.masks and r.server == "fedavg" and r.robust and r.in_budget):
            continue
        if r.corruption not in FINITE or r.honest_step <= 0:
            continue
        key = (r.aggregator, r.defaults)
        ratio = r.step_norm / r.honest_step
        if ratio > tier.get(key, (-1.0, ""))[0]:
            tier[key] = (ratio, f"{r.corruption} ×{r.bad_rows}")
    tier_rows = [
        {
            "rule": agg,
            "arguments": "defaults" if defaults else str(fuzz.AGGREGATOR_ARGS.get(agg, {})),
            "worst_step_x_honest": f"{ratio:.2f}",
            "worst_forgery": what,
            "commit": commit,
        }
        for (agg, defaults), (ratio, what) in sorted(tier.items())
    ]

    # 3. the Flower transport
    fl_bad = [c for c in flower if c.error or c.kept > c.sampled or not c.bounded]
    fl_rows = []
    for name in flower_fuzz.STRATEGIES:
        cs = [c for c in flower if c.strategy == name]
        worst = max(cs, key=lambda c: c.step / max(c.honest_step, 1e-30))
        fl_rows.append(
            {
                "strategy": name,
                "robust": str(cs[0].robust),
                "max_kept_of_10": str(max(c.kept for c in cs)),
                "worst_step_x_honest": f"{worst.step / max(worst.honest_step, 1e-30):.3g}",
                "worst_forgery": worst.forgery,
                "commit": commit,
            }
        )

    lines = [
        "# Robustness of the round loop (docs/security.md)",
        "",
        "<!-- fedshield:table page=robustness -->",
        "<!-- fedshield:end -->",
        "",
        "Produced by `python tools/robustness_report.py` at commit "
        f"`{commit}` (the fuzz harnesses `fedshield.testing.fuzz` and "
        "`fedshield.testing.flower_fuzz`; `tests/test_round_fuzz.py` runs a seeded sample "
        "of them in every test run).",
        "",
        "## 1. The round loop",
        "",
        f"- server × aggregator pairs: **{len(pairs)}** "
        f"({sum(1 for p in pairs if not p[2])} without, {sum(1 for p in pairs if p[2])} with "
        f"coverage masks; {sum(1 for p in pairs if p[3])} with the rule named without "
        f"arguments); refused at build time by their tags: {len(refused)}",
        f"- crafted cases run: **{len(ran)}** ({len(results) - len(ran)} not applicable, "
        f"e.g. buffer corruptions on a model without buffers); self-reported counts trusted",
        f"- **poisoned (θ, buffers or server state non-finite, or an exception): {len(poisoned)}**",
        f"- robust rule, bad rows within what it tolerates (f, else a minority): "
        f"{len(robust_minor)} cases; step above the "
        f"bound ‖θ⁺ − θ‖ ≤ {fuzz.BOUND:g}·max(η_g, 1)·B: **{len(unbounded)}**; round frozen "
        f"(θ kept although a robust rule had a majority of valid rows): **{len(frozen)}**",
        f"- wall time: {t_loop:.0f} s on one thread ({wall:.0f} s with sections 3–4)",
        "",
        "B is the largest of the honest rows' norms, the root reference's norm and the "
        "clipping radius τ. Bad rows are 1, 2, 5 or 10 of the cohort's 10: the "
        "widest-coverage clients first (with masks — tiers [1, 2, 3] cycled — 2 rows are a "
        "minority of the cohort and the majority of the 3-client deepest tier), else the "
        "first rows.",
        "",
        "### Rejections by reason (rows)",
        "",
        "| reason | rows |",
        "|---|---|",
        *[f"| `{k}` | {v} |" for k, v in sorted(reasons.items())],
        "",
        "### By corruption",
        "",
    ]
    cols = ["cases", "rejected rows", "θ kept (all rejected / rule could not run / "
            "non-finite step)", "poisoned"]  # fmt: skip
    lines += ["| corruption | " + " | ".join(cols) + " |", "|---" * (len(cols) + 1) + "|"]
    for name in fuzz.CORRUPTIONS:
        c = by_corruption.get(name)
        if c:
            lines.append(f"| `{name}` | " + " | ".join(str(c[k]) for k in cols) + " |")
    lines += [
        "",
        "## 2. A cohort minority placed in the smallest tier",
        "",
        "Per rule (server `fedavg`, multi-exit clients with tiers [1, 2, 3]), the largest "
        "‖θ⁺ − θ‖ over the finite forgeries (" + ", ".join(f"`{c}`" for c in FINITE) + ") "
        "in 1 or 2 rows of 10 — the deepest tier's majority with 2 — as a multiple of the "
        "same round's honest step (a rule configured with f = 1 is held to 1 bad row). "
        "The per-block bound (docs/security.md) caps every "
        "coverage group at √2·κ·ρ*·√|G| (κ = 3).",
        "",
        "| rule | arguments | worst step / honest step | forgery |",
        "|---|---|---|---|",
        *[
            f"| `{r['rule']}` | {r['arguments']} | {r['worst_step_x_honest']} | "
            f"`{r['worst_forgery']}` |"
            for r in tier_rows
        ],
        "",
        "## 3. The Flower transport",
        "",
        f"{len(flower)} forged reply sets (every Flower-native strategy × "
        + ", ".join(f"`{f}`" for f in flower_fuzz.FORGERIES)
        + f"): replies kept beyond the sampled nodes, an abort, or a robust strategy's step "
        f"above 3× the honest one: **{len(fl_bad)}**. Non-robust strategies (the mean and "
        "the drift servers) are not a defense: one 1e30 reply moves them, as it should be "
        "expected to.",
        "",
        "| strategy | robust | most replies kept (of 10 sampled) | worst step / honest | "
        "forgery |",
        "|---|---|---|---|---|",
        *[
            f"| `{r['strategy']}` | {r['robust']} | {r['max_kept_of_10']} | "
            f"{r['worst_step_x_honest']} | `{r['worst_forgery']}` |"
            for r in fl_rows
        ],
        "",
        "## 4. Resumed state",
        "",
        f"Tampered checkpoints (NaN, 1e30, float64 or wrongly shaped θ, negative variances, "
        f"1e30 or wrongly shaped server state) on three server × rule runs: **{ck_refused} "
        f"of {ck_total} refused** with one error naming the checkpoint and the field.",
    ]
    if ck_failures:
        lines += ["", *[f"- resumed: {f}" for f in ck_failures]]
    if refused:
        lines += ["", "## Refused at build time", ""]
        lines += [
            f"- `{s}` × `{a}`{' (masks)' if m else ''}{' (defaults)' if d else ''}"
            for s, a, m, d in refused
        ]
    for title, rows in (("Poisoned cases", poisoned), ("Unbounded steps", unbounded)):
        if rows:
            lines += ["", f"## {title}", ""]
            lines += [
                f"- {r.server} × {r.aggregator}{' (masks)' if r.masks else ''}: "
                f"{r.corruption} ×{r.bad_rows} {r.error} {r.step_norm:.3g}/{r.bound:.3g}"
                for r in rows
            ]
    out = Path(args.out)
    # The "Under attack" section below the marker (the robustness bench's tables, rendered
    # by fedshield results render) is not this report's: keep it.
    kept = ""
    if out.exists() and KEEP in out.read_text():
        kept = "\n" + KEEP + out.read_text().split(KEEP, 1)[1]
    out.write_text("\n".join(lines) + "\n" + kept)
    # One summary row for the README (rendered by fedshield results render).
    summary = {
        "pairs": len(pairs),
        "pairs_with_masks": sum(1 for p in pairs if p[2]),
        "cases": len(ran),
        "rejected_rows": sum(reasons.values()),
        "poisoned": len(poisoned),
        "robust_minority_cases": len(robust_minor),
        "unbounded": len(unbounded),
        "frozen": len(frozen),
        "flower_forgeries": len(flower),
        "flower_failures": len(fl_bad),
        "tampered_refused": f"{ck_refused}/{ck_total}",
        "commit": commit,
    }
    data = Path(args.out).parent / "data"
    data.mkdir(parents=True, exist_ok=True)
    _write(data / "robustness.csv", [{k: str(v) for k, v in summary.items()}])
    _write(data / "robustness_tiers.csv", tier_rows)
    _write(data / "robustness_flower.csv", fl_rows)
    print("\n".join(lines[:20]))


def _write(path: Path, rows: list[dict[str, str]]) -> None:
    with path.open("w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    write_provenance(path)


def write_provenance(data: Path) -> None:
    """``<name>.provenance.json`` beside a data file (fedshield.results.collect checks it): the
    commit, and as config hash the hash of the fuzz's definition (this tool + harnesses)."""
    import hashlib
    import json

    from fedshield.provenance import sha256_file, source_commit

    root = Path(__file__).resolve().parents[1]
    defs = (
        "tools/robustness_report.py",
        "src/fedshield/testing/fuzz.py",
        "src/fedshield/testing/flower_fuzz.py",
    )
    text = "".join((root / d).read_text() for d in defs)
    src = source_commit()
    record = {
        "commits": [src["commit"] or "unknown"],
        "dirty": src["dirty"],
        "config_sha256": hashlib.sha256(text.encode()).hexdigest(),
        "config": "the fuzz's definition: " + " + ".join(defs),
        "command": ["python", "tools/robustness_report.py"],
        "files": {data.name: sha256_file(data)},
    }
    side = data.with_name(data.stem + ".provenance.json")
    side.write_text(json.dumps(record, indent=2, sort_keys=True) + "\n")


if __name__ == "__main__":
    main()
