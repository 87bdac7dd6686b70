"""The package's shape stays as docs/architecture.md describes it: no import cycle, no module over
the size limit, and the import graph in the doc equal to the code's."""

from __future__ import annotations

import importlib.util
import sys

from helpers import REPO

spec = importlib.util.spec_from_file_location("import_graph", REPO / "scripts" / "import_graph.py")
import_graph = importlib.util.module_from_spec(spec)
sys.modules["import_graph"] = import_graph
spec.loader.exec_module(import_graph)


def test_no_import_cycle():
    assert import_graph.cycles(import_graph.graph()) == []


def test_the_cycle_finder_finds_a_cycle():
    """The check above can fail: a planted cycle is found, and so is a longer one."""
    assert import_graph.cycles({"a": {"b"}, "b": {"a"}, "c": set()}) == [["a", "b"]]
    assert import_graph.cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == [["a", "b", "c"]]


def test_no_module_over_the_size_limit():
    assert import_graph.oversized() == []


def test_local_imports_count_as_dependencies(tmp_path):
    """A function-local import hides a dependency from a reader, not from the graph."""
    path = import_graph.PACKAGE / "cli.py"
    assert "byoc.job" in import_graph.imports_of(path, set(import_graph.modules()))


def test_architecture_doc_shows_the_current_graph():
    # Regenerate with: .venv/bin/python scripts/import_graph.py
    doc = (REPO / "docs" / "architecture.md").read_text()
    assert import_graph.render(import_graph.graph()) in doc
