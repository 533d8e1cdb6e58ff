"""The suite's own scheduling holds: the modules that start Ray, Flower's simulation engine
or SuperLink/SuperNode processes (``pytestmark = pytest.mark.xdist_group("processes")``)
share one xdist worker under ``--dist loadgroup``, so two Ray instances never compete for
the two cores.

With pytest 9.2 and pytest-xdist 3.8 every ``xdist_group`` mark was silently ignored: the
Ray module's set-up ran on both workers at once, ~100 s each instead of 26 s once. pyproject
pins pytest below 9.2 and this test fails where the grouping does not apply."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.xdist_group("processes")


def test_grouped_tests_carry_their_group_under_loadgroup(request: pytest.FixtureRequest) -> None:
    if not getattr(request.config.option, "loadgroup", False):  # set in xdist workers only
        pytest.skip("not run by `pytest -n N --dist loadgroup`")
    # xdist's scheduler groups by this suffix of the node id (its `_split_scope`)
    assert request.node.nodeid.endswith("@processes"), request.node.nodeid
