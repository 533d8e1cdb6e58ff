"""ByzFL's attacks against every fedshield defense, side by side with ByzFL's own rule.

    python bench/bench_byzfl_attacks.py              # n = 25 rows, f = 5 Byzantine, d = 1000
    python bench/bench_byzfl_attacks.py --byzantine 10 --seeds 3

Benign rows are seeded: g_i = μ + ξ_i with μ, ξ_i ~ N(0, I/d) (norms ≈ 1.4). ByzFL's
attacks (Optimal ALIE, Optimal IPM, Mimic, Inf, SignFlipping, Gaussian) craft one vector
from the n − f benign rows, uploaded by all f Byzantine rows (ByzFL's ``ByzantineClient``
convention). The two optimal attacks line-search their factor against the defense under
attack (our rule; no pre-aggregation). Every rule then aggregates the same n rows; the
table gives the distance of the result to the benign mean (``ours``), the same for ByzFL's
rule of the same name where it has one (``byzfl``; ``nan`` where its output is not finite)
and whether ours was finite. Averages over ``--seeds``.

Parameter maps that make both libraries compute the same rule (reference tests in
tests/test_aggregators_reference.py): Krum(f) ↔ ByzFL Krum(f + 1) (Blanchard's n − f − 2
neighbours); Multi-Krum(f, m = n − f − 1) ↔ MultiKrum(f + 1); GeoMed (ours: mean start,
stopping rules) ↔ GeometricMedian(ν = 1e-6, T = 100); Centered Clipping(τ, L = 1, centre
v) ↔ CenteredClipping(τ, L = 1) with its centre set to the same v; norm_clip(τ) ↔
Average ∘ Clipping(c = τ), with τ = ``--tau`` = 1 (the default 10 would not clip rows of
norm 1.4). DRAG/BR-DRAG/FLTrust get a trusted reference r (one more benign row: the
root-data update), Centered Clipping the centre v = the mean of another benign batch (the
previous round's aggregate). Bulyan, DRAG, BR-DRAG and FLTrust have no ByzFL counterpart.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import math
from collections.abc import Callable
from typing import Any

import torch

import fedshield.aggregators as agg

try:
    import byzfl
except ImportError as err:  # this bench is about ByzFL's attacks
    raise SystemExit(f"bench_byzfl_attacks needs byzfl: {err}") from None

ATTACKS = ["Optimal_ALIE", "Optimal_IPM", "Mimic", "Inf", "SignFlipping", "Gaussian"]
Rule = Callable[[torch.Tensor], torch.Tensor]


def our_rule(
    name: str, n: int, f: int, tau: float, ref: torch.Tensor, centre: torch.Tensor
) -> Rule:
    """Our rule as the server runs it on the rows (reference and centre bound): the rows
    holding NaN/Inf are dropped and, if too few are left for f, the rule degrades to the
    largest feasible f (``Aggregator.adapted``, what the engine does after screening)."""
    kwargs: dict[str, Any] = {}
    if name in ("krum", "trimmed_mean", "bulyan"):
        kwargs["f"] = f
    elif name == "multikrum":
        kwargs.update(f=f, m=n - f - 1)
    elif name in ("centered_clipping", "norm_clip"):
        kwargs["tau"] = tau
    rule = agg.build(name, **kwargs)
    extra = ref if rule.needs_reference else centre if name == "centered_clipping" else None

    def apply(x: torch.Tensor) -> torch.Tensor:
        finite = int(torch.isfinite(x).all(dim=1).sum())
        run = rule.adapted(finite) if not rule.handles_nonfinite else rule
        if run is None:
            raise RuntimeError(f"{name}: no rule can run on {finite} rows")
        return run(x, reference=extra)

    return apply


def byzfl_rule(name: str, f: int, tau: float, centre: torch.Tensor) -> Rule | None:
    """ByzFL's rule of the same name (parameters mapped to ours), or None."""
    if name == "mean":
        return byzfl.Average()
    if name == "median":
        return byzfl.Median()
    if name == "trimmed_mean":
        return byzfl.TrMean(f=f)
    if name == "krum":
        return byzfl.Krum(f=f + 1)
    if name == "multikrum":
        return byzfl.MultiKrum(f=f + 1)
    if name in ("geomed", "rfa", "raga"):
        return byzfl.GeometricMedian(nu=1e-6, T=100)
    if name == "centered_clipping":

        def cc(x: torch.Tensor) -> torch.Tensor:
            rule = byzfl.CenteredClipping(tau=float(tau), L=1)
            # Its constructor refuses every ``m`` (a type check that no tensor passes); its
            # __call__ reads the centre from ``m``, as after a previous call.
            rule.m = centre.float()
            return rule(x)

        return cc
    if name == "norm_clip":
        return lambda x: byzfl.Average()(byzfl.Clipping(c=float(tau))(x))
    return None


