"""Fuzz the real round loop (SPEC §12): crafted uploads against every server × aggregator
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
    results, refused = [], 0
    for masks in (False, True):
        for server, agg in fuzz.pairs(masks):
            pair = fuzz.make_pair(server, agg, masks)
            if pair is None:
                refused += 1
                continue
            # The hardest case for a robust rule: one finite row at float32's edge.
            cases = {("huge_3e38", 1), ("nan", 1)} | set(rng.sample(grid, 2))
            results += [fuzz.run_case(pair, c, k, seed=i) for i, (c, k) in enumerate(cases)]
    ran = [r for r in results if not r.skipped]
    assert len(ran) >= 300, len(ran)
    broken = [r for r in ran if not r.finite or r.error]
    assert not broken, [(r.server, r.aggregator, r.masks, r.corruption, r.error) for r in broken]
    unbounded = [r for r in ran if not r.bounded]
    assert not unbounded, [
        (r.server, r.aggregator, r.masks, r.corruption, r.bad_rows, r.step_norm, r.bound)
        for r in unbounded
    ]
    frozen = [r for r in ran if r.held and r.robust and 2 * r.bad_rows < 10]
    assert not frozen, [(r.server, r.aggregator, r.masks, r.corruption) for r in frozen]
    assert refused < 40  # only the combinations the builder refuses by their tags
