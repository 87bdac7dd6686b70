"""Inference handlers: the defaults, the user's overrides, and the errors they may raise.

The contract is the AWS inference toolkits': `model_fn(model_dir)`, `input_fn(body, content_type)`,
`predict_fn(data, model)`, `output_fn(prediction, accept)`, or a single
`transform_fn(model, body, content_type, accept)`; each may take a trailing `context`. The
defaults are the module `byoc.serving.default_pipeline`; a model's own `code/inference.py`
overrides any subset.
Mixing `transform_fn` with the others is a start-up error, as in the toolkits.
"""

from __future__ import annotations

import functools
import hashlib
import importlib.util
import inspect
import logging
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

from byoc.errors import UserError
from byoc.requirements import RequirementsError, install_requirements
from byoc.serving import default_pipeline
from byoc.serving.default_pipeline import inference_threads  # noqa: F401  (re-exported, as are the request errors)
from byoc.serving.protocol.request_errors import InputError, NotAcceptable, UnsupportedMediaType  # noqa: F401
from byoc.serving.user_code import model_code

# Users' handlers and the code older models carry import these errors and inference_threads from
# byoc.handlers (the public path, which re-exports them); they stay importable here too, the same objects.

logger = logging.getLogger(__name__)

USER_MODULE_MARK = "__byoc_user_code__"
HANDLER_NAMES = ("model_fn", "input_fn", "predict_fn", "output_fn", "transform_fn")
# Positional arguments of each handler before the optional trailing `context`.
_ARITY = {"model_fn": 1, "input_fn": 2, "predict_fn": 2, "output_fn": 2, "transform_fn": 4}


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

    def is_default(self, name: str) -> bool:
        """Whether the handler `name` is byoc's own (bounded work: it may run on the event loop)."""
        return getattr(self, name) is getattr(default_pipeline, name, None)

    @property
    def batchable(self) -> bool:
        """Requests may be merged into one predict_fn call when predict_fn declares the batch
        contract (`predict_fn.batchable = True`): it takes {"inputs": [...], "parameters": {...}}
        and returns one result per input, in order. The default one does."""
        return self.transform_fn is None and bool(getattr(self.predict_fn, "batchable", False))


def _import(path: Path) -> ModuleType:
    """Import the user's module as the AWS toolkits do: under its own name (`inference` for
    inference.py) in sys.modules, its folder kept on sys.path. So its dataclasses resolve their
    annotations, its classes pickle and unpickle, `import inference` in a helper finds this module
    rather than running it again, and `import helper` works inside its functions, not only at import."""
    name = path.stem
    existing = sys.modules.get(name)
    if existing is not None and not getattr(existing, USER_MODULE_MARK, False):
        raise HandlerError(
            f"{path} has the name of the module {name!r}, which the server already uses: rename it "
            "(and SAGEMAKER_PROGRAM with it)"
        )
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:  # not a Python file (SAGEMAKER_PROGRAM=serve.sh)
        raise HandlerError(f"cannot import {path}: it is not a Python module")
    module = importlib.util.module_from_spec(spec)
    setattr(module, USER_MODULE_MARK, True)  # a model loaded again (tests) replaces it
    if str(path.parent) not in sys.path:
        sys.path.insert(0, str(path.parent))  # the user's module may import its siblings, at any time
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except BaseException as err:  # SystemExit too (argparse at import): a failed start, never a server left at 503
        del sys.modules[name]
        raise HandlerError(f"cannot import {path}: {type(err).__name__}: {err}{_hint(err)}") from None
    return module


def _import_isolated(path: Path, name: str) -> ModuleType:
    """Import a model's module as one of many (multi-model endpoints): under the private name `name`,
    its sibling modules its own (byoc.serving.user_code.model_code)."""
    try:
        return model_code.import_isolated(path, name)
    except model_code.NotPython:
        raise HandlerError(f"cannot import {path}: it is not a Python module") from None
    except BaseException as err:  # as _import: a failed load of this model, and nothing else
        raise HandlerError(f"cannot import {path}: {type(err).__name__}: {err}{_hint(err)}") from None


def forget_isolated(model_dir: Path, name: str) -> None:
    """Forget the code of the model imported as `name` (an unload): its modules, its paths, and
    the handlers' signatures read from it."""
    model_code.forget(name, str(model_dir / "code"))
    _takes_context.cache_clear()


# What the full images (Dockerfile.gpu, Dockerfile.neuron) hold and the serving image (Dockerfile.serve) does
# not: torch, and the packages requirements/runtime.txt lists and requirements/serve.txt leaves out (tested).
FULL_IMAGE_MODULES = frozenset(
    ("torch", "transformers", "datasets", "accelerate", "safetensors", "sagemaker_training")
    + ("pandas", "pyarrow", "matplotlib", "tensorboard", "onnx")
    + ("mlflow", "sagemaker_mlflow")  # experiment tracking (byoc.training.tracking)
    + ("sentence_transformers",)  # training embedding models (byoc.tasks.embedding.model)
    + ("bm25s",)  # BM25 beside a retrieval model on a BEIR set (byoc.training.corpus_evaluation)
    + ("peft",)  # LoRA adapters while training (byoc.tasks.embedding.model)
)


