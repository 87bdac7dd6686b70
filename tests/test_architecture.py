"""The package's shape stays as docs/architecture.md describes it: three rooms whose walls hold (serving
imports nothing of training or launch, training nothing of serving, the shared floor neither), no
import cycle, no module over the size limit, and the import graph in the doc equal to the code's."""

from __future__ import annotations

import ast
import importlib.util
import re
import shutil
import subprocess
import sys

from helpers import REPO

spec = importlib.util.spec_from_file_location("import_graph", REPO / "scripts" / "import_graph.py")
import_graph = importlib.util.module_from_spec(spec)
sys.modules["import_graph"] = import_graph
spec.loader.exec_module(import_graph)


def test_the_rooms_walls_hold():
    assert import_graph.layer_violations(import_graph.graph()) == []


def test_a_serving_module_that_imports_training_breaks_the_wall(tmp_path):
    """The check above can fail: a function-local import of the training job planted in a copy of the
    server is found, and so is the floor importing a room."""
    copy = tmp_path / "byoc"
    shutil.copytree(import_graph.PACKAGE, copy, ignore=shutil.ignore_patterns("__pycache__"))
    server = copy / "serving" / "server.py"
    server.write_text(server.read_text() + "\n\ndef planted():\n    from byoc.training import job  # noqa\n")
    files = copy / "safe_files.py"
    files.write_text(files.read_text() + "\nfrom byoc.serving.backends.passes import CPU  # noqa\n")
    assert import_graph.layer_violations(import_graph.graph(copy)) == [
        "byoc.safe_files (floor) imports byoc.serving.backends.passes (serving)",
        "byoc.serving.server (serving) imports byoc.training.job (training)",
    ]


def test_each_module_belongs_to_one_room():
    rooms = {name: import_graph.room_of(name) for name in import_graph.modules()}
    assert rooms["byoc.serving.server"] == "serving" and rooms["byoc.training.job"] == "training"
    assert rooms["byoc.launch.launcher"] == "launch" and rooms["byoc.errors"] == "floor"
    assert rooms["byoc.inference"] == "shims" and rooms["byoc.cli"] == "entry"
    shims = [(REPO / "container" / (name.replace(".", "/") + ".py")) for name in import_graph.SHIMS]
    for shim in shims:  # the re-exports hold no code of their own: imports and __all__ only
        import ast

        body = ast.parse(shim.read_text()).body
        kinds = {type(node).__name__ for node in body[1:]}  # after the docstring
        assert kinds <= {"ImportFrom", "Assign"}, (shim, kinds)


def test_the_public_api_names_each_name_once_and_the_doc_lists_them():
    """Each public module re-exports by name (no `import *`), exactly its `__all__`, and the doc's
    table of the public API names every one of them."""
    import ast
    import importlib

    doc = (REPO / "docs" / "architecture.md").read_text()
    table = doc[doc.index("## The public API") :]
    for name in import_graph.SHIMS:
        path = REPO / "container" / (name.replace(".", "/") + ".py")
        imported = [
            alias.asname or alias.name
            for node in ast.parse(path.read_text()).body
            if isinstance(node, ast.ImportFrom)
            for alias in node.names
        ]
        assert "*" not in imported, name
        assert sorted(imported) == sorted(importlib.import_module(name).__all__), name
        row = next(line for line in table.splitlines() if line.startswith(f"| `{name}` |"))
        assert [n for n in imported if f"`{n}`" not in row] == [], name


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
    assert "byoc.training.entry" in import_graph.imports_of(path, set(import_graph.modules()))


# A module whose functions import what they use, for one reason given once at its top.
MODULE_REASON = "# Imported where used:"


def local_imports_without_a_reason(root):
    """ "path:line" of each import inside a function with no comment saying why: on its group of import
    lines, on the two lines above the group, or once for the whole module (MODULE_REASON)."""
    missing = []
    for path in sorted(root.rglob("*.py")):
        lines = path.read_text().splitlines()
        if any(line.startswith(MODULE_REASON) for line in lines):
            continue
        is_import = lambda i, lines=lines: lines[i].strip().startswith(("import ", "from "))
        for node in ast.walk(ast.parse("\n".join(lines))):
            if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            for inner in ast.walk(node):
                if isinstance(inner, (ast.Import, ast.ImportFrom)):
                    first = last = inner.lineno - 1
                    while first > 0 and is_import(first - 1):
                        first -= 1
                    while last + 1 < len(lines) and is_import(last + 1):
                        last += 1
                    if not any("#" in line for line in lines[max(0, first - 2) : last + 1]):
                        missing.append(f"{path.relative_to(root)}:{inner.lineno}")
    return sorted(set(missing))


