"""Dense, sparse and multi-vector outputs from one forward pass: a bge-m3-format folder (an encoder, and beside
its weights FlagEmbedding's `colbert_linear.pt` and `sparse_linear.pt`), served as FlagEmbedding's
BGEM3FlagModel encodes and scores.

- `{"inputs": [...]}` answers each text's dense vector (what Text Embeddings Inference answers for bge-m3);
  `"output": "sparse"` its term weights, `[{"index", "value"}]` (`"return_tokens": true` adds each term's
  token), `"output": "colbert"` its token vectors; a list (`["dense", "sparse"]`) answers an object a text,
  each output under its name. All from the same pass: asking for three costs what asking for one does.
- Pairs (TEI's rerank body, or `{"inputs": [[query, text], ...]}`) are scored as `compute_score` scores them:
  the dense, sparse and ColBERT scores' weighted mean, each weighing 1 unless the request's `"weights"` says
  otherwise (a rerank body's `"parameters"`).

The model (byoc.tasks.hybrid.Hybrid.output_module, inside model.onnx or on torch) gives one row per token,
which the head (byoc.tasks.hybrid.head) cuts into the three outputs. Served only: a job trains a dense, sparse
or multi-vector model (task=embedding, sparse_embedding, multi_vector), not the three at once.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from byoc import sentence_folder
from byoc.tasks.base import BadParameter, Task
from byoc.tasks.head import Head
from byoc.tasks.hybrid.head import OFFSET, HybridRequest, outputs_of, weights_of
from byoc.tasks.kinds import Kind
from byoc.tasks.multi_vector.head import TokenEncoder
from byoc.tasks.recipe import Recipe

NAME = "hybrid"
COLBERT, SPARSE = "colbert_linear.pt", "sparse_linear.pt"  # FlagEmbedding's heads, beside the encoder's weights
# The tokens whose weights BGEM3FlagModel leaves out of a text's terms (the tokenizer's, where it has each).
UNUSED_TOKENS = ("cls_token", "eos_token", "pad_token", "unk_token")


class HybridHead(Head):
    """The serving head of a hybrid (dense, sparse and multi-vector) model."""

    kinds: Mapping[Kind, Mapping[str, Any]] = {
        Kind.VECTOR: {"output": "dense"},
        Kind.SPARSE_TERMS: {"output": "sparse"},
        Kind.TOKEN_VECTORS: {"output": "colbert"},
    }
    parameters = ("output", "return_tokens", "weights", "normalize")
    rerank_parameters = ("weights",)

    def serving_facts(self, model_dir: Path, config: dict[str, Any]) -> dict[str, Any]:
        """The encoder's width (the dense columns), the tokens a text's terms leave out, and the length the
        folder's sentence-transformers config reads, where it has one."""
        return {
            "hybrid": {"dense_width": int(config["hidden_size"]), "unused_ids": unused_ids(Path(model_dir))},
            "max_seq_length": sentence_folder.max_seq_length_of(Path(model_dir)),
        }

    def check_shape(self, shape: str | None) -> None:
        """Every body's form: an OpenAI embeddings body gets the dense vectors (TEI's and OpenAI's clients send
        bge-m3 those), a rerank body the weighted scores."""

    def check_values(self, parameters: Mapping[str, Any]) -> None:
        if parameters.get("normalize") is False:
            raise BadParameter("\"normalize\": false: a hybrid model's vectors are normalised, as BGEM3FlagModel's")
        outputs_of(parameters.get("output"))
        weights_of(parameters.get("weights"))
        if parameters.get("return_tokens") is not None and not isinstance(parameters["return_tokens"], bool):
            raise BadParameter('"return_tokens" must be true or false')

    def kind_of(self, parameters: Mapping[str, Any]) -> Kind:
        """One output's kind, or several outputs by name where "output" is a list."""
        names, listed = outputs_of(parameters.get("output"))
        if listed:
            return Kind.OUTPUTS
        return next(kind for kind, asked in self.kinds.items() if asked["output"] == names[0])

    def check_rerank(self, model: Mapping) -> None:
        """A rerank body is scored as compute_score scores: nothing to refuse."""

    def window_encoder(self, tokenizer: Any, limit: int, names: list[str]) -> Any:
        return TokenEncoder(tokenizer, limit, names)

    def windows(self, inputs: list[Any], parameters: Mapping[str, Any], model: Mapping) -> Any:
        return HybridRequest(inputs, parameters, model)


