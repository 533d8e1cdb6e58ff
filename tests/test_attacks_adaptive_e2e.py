"""Each defense-aware attack against a rule it targets, end to end: it lowers that rule's
final accuracy below what every one of the eight fixed attacks of the DRAG paper reaches on the
same setting — seed 0 of the robustness bench (`fedshield bench --bench
robustness-digits-cpu`: digits, 20 workers, Dirichlet 0.5, 10 per round with exactly ⌊wS⌋
Byzantine, MLP, 20 rounds, a 200-sample validation split), each run's config taken from
the bench's own plan, so the numbers are the published runs'
(docs/results/data/bench-robustness-digits-cpu-runs.csv, seed 0). Where an attack does not
get below the fixed attacks on its own target there (ALIE-opt on the robust rules below
their breakdown point — it drives Median, RFA and RAGA non-finite from 60 % on; the
estimated-r adaptive attack on FLTrust and BR-DRAG; Fang's Trim attack on Trimmed Mean),
the test checks a rule it does beat, or has no case.
"""

from __future__ import annotations

import copy
import functools
import logging
from typing import Any

import pytest

from fedshield import config as cfgmod
from fedshield.bench.command import read_bench
from fedshield.bench.plan import plan
from fedshield.sim.builder import build
from fedshield.sim.engine import Simulator

# one worker: its cases share their defense's fixed-attack runs (functools.cache per process)
pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("adaptive_e2e")]

BENCH = "robustness-digits-cpu"
#: The eight fixed attacks of the DRAG paper (the bench's first eight).
FIXED = ("noise", "sign_flip", "label_flip", "min_max", "min_sum", "alie", "ipm", "scaling")

#: (adaptive attack, defense of the bench, Byzantine share): each beats all fixed attacks
#: there (seed 0 of the bench, final accuracy: adaptive vs the worst fixed attack).
CASES = [
    ("adaptive_root", "fltrust", 0.4),  # 0.608 vs 0.719 (alie)
    # The authors' warm-up target (the bench's): at 40 % it does not get below ALIE on
    # seed 0 (0.789 vs 0.719; the per-round target 0.750), at 20 % it does.
    ("mimic", "fltrust", 0.2),  # 0.772 vs 0.847 (min_max)
    ("adaptive_root", "brdrag", 0.6),  # 0.667 vs 0.692 (sign_flip)
    ("agr_tailored", "centered_clipping", 0.4),  # 0.097 vs 0.194 (sign_flip)
    ("ipm_opt", "centered_clipping", 0.4),  # 0.089 vs 0.194
    ("fang_krum", "centered_clipping", 0.4),  # 0.122 vs 0.194
    ("fang_krum", "krum", 0.2),  # 0.031 vs 0.092 (ipm)
    ("adaptive_root_est", "median", 0.4),  # 0.206 vs 0.242 (sign_flip)
    ("alie_opt", "fedavg", 0.2),  # diverged (0.0) vs 0.625 (noise)
]


@functools.cache
def _bench_configs() -> dict[tuple[str, str, float], dict[str, Any]]:
    """Seed 0's run configs of the bench, by (defense, attack, share)."""
    spec, where = read_bench(name=BENCH)
    runs = plan(spec.model_copy(update={"seeds": [0]}), where, check=False).runs
    return {(r.defense, r.attack, r.setting.share): r.raw for r in runs}


@functools.cache
def final_acc(defense: str, attack: str, fraction: float) -> float:
    raw = copy.deepcopy(_bench_configs()[(defense, attack, fraction)])
    cfg = cfgmod.validate(raw, f"bench {BENCH}")
    cfg.eval.metrics = []  # the backdoor score plays no part here
    logging.disable(logging.WARNING)
    try:
        summary = Simulator(build(cfg)).run()
    finally:  # later tests in this worker read their warnings (caplog)
        logging.disable(logging.NOTSET)
    if summary["status"] == "diverged":  # the attack drove θ non-finite: nothing is left
        return 0.0
    return float(summary["final_test_acc"])


@pytest.mark.parametrize(("attack", "defense", "fraction"), CASES)
def test_adaptive_attack_beats_every_fixed_attack(
    attack: str, defense: str, fraction: float
) -> None:
    fixed = {a: final_acc(defense, a, fraction) for a in FIXED}
    adaptive = final_acc(defense, attack, fraction)
    worst_fixed = min(fixed, key=fixed.__getitem__)
    assert adaptive < fixed[worst_fixed], (attack, adaptive, worst_fixed, fixed)
