"""Robust and live by default: what each default costs a clean run, and what it buys.

The defaults (docs/cross-round.md, "Default"; docs/faults.md, "Liveness"): a robust rule named
without ``server.round_defenses`` gets the recommended round defenses for its threat model, and
a run with ``[faults]`` and no ``server.over_select`` invites the S' that the law of arrivals says
keeps its rounds live. On the grid of ``bench/bench_liveness.py`` (digits, mlp 64, Dirichlet 0.5,
min_size 10, sgd lr 0.1 × 10 steps of batch 16, fedavg with uniform weighting, S = 10), seeds the
recommendation was not chosen on (it was chosen on 11 and 12), final test accuracy side by side:

(a) clean cost of the round defenses: each rule named alone (the defaults) beside the same run with
    ``server.round_defenses = []`` (bare), no attack, no faults, M = 50 (the clean cost of
    over-selection is (c): it acts only under faults);
(b) Median named alone against 30 % ``noise`` (σ = 100) attackers, S/M 10/100 (min_size 5, as
    the quiet-attacker grid of docs/cross-round.md): fixed mode (the
    attackers chosen once) beside its pinned twin (``attack.mode = "per_round"``: exactly 3 per
    cohort), with the defaults and bare;
(c) clean Median runs with the defaults under each fault model beside the run without faults
    (M = 50), with the rounds skipped, the rounds padded with zero rows and the S' invited;
(d) Median with the defaults against 30 % fixed attackers (``noise`` σ = 100, ``sign_flip``)
    under each fault model beside its clean twin under the same faults (M = 50): the
    defaults' liveness must not be the attackers' opening (attackers always answer, so a
    fault raises their share of the arrivals); beside it the same attacked run with
    ``server.short_rounds = "skip"`` (short rounds keep θ instead of being padded).

    PYTHONPATH=src OMP_NUM_THREADS=1 python bench/bench_defaults.py [--seeds 31 32 33]
    ... --parts cd --invite population   # (c), (d) with cohorts drawn from all M clients
    ... --parts acd --add-defense trajectory   # a candidate default round defense, measured
"""

from __future__ import annotations

import argparse
import copy
import logging
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_liveness import BASE, FAULTS  # the liveness grid: one definition

from fedshield.aggregators.base import AGGREGATORS
from fedshield.config import validate
from fedshield.provenance import source_commit
from fedshield.runner import run
from fedshield.sim.builder import default_pre_aggregators, default_round_defenses

NOISE = {"name": "noise", "params": {"sigma": 100.0}, "fraction": 0.3}
#: (d)'s attacks: the σ = 100 noise of (b), and each attacker's own update negated (the
#: no-root candidates' worst menu cell at S/M 10/100, docs/cross-round.md)
ATTACKS = {"noise": NOISE, "sign_flip": {"name": "sign_flip", "fraction": 0.3}}
#: ``--invite``: how every run with faults invites its cohort (None: the default, "online")
INVITE: str | None = None
#: ``--add-defense``: a round defense appended to the defaults of every defended run (None:
#: the defaults alone), to measure a candidate default before it becomes one
ADD: str | None = None
#: ``--first``: ADD goes before the defaults (and fill), not after them
FIRST = False
#: ``--clients``: M of tables (c) and (d)
CLIENTS = 50
#: ``--no-skip-twin``: table (d) without its short_rounds = "skip" twin
SKIP_TWIN = True


