"""The upload check chain (core.integrity) and the coverage-group rule path (docs/security.md)."""

from __future__ import annotations

import pytest
import torch

from fedshield.aggregators.base import Aggregator
from fedshield.algorithms.server.aggregation import aggregate_covered, coverage_groups
from fedshield.algorithms.server.fedavg import coverage_mean
from fedshield.core.context import ClientUpdate
from fedshield.core.flat import stack_rows
from fedshield.core.integrity import FieldSpec, UploadSpec, check_upload, screen

D, B = 6, 2


def upload(k: int = 0, **kw) -> ClientUpdate:
    base = dict(delta=torch.ones(D), num_examples=10, buffers=torch.ones(B))
    base.update(kw)
    return ClientUpdate(k, base.pop("delta"), base.pop("num_examples"), base.pop("buffers"), **base)


SPEC = UploadSpec(num_params=D, dtype=torch.float32, num_buffers=B)


@pytest.mark.parametrize(
    ("kw", "reason"),
    [
        ({"delta": torch.ones(D + 1)}, "delta_shape"),
        ({"delta": torch.ones(D, dtype=torch.float64)}, "delta_dtype"),
        ({"delta": torch.tensor([1.0, float("nan"), 0, 0, 0, 0])}, "delta_nonfinite"),
        ({"delta": torch.tensor([float("-inf"), 1.0, 0, 0, 0, 0])}, "delta_nonfinite"),
        ({"buffers": torch.ones(B + 3)}, "buffers_shape"),
        ({"buffers": torch.tensor([float("nan"), 1.0])}, "buffers_nonfinite"),
        ({"buffers": torch.ones(B, dtype=torch.float64)}, "buffers_dtype"),
        ({"num_examples": -5}, "num_examples"),
        ({"num_examples": 2.5}, "num_examples"),
        ({"num_examples": True}, "num_examples"),
        ({"num_examples": float("inf")}, "num_examples"),
        ({"mask": torch.ones(D, dtype=torch.bool)}, "mask"),
        ({"extras": {"dh": torch.ones(D)}}, "extra_unexpected"),
    ],
)
def test_each_field_is_checked(kw: dict, reason: str) -> None:
    assert check_upload(upload(**kw), SPEC) == reason


def test_a_valid_upload_passes_and_counts_are_replaced_when_known() -> None:
    assert check_upload(upload(), SPEC) is None
    spec = UploadSpec(D, torch.float32, B, trusted_counts={0: 7, 1: 3})
    res = screen([upload(0, num_examples=10**9), upload(1, num_examples=-1)], spec)
    assert [u.num_examples for u in res.kept] == [7, 3]  # the lie is not believed
    res = screen([upload(5)], spec)
    assert not res.kept and res.rejected["unknown_client"] == 1


def test_count_cap_and_metrics() -> None:
    spec = UploadSpec(D, torch.float32, B, max_num_examples=100)
    ups = [upload(0), upload(1, num_examples=101), upload(2, delta=torch.full((D,), torch.nan))]
    res = screen(ups, spec)
    assert [u.client_id for u in res.kept] == [0]
    assert res.metrics() == {
        "sys/rejected": 2.0,
        "sys/rejected/delta_nonfinite": 1.0,
        "sys/rejected/num_examples": 1.0,
    }
    assert ups[1].num_examples == 101  # inputs are not modified


def test_buffer_lower_bounds_refuse_negative_variances() -> None:
    spec = UploadSpec(D, torch.float32, B, buffer_min=torch.tensor([-torch.inf, 0.0]))
    assert check_upload(upload(buffers=torch.tensor([-3.0, 0.5])), spec) is None
    assert check_upload(upload(buffers=torch.tensor([1.0, -0.5])), spec) == "buffers_range"


