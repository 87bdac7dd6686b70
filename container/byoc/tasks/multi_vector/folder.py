"""A MultiVectorEncoder folder's settings, as JSON values (the serving image reads them without torch): its
modules (a Transformer, Dense projections, one MultiVectorMask, a Normalize or not), the Transformer's lengths
and query expansion (sentence_bert_config.json), the skiplist, the prompts and the similarity. FolderError,
naming the file, for a module or a setting byoc does not serve."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from byoc import sentence_folder

MODEL_TYPE = "MultiVectorEncoder"  # config_sentence_transformers.json's model_type for one
SIMILARITIES = ("maxsim", "meanmaxsim")
EXPANSION_STRATEGIES = ("fixed", "min")


def settings(model_dir: Path) -> dict[str, Any]:
    """What the folder's modules do outside the model's forward pass, as JSON values: its prompts
    ({"query", "document"} where set), `query_length` and `document_length`, `query_expansion` (or None),
    the skiplist (`skiplist_words`, `skiplist_tasks`) and `similarity`. FolderError where a module or a setting
    is one byoc does not serve, naming the file."""
    projection(model_dir)  # (the module list checked here too, before anything is loaded)
    _, query_length, document_length, expansion = transformer_config(model_dir)
    mask = _mask_config(model_dir)
    config_path = model_dir / "config_sentence_transformers.json"
    config = sentence_folder.read_json(config_path) if config_path.is_file() else {}
    similarity = config.get("similarity_fn_name") or "maxsim"
    if similarity not in SIMILARITIES:
        raise sentence_folder.FolderError(
            f"{config_path}: similarity_fn_name {similarity!r}; a multi-vector model scores by "
            f"{' or '.join(SIMILARITIES)}"
        )
    return {
        "prompts": {side: text for side, text in sentence_folder.prompts_of(model_dir)["prompts"].items() if text},
        "query_length": query_length,
        "document_length": document_length,
        "query_expansion": expansion,
        "skiplist_words": mask["skiplist_words"],
        "skiplist_tasks": mask["skiplist_tasks"],
        "similarity": similarity,
    }


def _modules(model_dir: Path) -> list[tuple[str, Path]]:
    """modules.json's (type name, folder) of each module, checked: a Transformer, then Dense projections,
    one MultiVectorMask, and a Normalize or not."""
    listed = sentence_folder.read_json(model_dir / sentence_folder.MODULES)
    listed = listed if isinstance(listed, list) else []
    found = [(str(m.get("type", "")).rsplit(".", 1)[-1], model_dir / str(m.get("path", ""))) for m in listed]
    kinds = [kind for kind, _ in found]
    served = {"Transformer", "Dense", "MultiVectorMask", "Normalize"}
    if not kinds or kinds[0] != "Transformer" or kinds.count("MultiVectorMask") != 1 or set(kinds) - served:
        raise sentence_folder.FolderError(
            f"{model_dir / sentence_folder.MODULES} lists {kinds}: byoc serves a MultiVectorEncoder of a Transformer, "
            "Dense projections, one MultiVectorMask and Normalize (token pooling and other modules are not served "
            "yet; a PyLate or Stanford ColBERT folder: load it with sentence-transformers 6.2 and save it again)"
        )
    return found


def projection(model_dir: Path) -> tuple[tuple[sentence_folder.Dense, ...], bool]:
    """The Dense modules (in order) and whether the folder normalises the token vectors: a Normalize module
    whose input is `token_embeddings` (without the name it normalises a sentence vector, as in a dense model:
    MultiVectorEncoder then leaves the token vectors as they are; a Dense module's input is the tokens' anyway)."""
    found = _modules(model_dir)
    dense = tuple(sentence_folder.dense_module(where) for kind, where in found if kind == "Dense")
    normalize = False
    for kind, where in found:
        config = sentence_folder.read_json(where / "config.json") if (where / "config.json").is_file() else {}
        normalize |= kind == "Normalize" and config.get("module_input_name") == "token_embeddings"
    return dense, normalize


def transformer_config(model_dir: Path) -> tuple[int | None, int | None, int | None, dict[str, Any] | None]:
    """sentence_bert_config.json's (max_seq_length, query_length, document_length, query_expansion)."""
    path = Path(model_dir) / "sentence_bert_config.json"
    config = sentence_folder.read_json(path) if path.is_file() else {}

    def length(key: str) -> int | None:
        value = config.get(key)
        if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < 1):
            raise sentence_folder.FolderError(f"{path}: {key} must be a positive number of tokens, not {value!r}")
        return value

    expansion = config.get("query_expansion")
    if expansion is not None:
        if not isinstance(expansion, dict) or expansion.get("strategy") not in EXPANSION_STRATEGIES:
            raise sentence_folder.FolderError(
                f"{path}: query_expansion {expansion!r}: byoc serves the strategies {', '.join(EXPANSION_STRATEGIES)}"
            )
        width = expansion.get("length")
        if not isinstance(width, int) or isinstance(width, bool) or width < 1:
            raise sentence_folder.FolderError(f"{path}: query_expansion needs a length (a positive number of tokens)")
        expansion = {
            "strategy": expansion["strategy"],
            "attend": bool(expansion.get("attend", False)),
            "token": expansion.get("token"),
            "length": width,
        }
    return length("max_seq_length"), length("query_length"), length("document_length"), expansion


def _mask_config(model_dir: Path) -> dict[str, Any]:
    """The MultiVectorMask module's skiplist; FolderError for an allowlist (keep_only_token_ids: image patches)."""
    where = next(where for kind, where in _modules(model_dir) if kind == "MultiVectorMask")
    path = where / "config.json"
    config = sentence_folder.read_json(path) if path.is_file() else {}
    if config.get("keep_only_token_ids"):
        raise sentence_folder.FolderError(f"{path}: keep_only_token_ids (image-patch documents) is not served by byoc")
    tasks = config.get("skiplist_tasks") or ["document"]
    return {
        "skiplist_words": [str(word) for word in config.get("skiplist_words") or []],
        "skiplist_tasks": [tasks] if isinstance(tasks, str) else [str(task) for task in tasks],
    }
