"""The CLI's bad-input contract under 500 mutated configs: non-finite numbers
in every parameter table, extreme and wrong-typed values anywhere, swapped component
names. Every case ends with one ``error:`` line and exit 2, or passes every check before
the data; none escapes as a traceback (98 of the same 500 did on the issue's commit:
``TypeError: Object of type 'NoneType' is not TOML serializable``)."""

from __future__ import annotations

import pytest

from fedshield.testing.config_fuzz import PARAM_TABLES, cases, run_fuzz


@pytest.mark.slow
def test_500_mutated_configs_give_no_traceback(tmp_path) -> None:
    counts, bad = run_fuzz(500, tmp_path, seed=0)
    assert sum(counts.values()) == 500
    assert not bad, "\n\n".join(f"{b.case.preset} {b.case.mutations}\n{b.detail}" for b in bad)
    assert counts["refused"] > 300 and counts["accepted"] > 0  # both sides are exercised


def test_the_fuzz_reaches_every_parameter_table_with_non_finite_values() -> None:
    hits = set()
    for case in cases(500, seed=0):
        for m in case.mutations:  # "server.aggregator_args.c=nan", "...=[1, -inf]", ...
            key, _, value = m.partition("=")
            if "nan" in value or "inf" in value:
                hits.add(key.rsplit(".", 1)[0])
    assert {t for t, _ in PARAM_TABLES} <= hits
    assert any(h.startswith("eval.params.") for h in hits)
