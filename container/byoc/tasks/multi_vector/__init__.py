"""A vector per token (ColBERT, late interaction): a sentence-transformers `MultiVectorEncoder` folder (its
Transformer, Dense projections, MultiVectorMask and Normalize modules), served as `MultiVectorEncoder.encode`
gives its vectors: each text's token vectors, `[[float, ...], ...]`, encoded as a document (the default:
`encode_document`, which an index is built from) or as a query (`"prompt_name": "query"`: `encode_query`).
A rerank body's texts are scored by MaxSim against its query (each query vector's best dot product with the
text's vectors, summed; divided by the query's vector count where the folder says `meanmaxsim`).

The projection and normalisation run in the model (inside model.onnx, or on torch); what differs between
queries and documents runs here, as sentence-transformers runs it (byoc.tasks.multi_vector.head): the
folder's prompts, the per-side length, query expansion (a query padded to a fixed length with [MASK] tokens,
which the scoring keeps) and the skiplist (tokens, punctuation mostly, a document's scoring drops).
Serving only, for now: `byoc train` refuses the task at start (train with sentence-transformers in script mode).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from byoc import sentence_folder
from byoc.tasks.base import BadParameter, Task
from byoc.tasks.multi_vector.head import SIDES, LateInteraction, TokenEncoder

NAME = "multi_vector"
MODEL_TYPE = "MultiVectorEncoder"  # config_sentence_transformers.json's model_type for one
SIMILARITIES = ("maxsim", "meanmaxsim")
EXPANSION_STRATEGIES = ("fixed", "min")
OUTPUTS = ("token_embeddings",)  # a request's "output": what MultiVectorEncoder.encode's output_value takes


class MultiVector(Task):
    name = NAME
    aliases = ("colbert", "multi_vector_embedding", "multivector", "late_interaction")
    described = "a multi-vector (ColBERT) model"
    parameters = ("prompt_name", "output")
    auto_class = "AutoModel"
    output_axes = {0: "batch", 1: "length"}  # a vector per token
    sentence_model_type = MODEL_TYPE
    in_metric_definitions = False
    untrained_why = (
        "byoc serves multi-vector (ColBERT) models but does not train them yet: train one with sentence-"
        "transformers' MultiVectorEncoder trainer in script mode (code/train.py), then serve its folder"
    )

    def head(self, num_labels: int) -> str:
        return "a vector per token (late interaction)"

    def serving_facts(self, model_dir: Path, config: dict[str, Any]) -> dict[str, Any]:
        """How the folder encodes a query and a document (`settings`), and the length its Transformer reads."""
        return {"multi_vector": settings(Path(model_dir)), "max_seq_length": _transformer_config(model_dir)[0]}

    def load_torch(self, model_dir: Path, **kwargs: Any) -> tuple[Any, list[str]]:
        """The encoder; a pooler its checkpoint lacks is not missing (token vectors never use it)."""
        model, missing = super().load_torch(model_dir, **kwargs)
        return model, [key for key in missing if not key.startswith("pooler.")]

    def output_module(self, model: Any, model_dir: Path) -> Any:
        """Each token's state through the folder's Dense projections, then normalised where it ends in Normalize."""
        import torch  # (as load_torch: serving's torch path and the export)

        from byoc.tasks.embedding import dense_stack  # (torch, as above)

        dense, normalize = _projection(Path(model_dir))
        projection = dense_stack(dense)

        class TokenVectors(torch.nn.Module):
            def __init__(self) -> None:
                super().__init__()
                self.model = model
                self.projection = projection
                self.config = model.config

            def forward(
                self, input_ids: torch.Tensor, attention_mask: torch.Tensor, **rest: torch.Tensor
            ) -> torch.Tensor:
                states = self.model(input_ids=input_ids, attention_mask=attention_mask, **rest).last_hidden_state
                vectors = self.projection(states)
                return torch.nn.functional.normalize(vectors, p=2, dim=-1) if normalize else vectors

        return TokenVectors().eval()

    def scores(self, logits: np.ndarray) -> np.ndarray:
        return np.asarray(logits, dtype=np.float32)

    def check_rerank(self, model: Mapping) -> None:
        """A rerank body is scored by MaxSim: nothing to refuse."""

    def check_values(self, parameters: Mapping[str, Any]) -> None:
        side = parameters.get("prompt_name")
        if side is not None and side not in SIDES:
            raise BadParameter(
                f'"prompt_name" is the side a text is encoded as, one of {", ".join(SIDES)}; got {side!r}'
            )
        output = parameters.get("output")
        if output is not None and output not in OUTPUTS:
            raise BadParameter(f'a multi-vector model answers "output": "token_embeddings" only; got {output!r}')

    def window_encoder(self, tokenizer: Any, limit: int, names: list[str]) -> Any:
        """The tokenizer, for the request to encode each text as a query or a document (head.TokenEncoder)."""
        return TokenEncoder(tokenizer, limit, names)

    def windows(self, inputs: list[Any], parameters: Mapping[str, Any], model: Mapping) -> Any:
        return LateInteraction(inputs, parameters, model)


def settings(model_dir: Path) -> dict[str, Any]:
    """What the folder's modules do outside the model's forward pass, as JSON values: its prompts
    ({"query", "document"} where set), `query_length` and `document_length`, `query_expansion` (or None),
    the skiplist (`skiplist_words`, `skiplist_tasks`) and `similarity`. FolderError where a module or a setting
    is one byoc does not serve, naming the file."""
    _projection(model_dir)  # (the module list checked here too, before anything is loaded)
    _, query_length, document_length, expansion = _transformer_config(model_dir)
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


def _projection(model_dir: Path) -> tuple[tuple[sentence_folder.Dense, ...], bool]:
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


def _transformer_config(model_dir: Path) -> tuple[int | None, int | None, int | None, dict[str, Any] | None]:
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
