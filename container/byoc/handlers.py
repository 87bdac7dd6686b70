"""Inference handlers: the defaults, the user's overrides, and the errors they may raise.

The contract is the AWS inference toolkits': `model_fn(model_dir)`, `input_fn(body, content_type)`,
`predict_fn(data, model)`, `output_fn(prediction, accept)`, or a single
`transform_fn(model, body, content_type, accept)`; each may take a trailing `context`. The
defaults live in `code/inference.py`; a model's own `code/inference.py` overrides any subset.
Mixing `transform_fn` with the others is a start-up error, as in the toolkits.
"""

from __future__ import annotations

import functools
import importlib.util
import inspect
import logging
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any, Callable

from byoc.errors import UserError

logger = logging.getLogger("byoc.handlers")

HANDLER_NAMES = ("model_fn", "input_fn", "predict_fn", "output_fn", "transform_fn")
# Positional arguments of each handler before the optional trailing `context`.
_ARITY = {"model_fn": 1, "input_fn": 2, "predict_fn": 2, "output_fn": 2, "transform_fn": 4}


class InputError(ValueError):
    """A malformed or empty request: answered with 400 and this message."""

    status = 400


class UnsupportedMediaType(InputError):
    """The request's Content-Type is not one the handler reads: 415."""

    status = 415


class NotAcceptable(InputError):
    """The Accept type is not one the handler writes: 406."""

    status = 406


class HandlerError(UserError, RuntimeError):
    """The handler code cannot be used (bad override, failed requirements): a start-up failure."""


@dataclass
class Handlers:
    """The resolved handler functions, each called as the contract defines."""

    model_fn: Callable[..., Any]
    input_fn: Callable[..., Any] | None
    predict_fn: Callable[..., Any] | None
    output_fn: Callable[..., Any] | None
    transform_fn: Callable[..., Any] | None
    source: str  # for the logs
    accept_types: tuple[str, ...] | None = None  # what the built-in output_fn writes (checked up front)

    @property
    def batchable(self) -> bool:
        """Requests may be merged into one predict_fn call when predict_fn declares the batch
        contract (`predict_fn.batchable = True`): it takes {"inputs": [...], "parameters": {...}}
        and returns one result per input, in order. The default one does."""
        return self.transform_fn is None and bool(getattr(self.predict_fn, "batchable", False))


def inference_threads() -> int:
    """Threads one worker's model may use: OMP_NUM_THREADS (the server sets it to cores / workers)."""
    try:
        return max(1, int(os.environ.get("OMP_NUM_THREADS", "")))
    except ValueError:
        return os.cpu_count() or 1


def default_code_dir() -> Path:
    """The folder holding the default `inference.py` (`$BYOC_CODE_DIR`, else the repo's `code/`)."""
    for candidate in (os.environ.get("BYOC_CODE_DIR"), Path(__file__).resolve().parents[2] / "code"):
        if candidate and (Path(candidate) / "inference.py").exists():
            return Path(candidate)
    raise HandlerError("cannot find the default inference code (code/inference.py): set BYOC_CODE_DIR to its folder")


def _import(path: Path, name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.path.insert(0, str(path.parent))  # the user's module may import its siblings
    try:
        spec.loader.exec_module(module)
    except Exception as err:
        raise HandlerError(f"cannot import {path}: {type(err).__name__}: {err}") from None
    finally:
        sys.path.remove(str(path.parent))
    return module


def install_requirements(code_dir: Path) -> None:
    """`pip install -r model/code/requirements.txt` when it lists anything, as the toolkits do at start."""
    requirements = code_dir / "requirements.txt"
    if not requirements.exists():
        return
    lines = [line.split("#")[0].strip() for line in requirements.read_text().splitlines()]
    if not any(lines):
        return
    logger.info("installing %s", requirements)
    done = subprocess.run([sys.executable, "-m", "pip", "install", "--no-input", "-r", str(requirements)],
                          capture_output=True, text=True)
    if done.returncode != 0:
        tail = " ".join(done.stderr.strip().splitlines()[-3:])
        raise HandlerError(f"installing {requirements} failed: {tail}")


def load_handlers(model_dir: Path) -> Handlers:
    """The default handlers, overridden by `model_dir/code/inference.py` (or `$SAGEMAKER_PROGRAM`)."""
    defaults = _import(default_code_dir() / "inference.py", "byoc_default_inference")
    user_dir = model_dir / "code"
    user_file = user_dir / os.environ.get("SAGEMAKER_PROGRAM", "inference.py")
    user = None
    if user_file.exists() and not _same_file(user_file, defaults.__file__):
        install_requirements(user_dir)
        user = _import(user_file, "inference")
    functions = {name: getattr(user, name, None) for name in HANDLER_NAMES} if user else {}
    overridden = sorted(name for name, fn in functions.items() if fn is not None)
    if functions.get("transform_fn") and set(overridden) & {"input_fn", "predict_fn", "output_fn"}:
        raise HandlerError(
            f"{user_file} defines transform_fn together with {', '.join(n for n in overridden if n != 'transform_fn')}: "
            "define either transform_fn or input_fn/predict_fn/output_fn, not both"
        )
    for name, fn in functions.items():
        if fn is not None and not callable(fn):
            raise HandlerError(f"{user_file}: {name} is not a function")
    pick = lambda name: functions.get(name) or getattr(defaults, name, None)
    transform = functions.get("transform_fn")
    handlers = Handlers(
        model_fn=pick("model_fn"),
        input_fn=None if transform else pick("input_fn"),
        predict_fn=None if transform else pick("predict_fn"),
        output_fn=None if transform else pick("output_fn"),
        transform_fn=transform,
        source=f"{user_file} ({', '.join(overridden) or 'nothing'} overridden)" if user else "default handlers",
        accept_types=None if (transform or functions.get("output_fn")) else tuple(getattr(defaults, "ACCEPT_TYPES", ()) or ()) or None,
    )
    logger.info("handlers: %s", handlers.source)
    return handlers


def _same_file(a: Path, b: str) -> bool:
    """The trained model carries a copy of the defaults: using it as an override changes nothing."""
    try:
        return Path(a).read_bytes() == Path(b).read_bytes()
    except OSError:
        return False


def call(fn: Callable[..., Any], name: str, *args: Any, context: Any = None) -> Any:
    """Call a handler with or without the trailing `context`, by its signature."""
    try:
        takes = _takes_context(fn, name)
    except TypeError:  # an unhashable callable object: inspect it every time
        takes = _takes_context.__wrapped__(fn, name)
    return fn(*args, context) if takes else fn(*args)


@functools.lru_cache(maxsize=64)
def _takes_context(fn: Callable[..., Any], name: str) -> bool:
    """Read once per handler: inspecting a signature on every request cost ~2% of a busy server."""
    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):
        return False
    positional = [p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    return len(positional) > _ARITY[name] or any(p.kind == p.VAR_POSITIONAL for p in params)