class HybridRecipe(Recipe):
    """The training recipe of a hybrid (dense, sparse and multi-vector) model."""

    def head_summary(self, num_labels: int) -> str:
        return "dense, sparse and multi-vector outputs (bge-m3)"


class Hybrid(Task):
    name = NAME
    aliases = ("bge_m3", "m3", "hybrid_embedding")
    described = "a hybrid (dense, sparse and multi-vector) model"
    folder_files = (COLBERT, SPARSE)
    auto_class = "AutoModel"
    output_axes = {0: "batch", 1: "length"}  # a row per token
    trains = False
    head_class = HybridHead
    recipe_class = HybridRecipe

    def load_torch(self, model_dir: Path, **kwargs: Any) -> tuple[Any, list[str]]:
        """The encoder; a pooler its checkpoint lacks is not missing (the heads read the token states)."""
        model, missing = super().load_torch(model_dir, **kwargs)
        return model, [key for key in missing if not key.startswith("pooler.")]

    def output_module(self, model: Any, model_dir: Path) -> Any:
        """The encoder's token states through the two heads, packed a row per token (byoc.tasks.hybrid.head):
        the term weight first, then the dense vector (first token) or the ColBERT vector (the others)."""
        import torch  # serving's torch path and the export: the slim image never calls this

        colbert, sparse = (linear(Path(model_dir) / name) for name in (COLBERT, SPARSE))

        class Rows(torch.nn.Module):
            def __init__(self) -> None:
                super().__init__()
                self.model, self.colbert, self.sparse = model, colbert, sparse
                self.config = model.config

            def forward(
                self, input_ids: torch.Tensor, attention_mask: torch.Tensor, **rest: torch.Tensor
            ) -> torch.Tensor:
                states = self.model(input_ids=input_ids, attention_mask=attention_mask, **rest).last_hidden_state
                dense = torch.nn.functional.normalize(states[:, :1], dim=-1)
                tokens = torch.nn.functional.normalize(self.colbert(states[:, 1:]), dim=-1)
                dense = torch.nn.functional.pad(dense, (0, tokens.shape[-1]))  # (ColBERT columns: 0)
                tokens = torch.nn.functional.pad(tokens, (states.shape[-1], 0))  # (dense columns: 0)
                return torch.cat([torch.relu(self.sparse(states)), torch.cat([dense, tokens], dim=1)], dim=-1)

        return Rows().eval()

    def scores(self, logits: np.ndarray) -> np.ndarray:
        return np.asarray(logits, dtype=np.float32)  # the rows as the model gives them (the head cuts them up)


def linear(path: Path) -> Any:
    """One of FlagEmbedding's heads: a torch.nn.Linear from its state dict (`weight`, `bias`), loaded as
    tensors only (never unpickling objects)."""
    import torch  # (as Hybrid.output_module)

    try:
        state = torch.load(str(path), map_location="cpu", weights_only=True)
        layer = torch.nn.Linear(state["weight"].shape[1], state["weight"].shape[0], bias="bias" in state)
        layer.load_state_dict(state)
    except FileNotFoundError:
        raise sentence_folder.FolderError(
            f"{path} is missing: a hybrid (bge-m3) folder holds {COLBERT} and {SPARSE}"
        ) from None
    except Exception as err:  # not a state dict of one linear layer
        raise sentence_folder.FolderError(
            f"{path} is not a linear layer's state dict (weight, bias) as FlagEmbedding saves it: {err}"
        ) from None
    return layer.float()


def unused_ids(model_dir: Path) -> list[int]:
    """The ids of the tokenizer's UNUSED_TOKENS, as its tokenizer_config.json (or special_tokens_map.json) names
    them and its tokenizer.json numbers them."""
    from tokenizers import Tokenizer  # (serving's own dependency; training never calls this)

    named: dict[str, Any] = {}
    for name in ("special_tokens_map.json", "tokenizer_config.json"):
        if (model_dir / name).is_file():
            named.update(sentence_folder.read_json(model_dir / name))
    if not (model_dir / "tokenizer.json").is_file():
        raise sentence_folder.FolderError(
            f"{model_dir / 'tokenizer.json'} is missing: a hybrid model is served with it"
        )
    tokenizer = Tokenizer.from_file(str(model_dir / "tokenizer.json"))
    found = []
    for key in UNUSED_TOKENS:
        token = named.get(key)
        token = token.get("content") if isinstance(token, dict) else token
        index = tokenizer.token_to_id(token) if isinstance(token, str) else None
        if index is not None:
            found.append(index)
    return sorted(set(found))


__all__ = ["NAME", "OFFSET", "Hybrid"]
