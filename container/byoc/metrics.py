"""`byoc.metrics`: `METRIC_DEFINITIONS` for `Estimator(metric_definitions=...)`, at the path the
README gives. The metrics live in byoc.training.metrics; this module only re-exports them."""

from byoc.training.metrics import METRIC_DEFINITIONS, classification_metrics

__all__ = ["METRIC_DEFINITIONS", "classification_metrics"]
