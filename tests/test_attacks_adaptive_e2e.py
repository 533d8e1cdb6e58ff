"""Each defense-aware attack against a rule it targets, end to end: it lowers that rule's
final accuracy below what every one of the eight fixed attacks of seed 000 reaches on the
same setting — seed 0 of the attack grid (tools/attack_grid.py: digits, 20 workers,
Dirichlet 0.5, 10 per round with exactly ⌊wS⌋ Byzantine, MLP, 20 rounds), so the numbers
are the grid's. Where an attack does not get below the fixed attacks on its own target
(Fang's Krum attack on Krum, which IPM already breaks; ALIE-opt on every robust rule; the
estimated-r adaptive attack on FLTrust and BR-DRAG), docs/results/robustness.md says so
with the measured numbers, and the test checks a rule it does beat (each case also holds
for the grid's 3-seed means). Fang's Trim attack gets below the fixed attacks in the
grid's 3-seed means only against NNM + BR-DRAG at 80 %, by 0.008, never on its targets:
it has no case here, and the docs give its numbers.
"""

from __future__ import annotations

import functools
import importlib.util
import logging
from pathlib import Path

import pytest

from fedshield import config as cfgmod
from fedshield.sim.builder import build
from fedshield.sim.engine import Simulator

_spec = importlib.util.spec_from_file_location(
    "attack_grid", Path(__file__).resolve().parents[1] / "tools" / "attack_grid.py"
)
assert _spec is not None and _spec.loader is not None
grid = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(grid)  # the grid's own setting: one definition

pytestmark = pytest.mark.slow

ROUNDS = 20

#: (adaptive attack, defense of the grid, Byzantine share): each beats all fixed attacks
#: there (seed 0 of the grid, final accuracy: adaptive vs the worst fixed attack).
CASES = [
    ("adaptive_root", "fltrust", 0.4),  # 0.61 vs 0.84 (label_flip)
    # The grid samples 10 of 20 workers a round: the authors' warm-up target fixes a row
    # position, a client only under full participation (docs/security.md), so this case
    # runs the per-round target of the grid's measurement.
    ("mimic", "fltrust", 0.4),  # 0.82 vs 0.84
    ("adaptive_root", "brdrag", 0.6),  # 0.70 vs 0.75 (sign_flip)
    ("agr_tailored", "centered_clipping", 0.4),  # 0.12 vs 0.31 (sign_flip)
    ("ipm_opt", "centered_clipping", 0.4),  # 0.00 vs 0.31
    ("fang_krum", "centered_clipping", 0.4),  # 0.08 vs 0.31
    ("adaptive_root_est", "median", 0.4),  # 0.21 vs 0.28 (sign_flip)
    ("alie_opt", "fedavg", 0.2),  # 0.10 vs 0.58 (noise)
]


@functools.cache
def final_acc(defense: str, attack: str, fraction: float) -> float:
    sets = grid.overrides(defense, attack, fraction, 0, ROUNDS)
    if attack == "mimic":
        sets.append('attack.params.target="per_round"')
    cfg = cfgmod.load(preset=grid.BASE, overrides=sets)
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
    fixed = {a: final_acc(defense, a, fraction) for a in grid.FIXED}
    adaptive = final_acc(defense, attack, fraction)
    worst_fixed = min(fixed, key=fixed.__getitem__)
    assert adaptive < fixed[worst_fixed], (attack, adaptive, worst_fixed, fixed)
