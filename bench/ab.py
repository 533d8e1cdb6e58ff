"""A bench script against two source trees, side by side: the script (this tree's) runs
alternately with ``PYTHONPATH`` set to each tree's ``src`` — base, new, new, base, ... — so
both see the same machine load, and writes its times with ``--json``. Printed per row and
timed run: the min and median seconds of each tree over all repetitions, and new/base;
then per row each run's min over the hand-written loop's (``loop``, ``plain``) in each tree
— measured interleaved in one process, so the machine's load affects it less — and
new/base of that ratio. ``--save`` keeps every time.

    python bench/ab.py --base /tmp/base/src [--new src] [--rounds 2] -- \\
        bench/bench_round.py --steps 20 --repeats 3

A base tree is a plain copy of a commit, e.g. ``git archive <commit> src | tar -x -C /tmp/base``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path


def run_once(script: list[str], src: Path) -> dict[str, dict[str, list[float]]]:
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "times.json"
        env = dict(os.environ, PYTHONPATH=str(src.resolve()))
        subprocess.run([sys.executable, *script, "--json", str(out)], env=env, check=True)
        return json.loads(out.read_text())


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--base", type=Path, required=True, help="the base tree's src")
    ap.add_argument("--new", type=Path, default=Path("src"), help="the new tree's src")
    ap.add_argument("--rounds", type=int, default=2, help="base/new pairs, alternating order")
    ap.add_argument("--save", type=Path, default=None, help="write all times (JSON) here")
    ap.add_argument("script", nargs=argparse.REMAINDER, help="-- bench script and its options")
    args = ap.parse_args()
    script = [a for a in args.script if a != "--"]
    trees = {"base": args.base, "new": args.new}
    times: dict[str, dict[str, dict[str, list[float]]]] = {"base": {}, "new": {}}
    for r in range(args.rounds):
        for name in ("base", "new") if r % 2 == 0 else ("new", "base"):
            for label, runs in run_once(script, trees[name]).items():
                for run, values in runs.items():
                    times[name].setdefault(label, {}).setdefault(run, []).extend(values)
    if args.save:
        args.save.write_text(json.dumps(times))
    print(f"# ab: {' '.join(script)}  rounds={args.rounds}  (seconds; ratio new/base)")
    for label, runs in times["new"].items():
        for run, new in runs.items():
            base = times["base"].get(label, {}).get(run)
            if not base:
                continue
            bmin, nmin = min(base), min(new)
            bmed, nmed = statistics.median(base), statistics.median(new)
            print(
                f"{label:<34} {run:<5} base {bmin:8.4f}/{bmed:8.4f}  new {nmin:8.4f}/{nmed:8.4f}"
                f"  new/base {nmin / bmin:5.3f} (min) {nmed / bmed:5.3f} (median)"
            )
    for label, runs in times["new"].items():
        ref = _reference(runs)
        base_runs = times["base"].get(label, {})
        if ref not in base_runs:
            continue
        for run in runs:
            if run == ref or run not in base_runs:
                continue
            rn = min(runs[run]) / min(runs[ref])
            rb = min(base_runs[run]) / min(base_runs[ref])
            ratio = f"{run}/{ref}"
            print(f"{label:<34} {ratio:<11} base {rb:6.3f}  new {rn:6.3f}  new/base {rn / rb:5.3f}")


def _reference(runs: dict[str, list[float]]) -> str:
    """The run the others are divided by: the hand-written loop (``loop``, ``plain``)."""
    return next((r for r in ("loop", "plain") if r in runs), list(runs)[-1])


if __name__ == "__main__":
    main()
