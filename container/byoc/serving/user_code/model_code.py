"""One model's own code among many (multi-model endpoints): imported under private module names,
its sibling modules always its own, and all of it forgotten when the model is unloaded.

Each model's `code/inference.py` is imported as `byoc_model_<id>` and each sibling module it imports
(`import helper`, at the top or inside a function, with or without the common
`sys.path.insert(0, os.path.dirname(__file__))`) as `byoc_model_<id>.helper`: a finder placed first
on `sys.meta_path` looks for a top-level module in the folder of the model whose own file makes the
import, so two models with a `helper.py` each never get the other's, and the plain name `helper`
never enters `sys.modules`. A sibling *package* is found on the folder's path while `inference.py`
imports (its modules renamed privately after), so the package is the model's own when imported at
the top of `inference.py`.

Only the model's own files get its modules: an import that a library makes (torch's `import
tarfile`, unittest's `import pprint`), even while the model's code runs further up the stack, never
finds them, neither by the finder nor through a model folder on `sys.path` (a path hook answers a
top-level name from such a folder only to that model's files). A library holding a model's module
would keep it, and its memory, past the unload, and get a helper file in place of the real module.

Unloading removes the model's modules and the paths its code added to `sys.path`: nothing of the
model stays reachable, so its memory goes back (a load/unload cycle leaves resident memory flat).
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import importlib.util
import linecache
import sys
from pathlib import Path
from types import FrameType, ModuleType
from typing import Any

OWNER = "__byoc_model_code__"  # in each module of a model's code: (its folder, its private prefix)
_IMPORT_SYSTEM = frozenset(("importlib", "importlib._bootstrap", "importlib._bootstrap_external"))
_FOLDERS: dict[str, str] = {}  # the code folder of each model imported, by its private prefix


class NotPython(ImportError):
    """The model's program is no Python module (SAGEMAKER_PROGRAM=serve.sh)."""


def import_isolated(path: Path, name: str) -> ModuleType:
    """Import the model's module `path` under the private name `name`. Raises what its code raises
    (the module is then forgotten)."""
    _install_finder()
    folder = str(path.parent)
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise NotPython(f"{path} is not a Python module")
    module = importlib.util.module_from_spec(spec)
    setattr(module, OWNER, (folder, name))
    _FOLDERS[name] = folder
    _uncache(folder)  # a finder cached for the folder before it was a model's would answer anyone
    before = set(sys.modules)
    sys.path.insert(0, folder)  # for a sibling package (see above); modules are found by the finder
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        _make_private(name, folder, before)  # first: forget finds what it removes under `name`
        forget(name, folder)
        raise
    _make_private(name, folder, before)
    return module


def _make_private(name: str, folder: str, before: set[str]) -> None:
    """Take our copy of `folder` off sys.path, and rename the sibling package modules the import
    added under `name` (a copy of the folder the code inserted itself stays until the unload)."""
    if folder in sys.path:
        sys.path.remove(folder)
    for added in set(sys.modules) - before:
        if added.partition(".")[0] == name:
            continue  # this module, and the siblings the finder imported: private already
        if (getattr(sys.modules[added], "__file__", None) or "").startswith(folder + "/"):
            sys.modules[f"{name}.{added}"] = sys.modules.pop(added)


def forget(name: str, folder: str) -> None:
    """Remove every module of the model imported as `name`, and every path into its folder."""
    for module in [key for key in sys.modules if key == name or key.startswith(name + ".")]:
        del sys.modules[module]
    _FOLDERS.pop(name, None)
    sys.path[:] = [entry for entry in sys.path if not _inside(entry, folder)]
    _uncache(folder)
    linecache.clearcache()  # a traceback through the model's code kept its source lines


class _SiblingLoader(importlib.machinery.SourceFileLoader):
    """A sibling module, marked as its model's before it runs (the imports it makes are the model's)."""

    def __init__(self, name: str, path: str, owner: tuple[str, str]) -> None:
        super().__init__(name, path)
        self.owner = owner

    def exec_module(self, module: ModuleType) -> None:
        setattr(module, OWNER, self.owner)
        super().exec_module(module)


