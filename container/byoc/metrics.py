"""`byoc.metrics`, public API: `METRIC_DEFINITIONS` for `Estimator(metric_definitions=...)` (the
regexes that read each evaluation's metrics from the job's log; `metric_definitions("embedding")` an
embedding model's), and `classification_metrics`. They
live in byoc.training.metrics and byoc.tasks.single_label; this module re-exports them, the same objects, by name."""

from byoc.tasks.single_label import classification_metrics
from byoc.training.metrics import METRIC_DEFINITIONS, metric_definitions

__all__ = ["METRIC_DEFINITIONS", "classification_metrics", "metric_definitions"]