def one(
    seed: int,
    rounds: int,
    rule: str = "median",
    clients: int = 50,
    attack: str | None = None,
    faults: str = "none",
    bare: bool = False,
    recipe: str = "noise",
    short: str | None = None,
) -> dict[str, Any]:
    raw = copy.deepcopy(BASE)
    raw["seed"], raw["rounds"], raw["eval"] = seed, rounds, {"every": rounds}
    raw["data"]["num_clients"] = clients
    if clients > 50:  # 100 Dirichlet(0.5) shares of digits: the quiet grid's min_size 5
        raw["data"]["min_size"] = 5
    raw["server"]["aggregator"] = rule
    if bare:
        raw["server"]["round_defenses"] = []
    if short is not None:
        raw["server"]["short_rounds"] = short
    if attack is not None:
        raw["attack"] = {**ATTACKS[recipe], "mode": attack}
    section = FAULTS[faults]
    if section is not None:
        raw["faults"] = copy.deepcopy(section)
        if INVITE is not None:
            raw["faults"]["invite"] = INVITE
    cfg = validate(raw, "bench_defaults")
    if ADD is not None and not bare:  # the defaults as the run resolves them, plus ADD
        # fill under [faults]: builder.default_fill adds it to every faulted run here (a
        # small mlp, no extras, fixed attackers)
        entry = AGGREGATORS.entry(rule)
        pre = default_pre_aggregators(cfg, entry)
        names, _ = default_round_defenses(cfg, entry, pre)
        raw["server"]["pre_aggregators"] = pre[0]  # set by hand now: the defaults' own
        head = ["fill"] * (section is not None) + names
        raw["server"]["round_defenses"] = [ADD, *head] if FIRST else [*head, ADD]
        cfg = validate(raw, "bench_defaults")
    res = run(cfg, None, quiet=True)
    budget = res["byzantine"]
    return {
        "acc": float(res["final_test_acc"]),
        "skipped": sum(1 for r in res.history if r.get("sys/skipped")),
        "padded": sum(1 for r in res.history if r.get("sys/padded")),
        "invited": budget.get("invited") or budget["cohort"],
        "defenses": budget["recommended"]["round_defenses"]["applied"],
    }


def mean(xs: list[float]) -> float:
    return sum(xs) / len(xs)


def row(label: str, cells: list[list[float]], width: int = 25, label_width: int = 18) -> str:
    """``label`` and, per column, the seeds' values and their mean."""
    out = f"{label:<{label_width}}"
    for c in cells:
        out += f"  {' '.join(f'{x:.3f}' for x in c) + f' | {mean(c):.3f}':>{width}}"
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, nargs="+", default=[31, 32, 33])
    ap.add_argument("--rounds", type=int, default=30)
    # one rule per distinct default: its own candidate's (median-guarded, cc-momentum-rep) or
    # the no-root recommendation's (krum: no candidate runs it)
    ap.add_argument("--rules", nargs="+", default=["median", "centered_clipping", "krum"])
    ap.add_argument(
        "--faults",
        nargs="+",
        default=[
            k
            for k in FAULTS
            if k in ("dropout 0.3", "dropout 0.6", "availability 0.5", "deadline 80 %", "all three")
        ],
    )
    ap.add_argument("--parts", default="abcd", help="which tables to run (letters)")
    ap.add_argument(
        "--invite", choices=["online", "population"], default=None,
        help="faults.invite of every run with faults (default: unset, i.e. online)",
    )  # fmt: skip
    ap.add_argument(
        "--add-defense", default=None, metavar="NAME",
        help="a round defense appended to the defaults (and to fill under faults) in every "
        "defended run",
    )  # fmt: skip
    ap.add_argument(
        "--first", action="store_true",
        help="--add-defense goes first (before fill: a defense that holds rows back)",
    )  # fmt: skip
    ap.add_argument("--clients", type=int, default=50, help="M of tables (c) and (d)")
    ap.add_argument(
        "--no-skip-twin", action="store_true",
        help='table (d) without its server.short_rounds = "skip" twin',
    )  # fmt: skip
    args = ap.parse_args()
    global INVITE, ADD, FIRST, CLIENTS, SKIP_TWIN
    INVITE, ADD, FIRST = args.invite, args.add_defense, args.first
    CLIENTS, SKIP_TWIN = args.clients, not args.no_skip_twin
    logging.getLogger("fedshield").setLevel(logging.ERROR)  # the table, not each build's lines
    seeds, rounds = args.seeds, args.rounds
    src = source_commit()
    commit = (src["commit"] or "?")[:7] + (" (dirty)" if src["dirty"] else "")
    print(
        f"digits mlp64 dirichlet 0.5, S=10, {rounds} rounds, seeds {' '.join(map(str, seeds))}, "
        f"commit {commit}; each cell: final test accuracy per seed | mean"
        + (f"; faults.invite = {args.invite!r} in every run with faults" if args.invite else "")
        + (f"; {args.add_defense!r} added to the default round defenses" if ADD else "")
        + (" (first)" if ADD and FIRST else "")
    )
    start = time.perf_counter()

    if "a" in args.parts:
        part_a(args.rules, seeds, rounds)
    if "b" in args.parts:
        part_b(seeds, rounds)
    ref = [one(s, rounds, clients=CLIENTS)["acc"] for s in seeds]
    if "c" in args.parts:
        part_c(args.faults, seeds, rounds, ref)
    if "d" in args.parts:
        part_d(args.faults, seeds, rounds, ref)
    print(
        f"\n({time.perf_counter() - start:.0f} s; gap: mean difference in points; skipped: "
        "rounds θ was kept, per seed; S': clients invited per round, per seed)"
    )