def test_each_import_inside_a_function_says_why(tmp_path):
    """docs/architecture.md promises it: an import inside a function keeps a module light or an
    optional package optional, and says which."""
    assert local_imports_without_a_reason(import_graph.PACKAGE) == []
    (tmp_path / "quiet.py").write_text("def f():\n    import json\n\n    return json\n")
    (tmp_path / "said.py").write_text("def f():\n    # Only here: a reason.\n    import json\n\n    return json\n")
    assert local_imports_without_a_reason(tmp_path) == ["quiet.py:2"]


def test_architecture_doc_shows_the_current_graph():
    # Regenerate with: .venv/bin/python scripts/import_graph.py
    doc = (REPO / "docs" / "architecture.md").read_text()
    assert import_graph.render(import_graph.graph()) in doc


def test_the_request_and_the_jobs_way_name_modules_that_exist_in_the_order_they_run():
    """docs/architecture.md tells one request's way and one job's way, each module named where it acts: a module
    renamed or moved is renamed there too, and the job's steps are told in the order byoc.training.job runs them."""
    import re

    doc = (REPO / "docs" / "architecture.md").read_text()
    modules = set(import_graph.graph())
    for title in ("## A request's way", "## A job's way"):
        section = doc.split(title, 1)[1].split("\n## ", 1)[0]
        named = {m.rstrip(".") for m in re.findall(r"`(byoc(?:\.[a-z_]+)*)", section)}
        known = {m for m in named if m in modules or any(k.startswith(m + ".") for k in modules)}
        missing = {m for m in named - known if m.rsplit(".", 1)[0] not in modules}  # (a module's function or class)
        assert len(named) >= 15 and missing == set(), (title, missing)
    job = doc.split("## A job's way", 1)[1].split("\n## ", 1)[0]
    told = [
        s for s in ("prepare", "load_model", "make_trainer", "train_and_evaluate", "finish", "teardown") if s in job
    ]
    assert sorted(told, key=job.index) == _job_steps((REPO / "container/byoc/training/job.py").read_text(), "main")[1:]


def _job_steps(source: str, function: str) -> list[str]:
    """The byoc.training.job steps `function` calls, in order (`job.prepare(...)` and `prepare(...)` alike)."""
    import ast

    steps = {"stop_on_sigterm", "prepare", "load_model", "make_trainer", "train_and_evaluate", "finish", "teardown"}
    tree = next(n for n in ast.walk(ast.parse(source)) if isinstance(n, ast.FunctionDef) and n.name == function)
    calls = [n for n in ast.walk(tree) if isinstance(n, ast.Call)]
    names = [(c.lineno, c.col_offset, getattr(c.func, "attr", getattr(c.func, "id", ""))) for c in calls]
    return [name for _, _, name in sorted(names) if name in steps]


def test_code_train_py_runs_the_steps_byoc_train_runs():
    """The script users copy composes the same steps, in the same order, as `byoc train`'s job."""
    ours = _job_steps((REPO / "container" / "byoc" / "training" / "job.py").read_text(), "main")
    theirs = _job_steps((REPO / "code" / "train.py").read_text(), "main")
    assert (
        ours
        == theirs
        == ["stop_on_sigterm", "prepare", "load_model", "make_trainer", "train_and_evaluate", "finish", "teardown"]
    )


def test_the_trainer_is_used_through_its_public_surface():
    """No private `Trainer` method is called, and no attribute set on a trainer, outside the trainer
    module: the job configures it through constructor parameters and public methods."""
    import ast

    offences = []
    for name, path in import_graph.modules().items():
        if name == "byoc.training.trainer":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "trainer":
                if node.attr.startswith("_") or isinstance(node.ctx, ast.Store):
                    offences.append(f"{name}:{node.lineno} trainer.{node.attr}")
    assert offences == []


MODEL_SIDE = ("protocol", "backends", "execution", "user_code")  # serving's subpackages by concern, below http


def test_the_model_side_of_the_server_knows_nothing_of_http():
    """The model side answers with an Answer or raises a request error; serving/http makes the response."""
    edges = import_graph.graph()
    side = tuple(f"byoc.serving.{name}." for name in MODEL_SIDE) + (
        "byoc.serving.multi_model",
        "byoc.serving.default_pipeline",
    )
    model_side = {m: t for m, t in edges.items() if m.startswith(side)}
    assert {m.split(".")[2] for m in model_side} == {*MODEL_SIDE, "multi_model", "default_pipeline"}  # every part
    assert not {(m, t) for m, ts in model_side.items() for t in ts if t.startswith("byoc.serving.http")}
    folders = [REPO / "container/byoc/serving" / name for name in MODEL_SIDE]
    source = "\n".join(p.read_text() for folder in folders for p in folder.glob("*.py"))
    source += (REPO / "container/byoc/serving/default_pipeline.py").read_text()
    assert "starlette" not in source and (REPO / "container/byoc/serving/multi_model.py").exists()


