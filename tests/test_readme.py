"""The README and docs/ document the code as it is: the hyperparameters, the metric definitions and
the serving defaults as the code defines them, a README short enough to read, and no broken links."""

import re
from pathlib import Path

from byoc.training.arguments import hyperparameter_table
from byoc.training.metrics import METRIC_DEFINITIONS

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
README = (ROOT / "README.md").read_text()


def doc(name: str) -> str:
    return (DOCS / name).read_text()


def table_rows(text: str) -> list[list[str]]:
    """The cells of every Markdown table row, stripped of spaces and of the backticks around them."""
    rows = []
    for line in text.splitlines():
        line = line.strip()
        if not (line.startswith("|") and line.endswith("|")):
            continue
        cells = re.split(r"(?<!\\)\|", line[1:-1])
        rows.append([cell.strip().replace("\\|", "|").strip("`") for cell in cells])
    return rows


def test_hyperparameter_table_is_current():
    # Regenerate with: .venv/bin/python -c "from byoc.training.arguments import hyperparameter_table as t; print(t())"
    # and paste the output over the table in docs/hyperparameters.md.
    assert hyperparameter_table() in doc("hyperparameters.md")


def test_metric_definitions_are_documented():
    """Each definition is one row of docs/training.md's table, holding its Name and its Regex exactly."""
    rows = table_rows(doc("training.md"))
    for definition in METRIC_DEFINITIONS:
        matching = [row for row in rows if definition["Name"] in row and definition["Regex"] in row]
        assert matching, f"no table row in docs/training.md with {definition['Name']} and {definition['Regex']}"


def test_server_defaults_are_documented():
    """The serving settings table in docs/serving.md gives the defaults `byoc serve` really uses."""
    import dataclasses

    from byoc.serving.server import ServeSettings

    serving = doc("serving.md")
    defaults = {f.name: f.default for f in dataclasses.fields(ServeSettings)}
    for variable, field in (
        ("BYOC_MAX_BATCH_SIZE", "max_batch"),
        ("BYOC_GRACEFUL_TIMEOUT", "graceful_timeout"),
        ("BYOC_MAX_BATCH_DELAY_MS", "max_delay_ms"),
    ):
        row = next(line for line in serving.splitlines() if line.startswith(f"| `{variable}` |"))
        assert float(row.split("|")[2]) == defaults[field], row


def test_readme_is_short_and_starts_with_the_two_commands():
    lines = README.splitlines()
    assert len(lines) < 250, f"README.md has {len(lines)} lines: move detail to docs/"
    first_screen = "\n".join(lines[:30])
    assert "make demo" in first_screen and "make test" in first_screen


def test_relative_links_point_to_files_that_exist():
    """Every relative link in README.md and docs/*.md names a file (or folder) of the repository."""
    pages = [ROOT / "README.md", *sorted(DOCS.glob("*.md"))]
    broken = []
    for page in pages:
        text = re.sub(r"```.*?```", "", page.read_text(), flags=re.DOTALL)  # code blocks hold no links
        for target in re.findall(r"\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)", text):
            if re.match(r"[a-z][a-z0-9+.-]*:", target) or target.startswith("#"):
                continue  # a URL (https:, mailto:) or an anchor on the same page
            path = target.split("#", 1)[0]
            if not (page.parent / path).exists():
                broken.append(f"{page.relative_to(ROOT)}: {target}")
    assert not broken, "links to missing files:\n" + "\n".join(broken)
