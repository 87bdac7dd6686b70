"""The README and docs/ document the code as it is: the hyperparameters, the metric definitions and
the serving defaults as the code defines them, a README short enough to read whose first screen ends
in a served answer, a layout in docs/architecture.md with every module, and no broken links."""

import ast
import json
import re
from pathlib import Path

from readme_example import served_example, shape

from byoc.training.argument_table import hyperparameter_table
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
    # Regenerate: .venv/bin/python -c "from byoc.training.argument_table import hyperparameter_table as t; print(t())"
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
        documented = row.split("|")[2].strip()
        assert (None if documented == "auto" else float(documented)) == defaults[field], row


def test_readme_is_short_and_its_first_screen_ends_in_an_answer():
    """The first screen takes a newcomer from nothing to an answer: `make demo` (the main job on an
    embedded default), `byoc serve` on the demo's model, one `curl` request and its answer, then
    `make test` (the whole suite): the two commands on a fresh machine, and what lies between."""
    lines = README.splitlines()
    assert len(lines) < 250, f"README.md has {len(lines)} lines: move detail to docs/"
    first_screen = "\n".join(lines[:40])
    assert "Two commands on a fresh machine" in first_screen
    at = 0
    for step in ["make demo", "byoc serve", "curl ", "```json", "make test"]:  # in this order
        at = first_screen.find(step, at)
        assert at >= 0, f"the README's first 40 lines lack {step!r} after the steps before it"


def test_readme_request_and_answer_are_well_formed():
    """The README's curl request parses (tests/test_demo.py sends it to the demo's model) and its answer
    is one {"label", "score"} per input."""
    example = served_example(README)
    assert example.path == "/invocations"
    assert example.headers["content-type"] == "application/json"
    inputs = json.loads(example.body)["inputs"]
    assert isinstance(example.answer, list) and len(example.answer) == len(inputs)
    assert all(shape(item) == {"label": "str", "score": "number"} for item in example.answer)


def layout_paths(block: str) -> set[str]:
    """The files a layout block names, as paths: a line ending in `/` is a folder, and the lines
    indented under it are in it; `#` lines are headings."""
    folders: list[tuple[int, str]] = []
    paths = set()
    for line in block.splitlines():
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        indent, name = len(line) - len(line.lstrip()), line.split()[0]
        while folders and folders[-1][0] >= indent:
            folders.pop()
        if name.endswith("/"):
            folders.append((indent, name.rstrip("/")))
        else:
            paths.add("/".join([folder for _, folder in folders] + [name]))
    return paths


def test_architecture_doc_lists_every_module():
    """docs/architecture.md's layout gives every module of the package one line, and names none that
    is gone: a new or moved module moves its line."""
    architecture = doc("architecture.md")
    block = re.search(r"## Layout\n.*?```\n(.*?)```", architecture, flags=re.DOTALL).group(1)
    listed = {path for path in layout_paths(block) if path.startswith("container/byoc/")}
    modules = {
        str(path.relative_to(ROOT))
        for path in (ROOT / "container" / "byoc").rglob("*.py")
        if len(ast.parse(path.read_text()).body) > 1 or path.name != "__init__.py"  # a room's docstring-only marker
    }
    assert not modules - listed, f"modules without a line in docs/architecture.md's layout: {sorted(modules - listed)}"
    assert not listed - modules, f"docs/architecture.md's layout names missing modules: {sorted(listed - modules)}"


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


def test_every_file_that_runs_once_exists_and_testing_md_lists_it():
    import conftest

    testing = doc("testing.md")
    for name in conftest.ONCE:
        assert (ROOT / "tests" / name).is_file(), f"conftest.ONCE names {name}, which is no test file"
        assert f"`{name}`" in testing, f"docs/testing.md does not list {name}, which runs in the main tier only"


def test_the_readmes_error_codes_are_the_servers():
    """The README's list of error statuses names every status of serving.md's error table, and of
    the multi-model routes (404, 409, 507): it once lacked 408, 431 and 507."""
    import re

    serving = (ROOT / "docs" / "serving.md").read_text()
    errors = serving[serving.index("## Errors") : serving.index("### Connections")]
    table = set(re.findall(r"^\| (\d{3}) \|", errors, flags=re.M))
    sentence = README[README.index("Errors are JSON") :].split("\n\n")[0]
    listed = set(re.findall(r"\b(\d{3})\b", sentence))
    assert table - listed == set() and {"404", "409", "507"} <= listed, sentence


def test_every_module_has_its_test_file_or_testing_md_says_where_it_is_tested():
    import re

    package = ROOT / "container" / "byoc"
    doc = (ROOT / "docs" / "testing.md").read_text()
    section = doc[doc.index("## Modules tested through others") : doc.index("## Docs kept in step")]
    listed: dict[str, list[str]] = {}
    for row in section.splitlines():
        if row.startswith("| `byoc."):
            modules, files = row.split(" | ")[:2]
            for module in re.findall(r"`(byoc[\w.]*)`", modules):
                listed[module] = re.findall(r"`([\w/]+\.py)`", files)
    for path in sorted(package.rglob("*.py")):
        parts = path.relative_to(package).with_suffix("").parts
        if parts[-1] == "__init__":
            if len(ast.parse(path.read_text()).body) <= 1:
                continue  # a room's or a group's marker: a docstring
            parts = parts[:-1]
        module = ".".join(("byoc", *parts))
        if module == "byoc":
            continue  # the package's version
        own = ROOT / "tests" / Path(*parts[:-1]) / f"test_{parts[-1]}.py" if parts else None
        if own is not None and own.is_file():
            assert module not in listed, f"{module} has {own.name}: drop its row from testing.md"
            continue
        assert listed.get(module), f"{module} has no {own}: add it, or say in testing.md where it is tested"
        for name in listed[module]:
            assert (ROOT / "tests" / name).is_file(), f"testing.md: {module} is tested in {name}, which is not there"
    assert set(listed) <= {
        ".".join(("byoc", *p.relative_to(package).with_suffix("").parts)).removesuffix(".__init__")
        for p in package.rglob("*.py")
    }, "testing.md names a module that is gone"
