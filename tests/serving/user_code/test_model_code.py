"""byoc.serving.user_code.model_code: each model's code imports its own siblings, whatever idiom it uses,
and an unload leaves nothing of it behind (in-process; the server's view: serving/test_multi_model.py)."""

from __future__ import annotations

import gc
import sys
import weakref
from pathlib import Path

import pytest

from byoc.serving.user_code import model_code

# The common idiom: the module puts its folder on sys.path itself, imports a helper at the top and
# another one inside a function (at call time, when every model's folder may be on sys.path).
INFERENCE = """
import os, sys
sys.path.insert(0, os.path.dirname(__file__))
import helper


def labels():
    import late
    from helper import LABEL
    return helper.LABEL, LABEL, late.LABEL
"""


def model(root: Path, name: str, files: dict[str, str] | None = None) -> Path:
    code = root / name / "code"
    code.mkdir(parents=True)
    files = files or {"inference.py": INFERENCE, "helper.py": f"LABEL = {name!r}\n", "late.py": f"LABEL = {name!r}\n"}
    for filename, source in files.items():
        (code / filename).parent.mkdir(parents=True, exist_ok=True)
        (code / filename).write_text(source)
    return code / "inference.py"


@pytest.fixture
def imported():
    """Forget what a test imported, whatever it asserted."""
    names: list[tuple[str, str]] = []

    def load(path: Path, name: str):
        names.append((name, str(path.parent)))
        return model_code.import_isolated(path, name)

    yield load
    for name, folder in names:
        model_code.forget(name, folder)


def test_each_model_gets_its_own_siblings_at_import_and_at_call_time(tmp_path, imported):
    a = imported(model(tmp_path, "a"), "byoc_model_a")
    b = imported(model(tmp_path, "b"), "byoc_model_b")
    # Both folders are on sys.path now (the idiom), b's first: a's lazy `import late` found b's before.
    assert a.labels() == ("a", "a", "a") and b.labels() == ("b", "b", "b")
    assert a.labels() == ("a", "a", "a")  # and again, once both are imported
    assert "helper" not in sys.modules and "late" not in sys.modules
    assert sys.modules["byoc_model_a.helper"].__file__.startswith(str(tmp_path / "a"))
    assert a.helper.__spec__.origin == str(tmp_path / "a" / "code" / "helper.py")


def test_a_sibling_package_imported_at_the_top_is_the_models_own(tmp_path, imported):
    files = lambda label: {
        "inference.py": "from tools import shout\nfrom tools.words import WORD\n",
        "tools/__init__.py": "def shout():\n    return 'TOOLS'\n",
        "tools/words.py": f"WORD = {label!r}\n",
    }
    a = imported(model(tmp_path, "a", files("a")), "byoc_model_a")
    b = imported(model(tmp_path, "b", files("b")), "byoc_model_b")
    assert (a.WORD, b.WORD, a.shout()) == ("a", "b", "TOOLS")
    assert "tools" not in sys.modules and "tools.words" not in sys.modules


def test_modules_that_are_not_the_models_import_as_usual(tmp_path, imported):
    files = {"inference.py": "import json\nimport helper\n", "helper.py": "import textwrap\n"}
    m = imported(model(tmp_path, "m", files), "byoc_model_m")
    assert m.json is sys.modules["json"] and sys.modules["byoc_model_m.helper"].textwrap is sys.modules["textwrap"]


def test_forgetting_a_model_leaves_nothing_of_it(tmp_path, imported):
    files = {
        "inference.py": INFERENCE,
        "helper.py": "class Big:\n    data = bytearray(5 << 20)\n\n\nBIG = Big()\nLABEL = 'x'\n",
        "late.py": "LABEL = 'x'\n",
    }
    path = model(tmp_path, "m", files)
    module = imported(path, "byoc_model_m")
    assert module.labels() == ("x", "x", "x")
    big = weakref.ref(module.helper.BIG)
    del module
    model_code.forget("byoc_model_m", str(path.parent))
    gc.collect()
    assert [name for name in sys.modules if name.startswith("byoc_model_m")] == []
    assert [entry for entry in sys.path if entry.startswith(str(tmp_path))] == []
    assert big() is None  # nothing holds the model's module-level objects


