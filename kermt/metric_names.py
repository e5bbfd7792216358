"""The metric a run scores with: ``--metric`` checked against the dataset type, or the type's default. Names only,
so that settings and input checks can use them without importing sklearn (the names, which dataset type each
scores and the defaults: ``kermt.registry``; the functions: ``kermt.metrics``).

Upstream's parsing refuses a metric of the other dataset type; so do we, before anything runs: a threshold metric
(auc, accuracy, ...) of continuous labels fails inside sklearn only when the first validation epoch is scored, and
a regression metric of 0/1 labels would score probabilities as if they were values.
"""

from __future__ import annotations

from kermt.errors import UserError
from kermt.registry import DEFAULT_METRIC, METRIC_NAMES, METRICS_FOR


def resolve_metric(metric: str | None, dataset_type: str, dataset_type_origin: str = "") -> str:
    """The metric a run scores with: ``metric`` (the user's ``--metric``) or the dataset type's default.

    ``dataset_type_origin`` says where the dataset type came from when the user did not give it (e.g. "inferred
    from the labels"). A metric of the other dataset type is a UserError naming the valid ones."""
    if metric is None:
        return DEFAULT_METRIC[dataset_type]
    valid = METRICS_FOR[dataset_type]
    if metric not in valid:
        origin = f" ({dataset_type_origin})" if dataset_type_origin else ""
        raise UserError(f"--metric {metric} does not apply to dataset_type {dataset_type}{origin}; for "
                        f"{dataset_type} choose one of {', '.join(valid)}")
    return metric


__all__ = ["DEFAULT_METRIC", "METRICS_FOR", "METRIC_NAMES", "resolve_metric"]
