"""The model folder's format: what `byoc train` publishes to /opt/ml/model (the `model.tar.gz`) and
what `byoc serve` reads, and the one rule both sides apply to it (how long an input may be).

A model folder holds a Hugging Face classifier saved by `save_pretrained` (config.json with
id2label, model.safetensors), its tokenizer (tokenizer.json, tokenizer_config.json...), the
serving graphs (byoc.onnx_graph: model.onnx, optionally model.int8.onnx) and code/ (the
inference handlers, `code/inference.py`, and their requirements.txt).

config.json's `problem_type` names the task (transformers' names; a token classifier is named by its
architecture, `...ForTokenClassification`): byoc.tasks reads it. Beside it, what a task saved for
serving: a multi-label model's decision `byoc_threshold` (and `byoc_thresholds` for labels with their
own), a token classifier's `byoc_word_tags` (how training tagged a word's sub-tokens, which picks
serving's default entities).

`missing_folder` and `unloadable` say, in a sentence naming the folder, why `byoc serve` cannot load a
folder (it does not exist; it holds no config.json or no weights), before any loader reads it.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
from pathlib import Path
from typing import Any

from byoc.errors import UserError

logger = logging.getLogger(__name__)

CONFIG = "config.json"
WEIGHTS = "model.safetensors"
SHARDED_WEIGHTS = "model.safetensors.index.json"  # weights saved in shards (torch serves them; no model.onnx)
# Weights byoc does not load (it loads safetensors only: nothing is unpickled), for the message that says so.
OTHER_WEIGHTS = ("pytorch_model.bin", "pytorch_model.bin.index.json", "tf_model.h5", "flax_model.msgpack")
TOKENIZER = "tokenizer.json"
TOKENIZER_CONFIG = "tokenizer_config.json"
CODE_DIR = "code"

THRESHOLD_KEY = "byoc_threshold"  # config.json: a multi-label model's decision threshold
DEFAULT_THRESHOLD = 0.5
THRESHOLDS_KEY = "byoc_thresholds"  # config.json: {label: threshold} for labels with their own (byoc.tasks.thresholds)
# config.json: where a token classifier was trained on each word's tag: "first" (its first sub-token)
# or "all" (every sub-token: label_all_tokens). Absent in models byoc did not train.
WORD_TAGS_KEY = "byoc_word_tags"
WORD_TAGS = ("first", "all")
# config.json: whether a classifier was trained on sentence pairs (true) or single texts (false): a model of
# single texts answers no rerank request. Absent in models byoc did not train (a Hub cross-encoder reranks).
PAIRS_KEY = "byoc_pairs"
# config.json: the task byoc trained the model for, by its name (byoc.tasks): a task of another package
# (a plug-in) has a name transformers' problem_type does not take.
TASK_KEY = "byoc_task"

DEFAULT_MAX_LENGTH = 512  # when neither the tokenizer nor the model says
_UNKNOWN = 100_000  # tokenizers that do not know their limit report a huge number (1e30)


def max_length(*limits: Any) -> int:
    """The longest input, in tokens, that the model folder allows: the smallest of the limits it
    states (the tokenizer's model_max_length, the model's max_position_embeddings), ignoring the
    missing and the 'unknown' ones."""
    known = [int(n) for n in limits if isinstance(n, (int, float)) and not isinstance(n, bool) and 0 < n < _UNKNOWN]
    return min(known, default=DEFAULT_MAX_LENGTH)


# Architectures whose position ids start past the padding index (RoBERTa's create_position_ids_from_input_ids):
# a text of n tokens reads positions pad_token_id + 1 ... pad_token_id + n, so max_position_embeddings (514 for
# RoBERTa's 512 tokens) overstates the length by pad_token_id + 1.
OFFSET_POSITIONS = frozenset(
    {"roberta", "xlm-roberta", "xlm-roberta-xl", "camembert", "data2vec-text", "roberta-prelayernorm", "mpnet"}
)


# Architectures whose activations pass fp16's largest number (65,504) and turn to infinity and NaN in fp16
# (Gemma's: TEI's issue #748 on EmbeddingGemma): served in bf16 or fp32, never fp16.
FP16_OVERFLOWS = frozenset({"gemma", "gemma2", "gemma3", "gemma3_text", "t5", "mt5"})


def fp16_safe(config: dict[str, Any]) -> bool:
    """Whether fp16 holds the model's activations (config.json's model_type not in FP16_OVERFLOWS)."""
    return config.get("model_type") not in FP16_OVERFLOWS


def positions(config: Any) -> int | None:
    """The tokens the model's position embeddings hold (a config.json as a dict, or a transformers config):
    max_position_embeddings, less the offset of the architectures that start counting past the padding index;
    None where the config states none."""
    read = config.get if isinstance(config, dict) else lambda key, default=None: getattr(config, key, default)
    stated = read("max_position_embeddings")
    if not isinstance(stated, int) or isinstance(stated, bool):
        return None
    pad = read("pad_token_id")
    if read("model_type") in OFFSET_POSITIONS and isinstance(pad, int) and 0 <= pad < stated:
        return stated - pad - 1
    return stated


def threshold_of(config: dict[str, Any]) -> float:
    """A multi-label model's decision threshold (config.json's byoc_threshold, else 0.5)."""
    value = config.get(THRESHOLD_KEY, DEFAULT_THRESHOLD)
    return float(value) if isinstance(value, (int, float)) and 0 <= value <= 1 else DEFAULT_THRESHOLD


def thresholds_of(config: dict[str, Any]) -> list[float] | None:
    """A multi-label model's per-label thresholds in label-id order (config.json's byoc_thresholds), NaN
    for a label without its own (it takes byoc_threshold); None where no label has one."""
    own, id2label = config.get(THRESHOLDS_KEY), config.get("id2label") or {}
    if not isinstance(own, dict) or not own:
        return None
    names = [id2label[key] for key in sorted(id2label, key=int)]
    return [_probability(own.get(name)) for name in names]


def _probability(value: Any) -> float:
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and 0 <= value <= 1
    return float(value) if ok else float("nan")


def word_tags_of(config: dict[str, Any]) -> str | None:
    """How a token classifier was trained on a word's sub-tokens (config.json's byoc_word_tags), or None
    where the model does not say (trained before byoc saved it, or by another tool)."""
    value = config.get(WORD_TAGS_KEY)
    return value if value in WORD_TAGS else None


ROUTER_CONFIG = "router_config.json"  # a sentence-transformers Router's: each route's modules (their folders)
DOCUMENT_ROUTE = "document"


def own_code(folder: Path) -> list[str]:
    """The classes of the folder's own code that transformers would import and run (config.json's and
    tokenizer_config.json's `auto_map`: "modeling_x.MyModel", or "org/repo--modeling_x.MyModel" for code
    in another repository), in order, each once."""
    refs: list[str] = []
    for name in (CONFIG, "tokenizer_config.json"):
        auto_map = json_object(folder, name).get("auto_map")
        for value in (auto_map or {}).values() if isinstance(auto_map, dict) else ():
            refs += [ref for ref in (value if isinstance(value, list) else [value]) if isinstance(ref, str) and ref]
    return list(dict.fromkeys(refs))


def code_problem(folder: Path, trusted: bool, setting: str) -> str | None:
    """Why the folder's own code (own_code) must not run, or None: code in another repository (byoc runs code
    from the model folder alone, never fetched), a module the folder lacks, or code not trusted (`setting`:
    what trusts it, named in the message)."""
    refs = own_code(folder)
    if refs and not trusted and _built_in(folder):
        return None  # (transformers loads a type it knows with its own classes, untrusted: the code never runs)
    remote = next((ref for ref in refs if "--" in ref), None)
    if remote is not None:
        repo = remote.split("--", 1)[0]
        return (
            f"its auto_map names code in another repository ({remote}): byoc runs code from the model folder "
            f"alone, never fetched; copy {repo}'s code files into the folder and name them in auto_map without "
            f"'{repo}--'"
        )
    for ref in refs:
        module = Path(folder) / (ref.rsplit(".", 1)[0].replace(".", "/") + ".py")
        if not module.is_file():
            return f"its auto_map names {ref}, but the folder has no {module.name}"
    if refs and not trusted:
        return (
            f"it ships code of its own (auto_map: {', '.join(refs)}), which byoc runs only with {setting}: set it "
            "if you trust that code (read it first)"
        )
    return None


def _built_in(folder: Path) -> bool:
    """Whether transformers knows the folder's model type and tokenizer class itself (a folder with leftover
    auto_map entries: without trust_remote_code, transformers uses its own classes and imports none of them)."""
    try:  # (a torch load, an export or a job: where transformers is installed)
        import transformers
        from transformers.models.auto.configuration_auto import CONFIG_MAPPING_NAMES
    except ImportError:
        return False

    tokenizer_class = json_object(folder, "tokenizer_config.json").get("tokenizer_class")
    known_tokenizer = not tokenizer_class or hasattr(transformers, str(tokenizer_class).removesuffix("Fast"))
    return json_object(folder, CONFIG).get("model_type") in CONFIG_MAPPING_NAMES and known_tokenizer


def json_object(folder: Path, name: str) -> dict[str, Any]:
    """The folder's JSON file `name` as an object; {} where it is missing, unreadable or not an object (the
    loaders say what is wrong with it: this only reads what it states)."""
    try:
        value = json.loads((Path(folder) / name).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return value if isinstance(value, dict) else {}


def weights_dir(model_dir: Path) -> Path:
    """The folder holding the transformer byoc runs (config.json, the weights, the tokenizer, model.onnx):
    `model_dir` itself, or, for a sentence-transformers folder whose one module is a Router (an inference-free
    sparse model: a lookup table for queries, a transformer for documents), the document route's transformer
    folder inside it (`document_0_MLMTransformer/` as sentence-transformers 6 saves one)."""
    model_dir = Path(model_dir)
    route = router_routes(model_dir).get(DOCUMENT_ROUTE) or []
    inner = next((model_dir / name for name in route if (model_dir / name / CONFIG).is_file()), None)
    return inner if inner is not None else model_dir


def router_routes(model_dir: Path) -> dict[str, list[str]]:
    """A Router folder's routes (router_config.json's `structure`: each route's module folders, in order); {}
    for any other folder."""
    path = Path(model_dir) / ROUTER_CONFIG
    if not path.is_file() or (Path(model_dir) / CONFIG).is_file():
        return {}
    try:
        structure = json.loads(path.read_text(encoding="utf-8")).get("structure")
    except (OSError, ValueError, AttributeError):
        return {}
    if not isinstance(structure, dict):
        return {}
    return {str(k): [str(m) for m in v] for k, v in structure.items() if isinstance(v, list)}


def missing_folder(model_dir: Path) -> str | None:
    """Why `model_dir` is no folder at all (it does not exist, or is a file), or None."""
    model_dir = Path(model_dir)
    if model_dir.is_dir():
        return None
    if model_dir.exists():
        return f"the model folder {model_dir} is not a folder"
    return f"the model folder {model_dir} does not exist"


def unloadable(model_dir: Path) -> str | None:
    """Why `model_dir` holds no model byoc's loaders can read (no folder, no config.json, no safetensors
    weights), with what to check; None where it has what they need."""
    model_dir = Path(model_dir)
    missing = missing_folder(model_dir)
    if missing:
        return missing
    if not (model_dir / CONFIG).is_file():
        return f"{model_dir} holds no {CONFIG}, so it is no saved Hugging Face model{_layout_hint(model_dir)}"
    if not ((model_dir / WEIGHTS).is_file() or (model_dir / SHARDED_WEIGHTS).is_file()):
        other = [name for name in OTHER_WEIGHTS if (model_dir / name).is_file()]
        if other:
            return (
                f"{model_dir} holds its weights as {other[0]}, and byoc loads {WEIGHTS} only (nothing is unpickled): "
                "save the model again with save_pretrained(folder, safe_serialization=True)"
            )
        return f"{model_dir} has {CONFIG} but no weights ({WEIGHTS}){_layout_hint(model_dir)}"
    return None


def _layout_hint(model_dir: Path) -> str:
    """Where the model's files may be instead: a folder inside it (a model.tar.gz packed with its folder),
    or nowhere (an empty folder); else what the folder holds."""
    try:
        entries = sorted(model_dir.iterdir())
    except OSError:
        return ""
    inner = [e for e in entries if e.is_dir() and (e / CONFIG).is_file()]
    if inner:
        return (
            f": the model is in {inner[0].name}/ inside it; pack model.tar.gz with the files at its top "
            f"(tar -czf model.tar.gz -C {inner[0].name} .)"
        )
    if not entries:
        return ": the folder is empty (check the model's model.tar.gz, its ModelDataUrl)"
    shown = ", ".join(e.name + ("/" if e.is_dir() else "") for e in entries[:6])
    return (
        f" (it holds {shown}{' and more' if len(entries) > 6 else ''}); save_pretrained writes {CONFIG} and {WEIGHTS}"
    )


class NoModelFolder(UserError, ValueError):
    """A path given as a model (a channel, a hyperparameter) holds no model folder; the message says what it holds."""


def locate(path: Path, cache_dir: Path) -> Path:
    """The model folder at `path` (a channel's, a job's model_name_or_path): the path itself (config.json), a
    model.tar.gz in it or named by it (an earlier job's output, unpacked under `cache_dir`), or its one subfolder
    holding a model. `byoc train` and `byoc encode` read their `model` channel through it."""
    if path.is_file() and path.name.endswith((".tar.gz", ".tgz", ".tar")):
        return _unpack(path, cache_dir)
    if (path / CONFIG).exists() or router_routes(path):  # (a Router's transformer: inside)
        return path
    archives = sorted(path.glob("*.tar.gz")) + sorted(path.glob("*.tgz"))
    if len(archives) == 1:
        return _unpack(archives[0], cache_dir)
    candidates = sorted(p.parent for pattern in (f"*/{CONFIG}", f"*/*/{CONFIG}") for p in path.glob(pattern))
    if len(candidates) == 1:
        return candidates[0]
    found = ", ".join(sorted(p.name for p in path.iterdir())[:10]) if path.is_dir() else "nothing"
    raise NoModelFolder(
        f"no model in {path} (found: {found or 'an empty folder'}): the model channel or model_name_or_path "
        "must hold a Hugging Face model folder (config.json, weights, tokenizer) or a model.tar.gz"
    )


def _unpack(archive: Path, cache_dir: Path) -> Path:
    """Unpack a model.tar.gz (e.g. an earlier job's output) into the writable cache, never beside it: into a
    folder of its own, renamed to its name once whole (a job killed mid-way leaves no half model to reuse)."""
    facts = archive.stat()
    key = hashlib.sha256(f"{archive.resolve()}:{facts.st_size}:{facts.st_mtime_ns}".encode()).hexdigest()[:16]
    target = cache_dir / "models" / key
    # Only where an archive is unpacked: serving imports this module and never tarfile, so a model's own
    # tarfile.py (its code/ on the path) stays its own.
    import tarfile

    from byoc.safe_files import UnsafeArchive, extract_archive  # (which imports tarfile: here alike)

    if not target.is_dir():  # (else unpacked before, whole)
        partial = target.with_name(f"{key}.partial")
        shutil.rmtree(partial, ignore_errors=True)
        partial.mkdir(parents=True)
        logger.info("unpacking %s into %s", archive, target)
        try:
            extract_archive(archive, partial)
        except (tarfile.TarError, OSError, UnsafeArchive) as err:
            shutil.rmtree(partial, ignore_errors=True)
            raise NoModelFolder(f"cannot unpack the model archive {archive.name}: {err}") from None
        os.replace(partial, target)
    return locate(target, cache_dir)