def _hint(err: BaseException) -> str:
    """What to change, where the error alone does not say it."""
    if isinstance(err, SystemExit):
        return " (code that parses arguments or exits belongs under `if __name__ == '__main__':`)"
    missing = getattr(err, "name", None) if isinstance(err, ModuleNotFoundError) else None
    if missing and missing.partition(".")[0] in FULL_IMAGE_MODULES:
        return (
            f" ({missing} is in the full images, not in the serving image, Dockerfile.serve: serve this model with "
            "Dockerfile.gpu (`./build_and_push.sh gpu`, for CPU or GPU instances) or Dockerfile.neuron)"
        )
    return ""


# The SHA-256 of each `code/inference.py` template byoc train has put in a model (the repository's code/
# at each version that wraps the default predict_fn; tests/serving/test_handlers.py checks that the
# current one is listed). A model carrying one of them unchanged is served by the defaults themselves:
# the long texts' steps and every other default-only path apply, as they do to a folder without code/.
SHIPPED_TEMPLATES = frozenset(
    (
        "cb3ec16c1513921137f476d8931eb41e2efcfd3bcbed3a6b77e241d5aa09a95b",
        "41e708586a41f7c9dd128a78b6805a1be6570cbe8157dad17c8d9fc337215f7c",
        "46ef0b275f31703d45929b1b7fb9119af7ce76b69fafcab0c36f30d6bd8c0cac",
    )
)


def shipped_template(path: Path) -> bool:
    """Whether `path` is byoc's own template code/inference.py, unchanged (SHIPPED_TEMPLATES)."""
    try:
        return hashlib.sha256(path.read_bytes()).hexdigest() in SHIPPED_TEMPLATES
    except OSError:
        return False


def load_handlers(model_dir: Path, program: str = "inference.py", isolated_as: str | None = None) -> Handlers:
    """The default handlers (`byoc.serving.default_pipeline`), overridden by `model_dir/code/inference.py`
    (or the `program` SAGEMAKER_PROGRAM names: `ServeSettings.program`), after installing
    `model_dir/code/requirements.txt`. `isolated_as`: one model of many, whose code is imported under
    that private module name (multi-model endpoints)."""
    user_dir = model_dir / "code"
    user_file = user_dir / program
    user = None
    if user_file.exists() and not _same_file(user_file, default_pipeline.__file__):
        try:
            install_requirements(user_dir)
        except RequirementsError as err:
            raise HandlerError(f"installing {err.requirements} failed: {err}") from None
        if shipped_template(user_file):
            logger.info("%s is byoc's template, unchanged: the default handlers serve", user_file)
        else:
            user = _import_isolated(user_file, isolated_as) if isolated_as else _import(user_file)
    # A default the user's module imports (the template re-exports model_fn, input_fn and output_fn, so
    # that it is a complete handler module) is no override: the server keeps treating it as the default.
    functions = {name: getattr(user, name, None) for name in HANDLER_NAMES} if user else {}
    functions = {name: None if fn is getattr(default_pipeline, name, None) else fn for name, fn in functions.items()}
    overridden = sorted(name for name, fn in functions.items() if fn is not None)
    if functions.get("transform_fn") and set(overridden) & {"input_fn", "predict_fn", "output_fn"}:
        raise HandlerError(
            f"{user_file} defines transform_fn together with "
            f"{', '.join(n for n in overridden if n != 'transform_fn')}: "
            "define either transform_fn or input_fn/predict_fn/output_fn, not both"
        )
    for name, fn in functions.items():
        if fn is not None and not callable(fn):
            raise HandlerError(f"{user_file}: {name} is not a function")
    pick = lambda name: functions.get(name) or getattr(default_pipeline, name, None)
    transform = functions.get("transform_fn")
    handlers = Handlers(
        model_fn=functions.get("model_fn") or default_pipeline.model_fn,
        input_fn=None if transform else pick("input_fn"),
        predict_fn=None if transform else pick("predict_fn"),
        output_fn=None if transform else pick("output_fn"),
        transform_fn=transform,
        source=f"{user_file} ({', '.join(overridden) or 'nothing'} overridden)" if user else "default handlers",
        accept_types=None if (transform or functions.get("output_fn")) else default_pipeline.ACCEPT_TYPES,
    )
    logger.info("handlers: %s", handlers.source)
    return handlers


def _same_file(a: Path, b: str) -> bool:
    """A copy of the defaults' module used as an override changes nothing: it is not imported twice."""
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
