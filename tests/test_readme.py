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


def test_server_defaults_are_documented():
    """The serving environment table gives the defaults `byoc serve` really uses."""
    import dataclasses

    from byoc.serve import ServeSettings

    defaults = {f.name: f.default for f in dataclasses.fields(ServeSettings)}
    for variable, field in (("BYOC_MAX_BATCH_SIZE", "max_batch"), ("BYOC_GRACEFUL_TIMEOUT", "graceful_timeout"),
                            ("BYOC_MAX_BATCH_DELAY_MS", "max_delay_ms")):
        row = next(line for line in README.splitlines() if line.startswith(f"| `{variable}` |"))
        assert float(row.split("|")[2]) == defaults[field], row
