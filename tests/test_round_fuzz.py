"""Fuzz the real round loop (docs/security.md): crafted uploads against every server × aggregator
pair the registries allow, with and without coverage masks.

Each case replays a real round (``Simulator.end_round``: upload checks, the configured rule
on every path, the server step) with 1, 5 or 10 of the 10 rows corrupted. Asserted:

* θ, the buffers and the server state stay finite, and nothing raises, in every case;
* under a Byzantine-robust rule with a minority of bad rows the step is taken (the round is
  not frozen) and bounded: ‖θ⁺ − θ‖ ≤ 3 · max(η_g, 1) · B with B the largest of the honest
  rows' norms, the root reference's norm and the clipping radius (``fuzz.BOUND``).

The full cross product is ``tools/robustness_report.py`` (docs/results/robustness.md).
"""

from __future__ import annotations

import itertools
import logging
import random

import pytest

from fedshield.aggregators.base import AGGREGATORS
from fedshield.algorithms.server.base import SERVER_ALGORITHMS
from fedshield.testing import fuzz

pytestmark = pytest.mark.filterwarnings("ignore")


@pytest.fixture(autouse=True)
def _quiet():
    logging.disable(logging.WARNING)  # every rejected upload logs a warning
    yield
    logging.disable(logging.NOTSET)


def test_round_loop_fuzz() -> None:
    rng = random.Random(0)
    grid = list(itertools.product(fuzz.CORRUPTIONS, fuzz.POSITIONS))
    results: list[fuzz.CaseResult] = []
    refused: list[tuple[str, str, bool]] = []
    for masks in (False, True):
        for server, agg in fuzz.pairs(masks):
            # Counts are trusted: the cap under a robust rule must hold by itself.
            pair = fuzz.make_pair(server, agg, masks, trust_counts=True)
            if pair is None:
                refused.append((server, agg, masks))
                continue
            # The hardest cases for a robust rule: one finite row at float32's edge, a
            # bought weight, and (with masks) 2 rows that are the majority of the deepest
            # tier while a minority of the cohort.
            cases = {("huge_3e38", 1), ("nan", 1), ("count_2e53_huge", 1)}
            if masks:
                cases.add(("norm_1e30", 2))
            cases |= set(rng.sample(grid, 2))
            results += [fuzz.run_case(pair, c, k, seed=i) for i, (c, k) in enumerate(cases)]
    # The rules named without arguments (f derived, relative radii): defaults defend too.
    for agg in sorted(fuzz.AGGREGATOR_ARGS):
        for masks in (False, True):
            pair = fuzz.make_pair("fedavg", agg, masks, defaults=True, trust_counts=True)
            if pair is not None:
                results += [fuzz.run_case(pair, c, 1) for c in ("huge_3e38", "norm_1e30")]
    ran = [r for r in results if not r.skipped]
    assert len(ran) >= 300, len(ran)
    broken = [r for r in ran if not r.finite or r.error]
    assert not broken, [(r.server, r.aggregator, r.masks, r.corruption, r.error) for r in broken]
    unbounded = [r for r in ran if not r.bounded]
    assert not unbounded, [
        (r.server, r.aggregator, r.masks, r.corruption, r.bad_rows, r.step_norm, r.bound)
        for r in unbounded
    ]
    frozen = [r for r in ran if r.held and r.robust and r.in_budget]
    assert not frozen, [(r.server, r.aggregator, r.masks, r.corruption) for r in frozen]
    # Only the combinations the builder refuses by declaration: a server's needs_aggregator
    # tag the rule lacks, or (with depth tiers) a rule tagged min_clients whose minimum rows
    # (Krum n > 2f + 2, Bulyan n ≥ 4f + 3) exceed the smallest tier.
    for server, agg, masks in refused:
        s_entry, a_entry = SERVER_ALGORITHMS.entry(server), AGGREGATORS.entry(agg)
        by_tag = any(
            not (a_entry.has(t) or getattr(a_entry.obj, t, False) is True)
            for t in s_entry.tag_values("needs_aggregator")
        )
        assert by_tag or (masks and a_entry.has("min_clients")), (server, agg, masks)


def test_flower_transport_fuzz() -> None:
    """Every Flower-native strategy × duplicated, misrouted, unsampled, count-buying and
    count-less replies: never more replies kept than nodes sampled, θ finite, and under a
    robust rule the step within 3× the honest round's."""
    from fedshield.testing import flower_fuzz

    cases = flower_fuzz.run_cases()
    assert len(cases) == len(flower_fuzz.STRATEGIES) * len(flower_fuzz.FORGERIES)
    bad = [
        (c.strategy, c.forgery, c.kept, c.step, c.honest_step, c.error)
        for c in cases
        if c.error or not c.finite and c.robust or c.kept > c.sampled or not c.bounded
    ]
    assert not bad, bad


def test_quiet_attackers_fuzz() -> None:
    """Colluding (stealth, the quiet family), opportunistic and cache-poisoning attackers
    crafting their rows through the engine's attack path for 2 rounds (the second reads
    the first's cache, step history and scores), under the round defenses and honest
    dropout, with honest rows scaled to 1e30, 1e-30 or zero: θ, buffers and server state
    stay finite and nothing raises. ~45 s of CPU: 5 simulators × the 11 attack settings."""
    from fedshield.testing import quiet_fuzz

    sims = [
        ("median", (), 0.0),
        ("median", ("step_bound", "reputation"), 0.3),
        ("krum", ("cache", "step_bound", "reputation"), 0.0),
        ("centered_clipping", ("cache", "step_bound"), 0.3),
        ("median", ("collusion", "consistency", "step_bound", "reputation"), 0.3),
    ]
    cases = []
    for i, (agg, defenses, dropout) in enumerate(sims):
        qs = quiet_fuzz.make_sim(agg, defenses, dropout)
        assert qs is not None, (agg, defenses)
        for j, (attack, params) in enumerate(quiet_fuzz.ATTACKS):
            scale = quiet_fuzz.SCALES[(i + j) % len(quiet_fuzz.SCALES)]
            cases.append(quiet_fuzz.run_case(qs, attack, params, scale, rounds=2))
    assert {c.scale for c in cases} == set(quiet_fuzz.SCALES)
    bad = [(c.aggregator, c.defenses, c.attack, c.params, c.scale, c.error)
           for c in cases if not c.finite or c.error or c.rounds != 2]  # fmt: skip
    assert not bad, bad


def test_flower_quiet_attackers_fuzz() -> None:
    """Every Flower-native strategy behind cache + step_bound + reputation, 3 of 10 nodes
    rewritten by a quiet attack in an AttackedStrategy for 2 rounds, honest replies at 0.1
    or 1e30: θ finite, nothing raises, every Byzantine reply rewritten, and the stealth
    rows placed by a radius the strategy published. ~12 s of CPU."""
    from fedshield.testing import flower_fuzz

    bad = []
    for i, name in enumerate(flower_fuzz.STRATEGIES):
        for j, (attack, params) in enumerate(flower_fuzz.QUIET):
            scale = (0.1, 1e30)[(i + j) % 2]
            c = flower_fuzz.quiet_case(name, attack, params, scale)
            published = attack != "stealth" or c.source not in (None, "default")
            if not c.finite or c.error or c.rewritten != 6 or not published:
                bad.append((name, attack, scale, c.rewritten, c.source, c.error))
    assert not bad, bad