def part_a(rules: list[str], seeds: list[int], rounds: int) -> None:
    print("\n(a) clean cost of the default round defenses (no attack, no faults, M=50)")
    print(f"{'rule':<18}  {'defaults':>25}  {'bare ([])':>25}    gap  applied")
    for rule in rules:
        d = [one(s, rounds, rule) for s in seeds]
        b = [one(s, rounds, rule, bare=True) for s in seeds]
        da, ba = [r["acc"] for r in d], [r["acc"] for r in b]
        gap = 100 * (mean(da) - mean(ba))
        print(row(rule, [da, ba]) + f"  {gap:+5.1f}  {', '.join(d[0]['defenses'])}", flush=True)


def part_b(seeds: list[int], rounds: int) -> None:
    print("\n(b) Median named alone, 30 % noise σ=100, S/M 10/100: fixed vs its pinned twin")
    print(f"{'setting':<18}  {'fixed':>25}  {'per_round (pinned)':>25}    gap")
    for bare in (False, True):
        f = [one(s, rounds, clients=100, attack="fixed", bare=bare)["acc"] for s in seeds]
        p = [one(s, rounds, clients=100, attack="per_round", bare=bare)["acc"] for s in seeds]
        label = "bare ([])" if bare else "defaults"
        print(row(label, [f, p]) + f"  {100 * (mean(f) - mean(p)):+5.1f}", flush=True)


def part_c(faults_: list[str], seeds: list[int], rounds: int, ref: list[float]) -> None:
    print(f"\n(c) clean Median with the defaults under faults vs no faults (M={CLIENTS})")
    print(f"{'faults':<18}  {'faults':>25}  {'no faults':>25}    gap  skipped  padded  S'")
    for faults in faults_:
        r = [one(s, rounds, clients=CLIENTS, faults=faults) for s in seeds]
        acc = [x["acc"] for x in r]
        skipped = "/".join(str(x["skipped"]) for x in r)
        padded = "/".join(str(x["padded"]) for x in r)
        invited = "/".join(str(x["invited"]) for x in r)
        print(
            row(faults, [acc, ref]) + f"  {100 * (mean(acc) - mean(ref)):+5.1f}  {skipped:>7}"
            f"  {padded:>6}  {invited}",
            flush=True,
        )


def part_d(faults_: list[str], seeds: list[int], rounds: int, ref: list[float]) -> None:
    twin = (
        ""
        if ADD or not SKIP_TWIN
        else "; beside it the same attacked run with short rounds skipped "
        '(server.short_rounds = "skip", the default before padding)'
    )
    print(
        "\n(d) Median with the defaults, 30 % fixed attackers, under faults vs its clean twin "
        f"under the same faults (M={CLIENTS}){twin}"
    )
    print(
        f"{'faults, attack':<30}  {'attacked (pad)':>25}  {'clean':>25}    gap  padded"
        + ("" if ADD or not SKIP_TWIN else f"  {'attacked (skip)':>25}    gap  skipped")
    )
    for faults in ["none", *faults_]:
        clean = (
            ref
            if faults == "none"
            else [one(s, rounds, clients=CLIENTS, faults=faults)["acc"] for s in seeds]
        )
        for recipe in ATTACKS:
            r = [
                one(s, rounds, clients=CLIENTS, attack="fixed", faults=faults, recipe=recipe)
                for s in seeds
            ]
            acc = [x["acc"] for x in r]
            padded = "/".join(str(x["padded"]) for x in r)
            line = (
                row(f"{faults}, {recipe}", [acc, clean], label_width=30)
                + f"  {100 * (mean(acc) - mean(clean)):+5.1f}  {padded:>6}"
            )
            if ADD is None and SKIP_TWIN:  # the skip twin measures padding, not an added defense
                k = [
                    one(
                        s, rounds, clients=CLIENTS, attack="fixed", faults=faults,
                        recipe=recipe, short="skip",
                    )  # fmt: skip
                    for s in seeds
                ]
                kacc = [x["acc"] for x in k]
                skipped = "/".join(str(x["skipped"]) for x in k)
                line += row("", [kacc], label_width=0)
                line += f"  {100 * (mean(kacc) - mean(clean)):+5.1f}  {skipped:>7}"
            print(line, flush=True)


if __name__ == "__main__":
    main()
