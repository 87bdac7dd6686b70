"""The sentence-transformers folder format, as far as serving an embedding model needs it: which
modules turn the transformer's token states into one vector per text.

A sentence-transformers folder lists its modules in `modules.json`, in order: the Transformer (the
folder itself), a Pooling (`1_Pooling/config.json`: CLS, mean, max, mean over sqrt(length), weighted
mean, last token), optional Dense layers (`2_Dense/config.json` and their weights) and Normalize. Beside
them, `sentence_bert_config.json` (max_seq_length) and `config_sentence_transformers.json` (named prompts
and the default one). A plain transformers folder served as embeddings (BYOC_TASK=embedding) gets mean
pooling, as sentence-transformers itself gives such a folder.

JSON only here: the serving image reads this without torch (the pooling runs inside model.onnx, or on
torch in byoc.tasks.embedding's module).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

MODULES = "modules.json"
LOGIT_SCORE = "LogitScore"  # the module that makes a decoder's next-token logits a relevance (a generative reranker)
POOLING_MODES = ("cls", "mean", "max", "mean_sqrt_len", "weightedmean", "lasttoken")
# 1_Pooling/config.json's pooling_mode_* keys, each naming one mode, in the order sentence-transformers
# concatenates the vectors of several
_POOLING_KEYS = {
    "pooling_mode_cls_token": "cls",
    "pooling_mode_max_tokens": "max",
    "pooling_mode_mean_tokens": "mean",
    "pooling_mode_mean_sqrt_len_tokens": "mean_sqrt_len",
    "pooling_mode_weightedmean_tokens": "weightedmean",
    "pooling_mode_lasttoken": "lasttoken",
}
ACTIVATIONS = ("Identity", "Tanh", "ReLU", "GELU", "Sigmoid")


class FolderError(ValueError):
    """A sentence-transformers folder byoc cannot serve as it is: says which file and why."""


@dataclass(frozen=True)
class Dense:
    """One Dense module: a linear layer and its activation, its weights in `path`."""

    path: Path
    in_features: int
    out_features: int
    bias: bool = True
    activation: str = "Identity"  # one of ACTIVATIONS


@dataclass(frozen=True)
class SentenceFolder:
    """How a folder's token states become its sentence vectors, and what it prepends to texts."""

    pooling: tuple[str, ...] = ("mean",)  # one mode or several (their vectors concatenated, in this order)
    dense: tuple[Dense, ...] = ()
    normalize: bool = False  # the folder ends in Normalize (the vectors are unit length)
    prompts: dict[str, str] = field(default_factory=dict)
    default_prompt_name: str | None = None
    max_seq_length: int | None = None
    sentence_transformers: bool = False  # read from modules.json (else: a plain folder, mean pooling)


def is_sentence_folder(model_dir: Path) -> bool:
    return (Path(model_dir) / MODULES).is_file()


def module_kinds(model_dir: Path) -> list[str]:
    """The class names of the modules a sentence-transformers folder's modules.json lists ([] for another folder,
    or a modules.json that lists none it can read: `read` says what is wrong with it)."""
    path = Path(model_dir) / MODULES
    if not path.is_file():
        return []
    try:
        modules = read_json(path)
    except FolderError:
        return []
    listed = modules if isinstance(modules, list) else []
    return [str(m.get("type", "")).rsplit(".", 1)[-1] for m in listed if isinstance(m, dict)]


def read(model_dir: Path) -> SentenceFolder:
    """The folder's modules (a plain transformers folder: mean pooling, no Dense, no Normalize)."""
    model_dir = Path(model_dir)
    if not is_sentence_folder(model_dir):
        return SentenceFolder(**prompts_of(model_dir), max_seq_length=max_seq_length_of(model_dir))
    modules = read_json(model_dir / MODULES)
    if not isinstance(modules, list):
        raise FolderError(f"{model_dir / MODULES} must be a list of modules")
    pooling: tuple[str, ...] = ("mean",)
    dense: list[Dense] = []
    normalize = False
    for module in modules:
        kind = str(module.get("type", "")).rsplit(".", 1)[-1]
        where = model_dir / str(module.get("path", ""))
        if kind == "Transformer":
            continue
        if kind == "Pooling":
            pooling = _pooling(where / "config.json")
        elif kind == "Dense":
            dense.append(dense_module(where))
        elif kind == "Normalize":
            normalize = True
        else:
            raise FolderError(
                f"{model_dir / MODULES} names a {module.get('type')!r} module, which byoc does not serve "
                "(it serves Transformer, Pooling, Dense and Normalize)"
            )
    return SentenceFolder(
        pooling,
        tuple(dense),
        normalize,
        **prompts_of(model_dir),
        max_seq_length=max_seq_length_of(model_dir),
        sentence_transformers=True,
    )


OWN_MODULES = "sentence_transformers."  # the module types sentence-transformers imports from itself
_ROUTERS = ("Router", "Asym")  # modules whose own config names the types of the modules inside them
_ROUTER_CONFIGS = ("router_config.json", "config.json")  # a Router's config: sentence-transformers 5-6, earlier