class _Imported(importlib.abc.Loader):
    """A sibling imported already (under its private name): the same module again, not run twice."""

    def __init__(self, module: ModuleType) -> None:
        self.module, self.spec = module, module.__spec__

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType:
        return self.module

    def exec_module(self, module: ModuleType) -> None:
        module.__spec__ = self.spec  # the import set its own: the module's file stays its origin


def _inside(entry: str, folder: str) -> bool:
    return entry == folder or entry.startswith(folder + "/")


def _uncache(folder: str) -> None:
    for entry in [key for key in sys.path_importer_cache if _inside(key, folder)]:
        del sys.path_importer_cache[entry]


class _SiblingFinder(importlib.abc.MetaPathFinder):
    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> importlib.machinery.ModuleSpec | None:
        if path is not None:
            return None  # a submodule: its package's path finds it
        owner = _importing_model(sys._getframe(1))
        if owner is None:
            return None
        folder, prefix = owner
        private = f"{prefix}.{fullname}"
        imported = sys.modules.get(private)
        if imported is not None:
            return importlib.util.spec_from_loader(private, _Imported(imported))
        source = Path(folder) / f"{fullname}.py"
        if not source.is_file():
            return None  # not the model's: found as any other module is
        loader = _SiblingLoader(private, str(source), owner)
        return importlib.util.spec_from_file_location(private, source, loader=loader)


class _ModelEntry(importlib.abc.PathEntryFinder):
    """A path entry inside a model's folder: a top-level name found there only for that model's files."""

    def __init__(self, files: Any, folder: str) -> None:
        self.files, self.folder = files, folder

    def find_spec(self, fullname: str, target: Any = None) -> importlib.machinery.ModuleSpec | None:
        if "." not in fullname:  # a submodule is looked for here only on its package's path: the model's own
            owner = _importing_model(sys._getframe(1))
            if owner is None or owner[0] != self.folder:
                return None  # the import goes on along sys.path: the real module, or none
        return self.files.find_spec(fullname, target)

    def invalidate_caches(self) -> None:
        self.files.invalidate_caches()


def _model_entries(entry: str) -> _ModelEntry:
    """The path hook: a `_ModelEntry` for an entry inside a model's folder; ImportError for any other
    (the next hook takes it)."""
    folders = tuple(_FOLDERS.values())  # a copy: loads import on threads of their own
    folder = next((folder for folder in folders if _inside(entry, folder)), None)
    if folder is not None:
        for hook in sys.path_hooks:
            if hook is not _model_entries:
                try:
                    return _ModelEntry(hook(entry), folder)
                except ImportError:
                    continue
    raise ImportError(f"{entry} is in no model's folder")


def _importing_model(frame: FrameType | None) -> tuple[str, str] | None:
    """The (folder, prefix) of the model whose own file makes this import, or None. The importing frame
    is the first outside the import system: a module of the model's (marked), or a file in the folder
    of the model whose code runs nearest above it (a sibling package `inference.py` imports)."""
    while frame is not None and frame.f_globals.get("__name__") in _IMPORT_SYSTEM:
        frame = frame.f_back
    if frame is None:
        return None
    owner = frame.f_globals.get(OWNER)
    if owner is not None:
        return owner
    file, frame = frame.f_code.co_filename, frame.f_back
    while frame is not None:
        owner = frame.f_globals.get(OWNER)
        if owner is not None:
            return owner if _inside(file, owner[0]) else None
        frame = frame.f_back
    return None


_FINDER = _SiblingFinder()


def _install_finder() -> None:
    if _FINDER not in sys.meta_path:
        sys.meta_path.insert(0, _FINDER)
    if _model_entries not in sys.path_hooks:
        sys.path_hooks.insert(0, _model_entries)