# The two places a task is decided: training, from the data; serving, from config.json (byoc.tasks.of_config).
TASK_DECISIONS = ("tasks/", "training/data/task_choice.py")


TASK_CONSTANTS = {
    "SINGLE_LABEL",
    "MULTI_LABEL",
    "REGRESSION",
    "TOKEN_CLASSIFICATION",
    "EMBEDDING",
    "SPARSE_EMBEDDING",
    "RERANKER",
}
TASK_FLAGS = {"per_token", "vectors"}  # the flags a room once branched on (a task's methods replace them)


def task_reads(root) -> list[str]:
    """ "path:line" of each place outside the task package and the task's decision from the data that names a
    task or reads a task flag: a task's constant (SINGLE_LABEL... EMBEDDING) used at all; a task's name as a
    string in a comparison; an attribute `per_token` or `vectors`; a request's shape read from the client's
    `parameters` (the body's form decides it: byoc.serving.protocol.bodies)."""
    from byoc import tasks

    def names_a_task(node) -> bool:
        if isinstance(node, ast.Constant):
            return node.value in tasks.NAMES
        return isinstance(node, (ast.Tuple, ast.List, ast.Set)) and any(names_a_task(e) for e in node.elts)

    def parameters_shape(node) -> bool:
        """parameters["shape"], parameters.get("shape")"""
        target, key = None, None
        if isinstance(node, ast.Subscript):
            target, key = node.value, node.slice
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "get":
            target, key = node.func.value, node.args[0] if node.args else None
        named = getattr(target, "id", None) or getattr(target, "attr", None)
        return named == "parameters" and isinstance(key, ast.Constant) and key.value == "shape"

    found = []
    for path in sorted(root.rglob("*.py")):
        relative = path.relative_to(root).as_posix()
        if relative.startswith(TASK_DECISIONS):
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if (
                (isinstance(node, ast.Name) and node.id in TASK_CONSTANTS)
                or (isinstance(node, ast.Attribute) and node.attr in TASK_CONSTANTS | TASK_FLAGS)
                or (isinstance(node, ast.alias) and node.name in TASK_CONSTANTS)
                or (isinstance(node, ast.Compare) and any(names_a_task(n) for n in (node.left, *node.comparators)))
                or parameters_shape(node)
            ):
                found.append(f"{relative}:{getattr(node, 'lineno', 0)}")
    return sorted(set(found))


def test_no_module_outside_the_task_package_names_a_task_or_reads_its_flags(tmp_path):
    """The rooms call the task's methods (its serving head, its training recipe); they never ask which task
    it is. Only byoc.tasks and the decision from the data (task_choice) name tasks."""
    assert task_reads(import_graph.PACKAGE) == []
    (tmp_path / "handler.py").write_text(
        'def f(task):\n    return task == "regression" or task in (MULTI_LABEL,)\n'
        "def g(kind):\n    return kind.per_token\n"
        "def h(tasks):\n    return tasks.EMBEDDING\n"
        'def i(parameters):\n    return parameters.get("shape")\n'
        "from byoc.tasks import EMBEDDING\n"
        "def j(kind):\n    return kind.name\n"  # a task's own attribute: not a flag
    )
    assert set(task_reads(tmp_path)) == {f"handler.py:{line}" for line in (2, 4, 6, 8, 9)}  # never j's line 11


def test_no_module_outside_the_task_package_dispatches_on_a_familys_output_name():
    """How a family ranks a corpus (its evaluator) and what it answers (its kinds) are the task's to say: the rooms
    hold no "dense", "sparse", "maxsim" or "colbert" of their own to branch on (corpus_evaluation and compat did)."""
    import ast

    names = {"dense", "sparse", "maxsim", "colbert"}
    found = []
    for path in (REPO / "container" / "byoc").rglob("*.py"):
        if "tasks" in path.relative_to(REPO / "container" / "byoc").parts:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Constant) and node.value in names:
                found.append(f"{path.name}:{node.lineno} {node.value!r}")
    assert found == []


PARTS = {"head": "Head", "rows": "Rows", "recipe": "Recipe", "evaluation": "Evaluation"}


def _interfaces() -> dict[str, type]:
    from byoc.tasks.evaluation import Evaluation
    from byoc.tasks.head import Head
    from byoc.tasks.recipe import Recipe
    from byoc.tasks.rows import Rows

    return {"head": Head, "rows": Rows, "recipe": Recipe, "evaluation": Evaluation}


def _members(cls: type) -> set[str]:
    """Every member a class has (its own and inherited), but Python's own."""
    return {name for klass in cls.__mro__ if klass is not object for name in vars(klass) if not name.startswith("__")}


