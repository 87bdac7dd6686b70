"""The README documents every hyperparameter and the metric definitions as the code defines them."""

from pathlib import Path

from byoc.arguments import hyperparameter_table
from byoc.metrics import METRIC_DEFINITIONS

README = (Path(__file__).resolve().parents[1] / "README.md").read_text()


def test_hyperparameter_table_is_current():
    # Regenerate with: .venv/bin/python -c "from byoc.arguments import hyperparameter_table as t; print(t())"
    assert hyperparameter_table() in README


def test_metric_definitions_are_documented():
    for definition in METRIC_DEFINITIONS:
        assert definition["Name"] in README
