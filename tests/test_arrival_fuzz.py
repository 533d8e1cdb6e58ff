"""Fuzz WHICH rows arrive on the simulator's round step and the Flower-native
strategies: 2 of 10 sampled clients are Byzantine and always answer (1e30-scaled or
crafted ALIE rows) while up to 70 % of the honest rows go missing, arrive late (partial
work; on Flower also last round's reply), are duplicated or shadowed by forged ids.

Asserted for every robust rule (:mod:`fedshield.testing.arrival`): θ stays finite, the
step stays within 10× the clean round's, and ``sys/f`` never drops below the full
cohort's f because rows are missing.
"""

from __future__ import annotations

import logging
import random

import pytest

from fedshield.aggregators.base import AGGREGATORS
from fedshield.registry import tags_of
from fedshield.testing import arrival, fuzz

pytestmark = pytest.mark.filterwarnings("ignore")

ATTACKS = ["norm_1e30", "crafted"]
FLOWER_ROBUST = ["Median", "Krum", "MultiKrum", "TrimmedMean", "Bulyan", "GeoMed", "RFA", "RAGA",
                 "CenteredClipping", "NormClip", "BRDRAG", "FLTrust"]  # fmt: skip


def test_patterns_cover_dropouts_up_to_70_percent_and_combinations() -> None:
    ps = arrival.patterns(8, random.Random(0))
    assert [p.missing for p in ps[:6]] == [0, 1, 2, 3, 4, 5]  # ⌊0.7 · 8⌋ = 5
    combos = ps[6:]
    assert any(p.late for p in combos) and any(p.duplicate for p in combos)
    assert any(p.forged for p in combos)
    assert arrival.patterns(8, random.Random(0)) == ps  # seeded


def test_crafted_row_is_mean_minus_1_5_std() -> None:
    import torch

    rows = [torch.tensor([0.0, 2.0]), torch.tensor([2.0, 2.0])]
    assert torch.allclose(arrival.crafted(rows), torch.tensor([1.0 - 1.5 * 2**0.5, 2.0]))


def test_sim_round_step_meets_missing_late_duplicate_and_forged_rows() -> None:
    logging.disable(logging.WARNING)
    try:
        robust = [a for a in AGGREGATORS.package_names() if "robust" in tags_of(AGGREGATORS.get(a))]
        cases = []
        for agg in robust:
            pair = fuzz.make_pair("fedavg", agg, defaults=True)  # f derived from the cohort
            assert pair is not None, agg
            clean = arrival.clean_round(pair)
            rng = random.Random(0)
            for attack in ATTACKS:
                cases += [arrival.run_sim(pair, attack, a, rng, clean)
                          for a in arrival.patterns(8, rng)]  # fmt: skip
    finally:
        logging.disable(logging.NOTSET)
    assert {"median", "krum", "trimmed_mean", "rfa", "brdrag", "fltrust"} <= set(robust)
    assert len(cases) == len(robust) * len(ATTACKS) * 10
    bad = [(c.aggregator, c.attack, c.pattern, c.step / c.clean_step, c.f, c.cohort_f, c.error)
           for c in cases if not c.ok]  # fmt: skip
    assert not bad, bad
    # the count rules report the cohort's f on every case, also where rows went missing
    counted = [c for c in cases if c.cohort_f is not None]
    assert counted and all(c.f == c.cohort_f for c in counted if "missing0" not in c.pattern)


def test_flower_strategies_meet_missing_late_duplicate_and_forged_replies() -> None:
    cases = arrival.run_flower(FLOWER_ROBUST, ATTACKS)
    assert len(cases) == len(FLOWER_ROBUST) * len(ATTACKS) * 10
    bad = [(c.strategy, c.attack, c.pattern, c.step / c.clean_step, c.f, c.cohort_f)
           for c in cases if not c.ok]  # fmt: skip
    assert not bad, bad
    # late, duplicated and forged replies never count as arrivals: at most the answering
    # attackers and honest nodes are kept
    over = [(c.strategy, c.pattern, c.kept) for c in cases
            if c.kept > arrival.ATTACKERS + 8 - c.missing]  # fmt: skip
    assert not over, over
    assert all(c.f is not None for c in cases if c.strategy not in ("BRDRAG", "FLTrust"))
