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


def _job_steps(source: str, function: str) -> list[str]:
    """The byoc.job steps `function` calls, in order (`job.prepare(...)` and `prepare(...)` alike)."""
    import ast

    steps = {"stop_on_sigterm", "prepare", "load_model", "make_trainer", "train_and_evaluate", "finish", "teardown"}
    tree = next(n for n in ast.walk(ast.parse(source)) if isinstance(n, ast.FunctionDef) and n.name == function)
    calls = [n for n in ast.walk(tree) if isinstance(n, ast.Call)]
    names = [(c.lineno, c.col_offset, getattr(c.func, "attr", getattr(c.func, "id", ""))) for c in calls]
    return [name for _, _, name in sorted(names) if name in steps]


def test_code_train_py_runs_the_steps_byoc_train_runs():
    """The script users copy composes the same steps, in the same order, as `byoc train`'s job."""
    ours = _job_steps((REPO / "container" / "byoc" / "job.py").read_text(), "run_training")
    theirs = _job_steps((REPO / "code" / "train.py").read_text(), "main")
    assert (
        ours
        == theirs
        == ["stop_on_sigterm", "prepare", "load_model", "make_trainer", "train_and_evaluate", "finish", "teardown"]
    )