def test_declared_extras_shape_range_and_expected_value() -> None:
    extras = {
        "p": FieldSpec((2, 3)),
        "n": FieldSpec((2,), min=0.0, integral=True),
        "shape": FieldSpec((2,), equals=torch.tensor([2.0, 3.0])),
    }
    spec = UploadSpec(D, torch.float32, B, extras=extras)
    good = {
        "p": torch.zeros(2, 3),
        "n": torch.tensor([1.0, 4.0]),
        "shape": torch.tensor([2.0, 3.0]),
    }
    assert check_upload(upload(extras=good), spec) is None
    assert check_upload(upload(extras={"p": torch.zeros(3, 2)}), spec) == "extra_p"
    assert check_upload(upload(extras={"n": torch.tensor([1.5, 0.0])}), spec) == "extra_n"
    assert check_upload(upload(extras={"n": torch.tensor([-1.0, 0.0])}), spec) == "extra_n"
    assert check_upload(upload(extras={"shape": torch.tensor([9.0, 3.0])}), spec) == "extra_shape"
    nan = torch.zeros(2, 3)
    nan[0, 0] = torch.nan
    assert check_upload(upload(extras={"p": nan}), spec) == "extra_p"


def test_masks_must_match_the_server_prediction() -> None:
    m = torch.tensor([True, True, True, False, False, False])
    spec = UploadSpec(D, torch.float32, B, masks={0: m, 1: None})
    assert check_upload(upload(0, mask=m.clone()), spec) is None
    assert check_upload(upload(0), spec) == "mask"  # a depth-limited client claiming all
    assert check_upload(upload(0, mask=torch.ones(D, dtype=torch.bool)), spec) == "mask"
    assert check_upload(upload(1), spec) is None
    assert check_upload(upload(1, mask=m), spec) == "mask"


def test_stack_rows_reuses_row_views_and_copies_otherwise() -> None:
    m = torch.randn(4, 5)
    assert stack_rows(list(m)).data_ptr() == m.data_ptr()
    picked = stack_rows([m[0], m[2]])
    assert picked.data_ptr() != m.data_ptr() and torch.equal(picked, m[[0, 2]])


# -- coverage groups -----------------------------------------------------------------------


def test_coverage_groups_partition_the_held_columns() -> None:
    masks = torch.tensor([[1, 1, 1, 0, 0], [1, 1, 0, 0, 0], [1, 1, 1, 0, 1]], dtype=torch.bool)
    groups = {tuple(c.tolist()): tuple(r.tolist()) for r, c in coverage_groups(masks)}
    assert groups == {(0, 1): (0, 1, 2), (2,): (0, 2), (4,): (2,)}  # column 3: nobody


class Recorder(Aggregator):
    """Counts calls and the row counts it saw (a stand-in configured rule)."""

    def __init__(self) -> None:
        self.rows: list[int] = []

    def aggregate(self, updates, weights=None, *, reference=None):
        self.rows.append(updates.shape[0])
        return updates.mean(0), {}


def test_the_configured_rule_runs_per_group_and_equals_eq15_for_the_mean() -> None:
    g = torch.Generator().manual_seed(0)
    deltas = torch.randn(4, 7, generator=g)
    masks = torch.ones(4, 7, dtype=torch.bool)
    masks[0, 4:] = False
    masks[1, 5:] = False
    deltas = deltas * masks
    rule = Recorder()
    out = aggregate_covered(rule, deltas, None, masks, None)
    assert sorted(rule.rows) == [2, 3, 4]  # one call per coverage group, never a substitute
    assert torch.allclose(out.delta, coverage_mean(deltas, None, masks), atol=1e-6)


def test_a_group_the_rule_cannot_serve_is_left_unchanged_and_counted() -> None:
    class NeedsThree(Recorder):
        def validate(self, num_clients: int) -> None:
            from fedshield.errors import ConfigError

            if num_clients < 3:
                raise ConfigError("needs 3 rows")

    masks = torch.tensor([[1, 1, 1], [1, 1, 0], [1, 0, 0]], dtype=torch.bool)
    deltas = torch.ones(3, 3) * masks
    out = aggregate_covered(NeedsThree(), deltas, None, masks, None)
    assert out.delta.tolist() == [1.0, 0.0, 0.0] and out.skipped == 2
    assert out.covered.tolist() == [True, False, False]
