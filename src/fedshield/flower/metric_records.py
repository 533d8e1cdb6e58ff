"""The Flower-native strategies' default ``train_metrics_aggr_fn`` and
``evaluate_metrics_aggr_fn``: clients' metric records through the robust median of
:mod:`fedshield.core.client_metrics`, not Flower's sample-weighted mean.

Flower's default (``aggregate_metricrecords``) averages each key weighted by the reported
sample count: one client reporting ``train_loss = 1.7e308`` with a large count makes it
``inf``, and a count is reported by the same client. The median over the replies ignores
the weights (they are untrusted too) and stays within the honest majority's values.
"""

from __future__ import annotations

from typing import Any

from flwr.app import MetricRecord, RecordDict

from fedshield.core.client_metrics import robust_metrics


def robust_metricrecords(records: list[RecordDict], weighting_metric_name: str) -> MetricRecord:
    """Each key's float64 median over the replies' metric records (the sample-count key
    ``weighting_metric_name`` is not a metric; a key whose median is non-finite is left
    out). Flower's ``*_metrics_aggr_fn`` signature."""
    reports: list[dict[str, Any]] = []
    for content in records:
        for record in content.metric_records.values():
            reports.append(dict(record.items()))
    out = robust_metrics(reports, skip=(weighting_metric_name,))
    return MetricRecord({k: v for k, v in out.items()})


__all__ = ["robust_metricrecords"]