def craft(attack: str, honest: torch.Tensor, f: int, target: Rule) -> torch.Tensor:
    """The ``[f, d]`` Byzantine rows of ByzFL's ``attack`` against ``target``."""
    if attack == "Optimal_ALIE":
        a: Any = byzfl.Optimal_ALittleIsEnough(agg=target, pre_agg_list=[], f=f)
    elif attack == "Optimal_IPM":
        a = byzfl.Optimal_InnerProductManipulation(agg=target, pre_agg_list=[], f=f)
    elif attack == "Mimic":
        a = byzfl.Mimic(epsilon=0)
    elif attack == "Inf":
        a = byzfl.Inf()
    elif attack == "SignFlipping":
        a = byzfl.SignFlipping()
    else:
        a = byzfl.Gaussian(mu=0.0, sigma=1.0)
    v = torch.as_tensor(a(honest)).to(honest.dtype)
    return v.expand(f, -1).clone()


def distance(out: Any, mean: torch.Tensor) -> float:
    out = torch.as_tensor(out).to(torch.float64)
    if not bool(torch.isfinite(out).all()):
        return math.nan
    return float((out - mean.double()).norm())


def run(
    n: int, f: int, d: int, tau: float, seed: int
) -> dict[tuple[str, str], tuple[float, float, bool]]:
    gen = torch.Generator().manual_seed(seed)
    scale = d**-0.5
    mu = scale * torch.randn(d, generator=gen)
    honest = mu + scale * torch.randn(n - f, d, generator=gen)
    ref = mu + scale * torch.randn(d, generator=gen)  # the server's root-data update
    centre = mu + scale * torch.randn(n - f, d, generator=gen).mean(0)  # last aggregate
    mean = honest.mean(0)
    out: dict[tuple[str, str], tuple[float, float, bool]] = {}
    for attack in ATTACKS:
        for name in agg.names():
            ours = our_rule(name, n, f, tau, ref, centre)
            torch.manual_seed(seed)  # ByzFL's Gaussian draws from torch's global generator
            x = torch.cat([honest, craft(attack, honest, f, ours)])
            mine = ours(x)
            theirs = byzfl_rule(name, f, tau, centre)
            d_theirs = math.nan if theirs is None else distance(theirs(x), mean)
            out[attack, name] = (distance(mine, mean), d_theirs, bool(torch.isfinite(mine).all()))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--clients", type=int, default=25, help="n, rows per round")
    ap.add_argument("--byzantine", type=int, default=5, help="f, Byzantine rows (n ≥ 4f + 3)")
    ap.add_argument("--dim", type=int, default=1000)
    ap.add_argument("--seeds", type=int, default=2)
    ap.add_argument("--tau", type=float, default=1.0, help="τ of centered_clipping, norm_clip")
    args = ap.parse_args()
    n, f, d, tau = args.clients, args.byzantine, args.dim, args.tau
    runs = [run(n, f, d, tau, seed) for seed in range(args.seeds)]
    version = importlib.metadata.version("byzfl")
    print(
        f"# ByzFL {version} attacks vs fedshield defenses: n={n}, f={f}, d={d}, tau={tau}, "
        f"float32, "
        f"mean over {args.seeds} seeds; distance of the aggregate to the benign mean "
        f"(benign rows have norm ≈ 1.4)"
    )
    has_byzfl = {n for n in agg.names() if byzfl_rule(n, f, tau, torch.zeros(1)) is not None}
    header = f"{'attack':14s} {'rule':18s} {'ours':>10s} {'byzfl':>10s} {'finite':>7s}"
    print(header)
    print("-" * len(header))
    for attack in ATTACKS:
        for name in agg.names():
            vals = [r[attack, name] for r in runs]
            ours = sum(v[0] for v in vals) / len(vals)
            theirs = sum(v[1] for v in vals) / len(vals)
            finite = all(v[2] for v in vals)
            t = f"{theirs:10.4f}" if name in has_byzfl else f"{'-':>10s}"
            print(f"{attack:14s} {name:18s} {ours:10.4f} {t} {'yes' if finite else 'NO':>7s}")
        print()
    bad = sum(not v[2] for r in runs for v in r.values())
    print(f"# non-finite fedshield outputs: {bad} of {sum(len(r) for r in runs)}")
    robust = [n for n in agg.names() if "robust" in agg.AGGREGATORS.entry(n).tags]
    mean_of = {key: sum(r[key][0] for r in runs) / len(runs) for key in runs[0] if key[1] in robust}
    (attack, name), worst = max(mean_of.items(), key=lambda kv: kv[1])
    print(f"# largest distance under a robust rule: {worst:.4f} ({name}, {attack})")


if __name__ == "__main__":
    main()