def foreign_modules(model_dir: Path) -> list[str]:
    """The module types that `modules.json` names (and the Routers in it name in their own config) which are
    not sentence-transformers' own: code that loading the folder would import and run (a `my_pool.Pooling`
    beside a `my_pool.py`). sentence-transformers 5.x imports such code from a local folder without asking
    for trust_remote_code; 6.x refuses it. Read-only, imports nothing."""
    return _foreign(Path(model_dir), read_json(Path(model_dir) / MODULES), MODULES)


def _foreign(model_dir: Path, modules: Any, listed_in: str) -> list[str]:
    """`modules`: a modules.json list, or a Router's config ({"types": {module id: type}}, each module in the
    Router's folder under its id)."""
    types = modules.get("types") if isinstance(modules, dict) else None
    if isinstance(types, dict):
        entries = [{"type": kind, "path": name} for name, kind in types.items()]
    elif isinstance(modules, list):
        entries = [module if isinstance(module, dict) else {"type": module} for module in modules]
    else:
        raise FolderError(f"{model_dir / listed_in} must list the modules and their types")
    found = []
    for module in entries:
        kind = module.get("type")
        if not isinstance(kind, str) or not kind.startswith(OWN_MODULES):
            found.append(str(kind))
        elif kind.rsplit(".", 1)[-1] in _ROUTERS:
            where = model_dir / str(module.get("path") or "")
            config = next((where / name for name in _ROUTER_CONFIGS if (where / name).is_file()), None)
            found += _foreign(where, read_json(config), config.name) if config is not None else []
    return found


def _pooling(config_path: Path) -> tuple[str, ...]:
    """sentence-transformers 6's `pooling_mode` (a mode, or modes in their order), or the flags of earlier versions."""
    config = read_json(config_path)
    config = config if isinstance(config, dict) else {}
    named = config.get("pooling_mode")
    if named is not None:
        given = (named,) if isinstance(named, str) else tuple(named) if isinstance(named, list) else ()
        modes = tuple("mean_sqrt_len" if mode == "mean_sqrt_len_tokens" else mode for mode in given)
        unknown = [mode for mode in modes if mode not in POOLING_MODES]
        if unknown or not modes:
            raise FolderError(
                f"{config_path}: pooling_mode {named!r} is not one byoc serves ({', '.join(POOLING_MODES)})"
            )
    else:
        modes = tuple(mode for key, mode in _POOLING_KEYS.items() if config.get(key))
    if not modes:
        raise FolderError(f"{config_path}: no pooling mode set (pooling_mode_mean_tokens and its kin)")
    if not config.get("include_prompt", True):
        raise FolderError(
            f"{config_path}: include_prompt=false (a prompt's tokens left out of the pooling) is not served by byoc"
        )
    return modes


def dense_module(folder: Path) -> Dense:
    """A Dense module's settings (its folder's config.json), its weights left where they are. A config that names
    no activation gets sentence-transformers' default, Tanh (as its Dense module loads one)."""
    config = read_json(folder / "config.json")
    if config.get("use_residual"):
        raise FolderError(f"{folder / 'config.json'}: use_residual (a Dense module adding its input) is not served")
    activation = str(config.get("activation_function") or "torch.nn.modules.activation.Tanh").rsplit(".", 1)[-1]
    if activation not in ACTIVATIONS:
        raise FolderError(f"{folder / 'config.json'}: activation {activation!r} is not one byoc serves ({ACTIVATIONS})")
    try:
        return Dense(
            folder, int(config["in_features"]), int(config["out_features"]), bool(config.get("bias", True)), activation
        )
    except (KeyError, TypeError, ValueError):
        raise FolderError(f"{folder / 'config.json'}: a Dense module needs in_features and out_features") from None


def prompts_of(model_dir: Path) -> dict[str, Any]:
    """config_sentence_transformers.json's prompts and default prompt ({"prompts", "default_prompt_name"})."""
    path = model_dir / "config_sentence_transformers.json"
    config = read_json(path) if path.is_file() else {}
    prompts = config.get("prompts") or {}
    if not isinstance(prompts, dict) or not all(isinstance(v, str) for v in prompts.values()):
        raise FolderError(f"{path}: prompts must map names to texts")
    default = config.get("default_prompt_name")
    if default is not None and default not in prompts:
        raise FolderError(f"{path}: default_prompt_name {default!r} is not one of its prompts")
    return {"prompts": dict(prompts), "default_prompt_name": default}


def max_seq_length_of(model_dir: Path) -> int | None:
    """sentence_bert_config.json's max_seq_length (the length the folder's transformer reads), None where unset."""
    path = model_dir / "sentence_bert_config.json"
    value = read_json(path).get("max_seq_length") if path.is_file() else None
    return int(value) if isinstance(value, int) and value > 0 else None


def read_json(path: Path) -> Any:
    """A JSON file of the folder; FolderError naming it where it is missing or unreadable."""
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise FolderError(f"{path} is missing: the folder's modules.json names it") from None
    except (OSError, ValueError) as err:
        raise FolderError(f"{path} cannot be read: {err}") from None
