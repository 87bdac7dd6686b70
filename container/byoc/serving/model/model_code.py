"""One model's own code among many (multi-model endpoints): imported under private module names,
its sibling modules always its own, and all of it forgotten when the model is unloaded.

Each model's `code/inference.py` is imported as `byoc_model_<id>` and each sibling module it imports
(`import helper`, at the top or inside a function, with or without the common
`sys.path.insert(0, os.path.dirname(__file__))`) as `byoc_model_<id>.helper`: a finder placed first
on `sys.meta_path` looks for a top-level module in the folder of the model whose code is importing
(the nearest frame of the stack that belongs to a model), so two models with a `helper.py` each
never get the other's, and the plain name `helper` never enters `sys.modules`. A sibling *package*
is found on the folder's path while `inference.py` imports (its modules renamed privately after),
so the package is the model's own when imported at the top of `inference.py`.

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
    inside = lambda entry: entry == folder or entry.startswith(folder + "/")
    sys.path[:] = [entry for entry in sys.path if not inside(entry)]
    for entry in [key for key in sys.path_importer_cache if inside(key)]:
        del sys.path_importer_cache[entry]
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


def _importing_model(frame: FrameType | None) -> tuple[str, str] | None:
    """The (folder, prefix) of the model whose code is running nearest the top of the stack."""
    while frame is not None:
        owner = frame.f_globals.get(OWNER)
        if owner is not None:
            return owner
        frame = frame.f_back
    return None


_FINDER = _SiblingFinder()


def _install_finder() -> None:
    if _FINDER not in sys.meta_path:
        sys.meta_path.insert(0, _FINDER)