def test_a_task_is_its_identity_and_four_parts_each_a_small_interface():
    """Task holds its identity and its parts, each an interface of its own under 25 members (the one Task had 65);
    no member is in two of them, and no family puts a part's member on its Task (where no room would ask it)."""
    from byoc import tasks
    from byoc.tasks.base import Task

    interfaces = _interfaces()
    sizes = {"Task": len(_members(Task)), **{cls.__name__: len(_members(cls)) for cls in interfaces.values()}}
    assert all(size < 25 for size in sizes.values()), sizes
    owned = [_members(Task) - {"task"}, *(_members(cls) - {"task"} for cls in interfaces.values())]
    assert sum(len(names) for names in owned) == len(set().union(*owned))  # (no member in two of them)
    part_members = set().union(*owned[1:])
    for task in tasks.TASKS.values():
        for attribute, interface in interfaces.items():
            assert isinstance(getattr(task, attribute), interface) and getattr(task, attribute).task is task
        assert not _members(type(task)) & part_members, task.name


def test_serving_reads_a_task_through_its_head_and_training_through_its_rows_recipe_and_evaluation():
    """The serving room (and byoc encode, which serves) asks a task's head; the training room its rows, recipe and
    evaluation; each only what that interface declares (a task held as `task`, `kind` or `self.task`, or fresh
    from tasks.get / of_folder / of_config)."""
    import ast

    from byoc.tasks.base import Task

    interfaces = _interfaces()
    every_part = set().union(*(_members(cls) for cls in interfaces.values())) - _members(Task)
    rooms = {"serving": {"head"}, "encoding": {"head"}, "training": {"rows", "recipe", "evaluation"}}
    asked: dict[str, set[str]] = {room: set() for room in rooms}
    wrong: list[str] = []

    def a_task(node: ast.expr) -> bool:
        held = isinstance(node, ast.Name) and node.id in ("task", "kind", "miner_task")
        held = held or (isinstance(node, ast.Attribute) and node.attr == "task")
        fresh = isinstance(node, ast.Call) and getattr(node.func, "attr", "") in ("get", "of_folder", "of_config")
        return held or fresh

    for room, parts in rooms.items():
        for path in (REPO / "container" / "byoc" / room).rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text())):
                if not isinstance(node, ast.Attribute):
                    continue
                inner = node.value
                if isinstance(inner, ast.Attribute) and inner.attr in PARTS and a_task(inner.value):
                    asked[room].add(f"{inner.attr}.{node.attr}")
                    if inner.attr not in parts or node.attr not in _members(interfaces[inner.attr]):
                        wrong.append(f"{room}/{path.name}:{node.lineno} {inner.attr}.{node.attr}")
                elif a_task(inner) and node.attr in every_part:
                    wrong.append(f"{room}/{path.name}:{node.lineno} {node.attr}")  # (a part's member on the task)
    assert wrong == []
    assert len(asked["serving"]) >= 10 and len(asked["training"]) >= 25  # (the scan sees the rooms' questions)


def test_no_global_statement():
    """State is passed down; what is truly the process's (a signal's, the process group's) is one object
    in its module, never a rebinding of module names."""
    found = [
        f"{path.relative_to(import_graph.PACKAGE)}:{node.lineno}"
        for path in sorted(import_graph.PACKAGE.rglob("*.py"))
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.Global)
    ]
    assert found == []


# A path of one machine (a checkout, a home folder, a test's temporary folder) in a tracked file is wrong
# everywhere else. Written in parts, so that this file does not hold what it looks for.
MACHINE_PATHS = re.compile(
    "(?<![\\w.])/(" + "|".join(("wo" + "rk/", "ro" + "ot/", "home/[a-z]", "tmp/py" + "test-")) + ")"
)


def machine_paths(texts: dict[str, str]) -> list[str]:
    """`name:line` of each machine's absolute path in `texts` ({name: text})."""
    return [
        f"{name}:{text.count(chr(10), 0, m.start()) + 1}"
        for name, text in texts.items()
        for m in MACHINE_PATHS.finditer(text)
    ]


def test_no_tracked_file_names_a_machines_absolute_path():
    tracked = subprocess.run(["git", "ls-files", "-z"], cwd=REPO, capture_output=True, text=True, check=True).stdout
    texts = {}
    for name in filter(None, tracked.split("\0")):
        try:
            texts[name] = (REPO / name).read_text(encoding="utf-8")
        except (UnicodeDecodeError, OSError):  # a binary file, or one deleted in the working tree
            continue
    assert machine_paths(texts) == []
    planted = {"r.json": '{\n"python": "/' + 'work/venv/bin/python", "model": "/opt/ml/model", "x": "a/work/b"}'}
    assert machine_paths(planted) == ["r.json:2"]  # the check can fail; the image's /opt/ml paths are no machine's