def test_a_module_that_fails_to_import_leaves_nothing(tmp_path):
    files = {"inference.py": "import helper\nraise RuntimeError('broken')\n", "helper.py": "X = 1\n"}
    path = model(tmp_path, "m", files)
    with pytest.raises(RuntimeError, match="broken"):
        model_code.import_isolated(path, "byoc_model_m")
    assert [name for name in sys.modules if name.startswith("byoc_model_m")] == []
    assert str(path.parent) not in sys.path


def test_a_program_that_is_not_python_is_refused(tmp_path):
    path = tmp_path / "serve.sh"
    path.write_text("echo hi\n")
    with pytest.raises(model_code.NotPython):
        model_code.import_isolated(path, "byoc_model_sh")


def test_a_sibling_runs_once(tmp_path, imported):
    files = {"inference.py": INFERENCE, "helper.py": "import counter\ncounter.RUNS.append(1)\nLABEL = 'x'\n"}
    files |= {"late.py": "LABEL = 'x'\n", "counter.py": "RUNS = []\n"}
    m = imported(model(tmp_path, "m", files), "byoc_model_m")
    m.labels()
    m.labels()
    assert sys.modules["byoc_model_m.counter"].RUNS == [1]
    assert sorted(name for name in sys.modules if name.startswith("byoc_model_m")) == [
        "byoc_model_m", "byoc_model_m.counter", "byoc_model_m.helper", "byoc_model_m.late"
    ]  # fmt: skip


def test_a_module_that_fails_after_importing_a_sibling_package_leaves_nothing(tmp_path):
    files = {"inference.py": "import tools\nraise RuntimeError('broken')\n", "tools/__init__.py": "X = 1\n"}
    path = model(tmp_path, "m", files)
    with pytest.raises(RuntimeError, match="broken"):
        model_code.import_isolated(path, "byoc_model_m")
    assert [name for name in sys.modules if name.startswith("byoc_model_m") or name == "tools"] == []


def test_a_librarys_imports_never_find_the_models_files(tmp_path, imported, monkeypatch):
    """A library's first import of a module the model also has a file of, made while the model's code
    runs (the finder answered it), or with the model's folder on sys.path (the idiom), got the model's."""
    library = tmp_path / "site"
    library.mkdir()
    (library / "somelib.py").write_text(
        "import importlib.util\n\n\ndef load():\n    import shadowed_by_model\n    return shadowed_by_model\n\n\n"
        "def probe():\n    return importlib.util.find_spec('only_in_model')\n"
    )
    (library / "shadowed_by_model.py").write_text("FROM = 'library'\n")
    monkeypatch.syspath_prepend(str(library))
    calls = "\n\ndef through_library():\n    import shadowed_by_model as mine\n    import somelib\n"
    calls += "    return mine, somelib.load(), somelib.probe()\n"
    files = {"inference.py": INFERENCE + calls, "helper.py": "LABEL = 'm'\n", "late.py": "LABEL = 'm'\n"}
    files |= {"shadowed_by_model.py": "FROM = 'model'\n", "only_in_model.py": ""}
    m = imported(model(tmp_path, "m", files), "byoc_model_m")
    try:
        mine, got, probed = m.through_library()  # the model's code on the stack, its folder first on sys.path
        assert mine.FROM == "model" and mine is sys.modules["byoc_model_m.shadowed_by_model"]  # its own file
        assert got.FROM == "library" and sys.modules["shadowed_by_model"] is got
        assert probed is None  # a name only the model's folder has: no library finds it
    finally:
        for name in ("somelib", "shadowed_by_model"):
            sys.modules.pop(name, None)
