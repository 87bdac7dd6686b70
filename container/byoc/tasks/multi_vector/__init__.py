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
Trained (`task=multi_vector`, byoc.tasks.multi_vector.model) on an embedding model's (query, positive[, negative])
rows with sentence-transformers' multi-vector in-batch negatives loss, each row tokenized as a query and its
documents (byoc.tasks.multi_vector.rows); evaluated as the embedding model is (MRR@10, NDCG@10, recall@1 and
@10 over the eval rows' documents), ranked by MaxSim.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from byoc import model_folder, sentence_folder
from byoc.tasks.base import BadParameter
from byoc.tasks.embedding import (
    MINI_BATCH_SIZE,
    Embedding,
    EmbeddingEvaluation,
    EmbeddingHead,
    EmbeddingRecipe,
    EmbeddingRows,
    dense_stack,
)
from byoc.tasks.embedding import NAME as EMBEDDING
from byoc.tasks.head import Head
from byoc.tasks.kinds import Kind
from byoc.tasks.multi_vector import rows
from byoc.tasks.multi_vector.folder import MODEL_TYPE, projection, settings, transformer_config
from byoc.tasks.multi_vector.head import SIDES, LateInteraction, TokenEncoder

NAME = "multi_vector"
OUTPUTS = ("token_embeddings",)  # a request's "output": what MultiVectorEncoder.encode's output_value takes


class MultiVectorHead(EmbeddingHead):
    """The serving head of a multi-vector (ColBERT) model."""

    kinds: Mapping[Kind, Mapping[str, Any]] = {Kind.TOKEN_VECTORS: {}}
    parameters = ("prompt_name", "output")

    def check_shape(self, shape: str | None) -> None:
        Head.check_shape(self, shape)  # no OpenAI embeddings body: a text has many vectors

    def serving_facts(self, model_dir: Path, config: dict[str, Any]) -> dict[str, Any]:
        """How the folder encodes a query and a document (`settings`), and the length its Transformer reads. A query
        expansion longer than the model's positions is refused here, naming the file: every query would fail."""
        found = settings(Path(model_dir))
        expansion, held = found["query_expansion"], model_folder.positions(config)
        if expansion is not None and held is not None and expansion["length"] > held:
            raise sentence_folder.FolderError(
                f"{Path(model_dir) / 'sentence_bert_config.json'}: query_expansion pads each query to "
                f"{expansion['length']} tokens, past the {held} positions the model holds (config.json): set its "
                f"length to {held} or less"
            )
        return {"multi_vector": found, "max_seq_length": transformer_config(model_dir)[0]}

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


class MultiVectorRows(EmbeddingRows):
    """The training rows of a multi-vector (ColBERT) model."""

    row_unit = "(query, document) rows"
    mined_by = EMBEDDING  # a dense model mines (sentence-transformers' miner takes one): the bundled one, or `miner`

    def encoder(
        self, tokenizer: Any, max_length: int, padding: Any, label_names: list[str], label_all_tokens: bool, train: bool
    ) -> Any:
        """Each row's anchor as a query, its positive and negative as documents (byoc.tasks.multi_vector.rows)."""
        return rows.row_encoder(tokenizer, max_length)

    def encoding_key(self, tokenizer: Any) -> str:
        """The folder's prompts, lengths and query expansion: a change re-tokenizes the rows."""
        return json.dumps(rows.folder_settings(tokenizer), sort_keys=True)


class MultiVectorRecipe(EmbeddingRecipe):
    """The training recipe of a multi-vector (ColBERT) model."""

    recipe_settings = (MINI_BATCH_SIZE,)  # (no Matryoshka: sentence-transformers has none for token vectors)
    loss_runs_model = True  # sentence-transformers' multi-vector loss embeds the query and document columns

    def head_summary(self, num_labels: int) -> str:
        return "a vector per token (late interaction), (query, positive) rows"

    def training_model(
        self,
        path: str,
        label_names: list[str],
        kwargs: dict[str, Any],
        overrides: dict[str, Any],
        trust_remote_code: bool,
        max_length: int,
        world_size: int,
    ) -> Any:
        """A MultiVectorEncoder and its in-batch negatives loss (byoc.tasks.multi_vector.model)."""
        from byoc.tasks.multi_vector import model  # sentence-transformers and torch: only this task's job imports them

        return model.build(
            path,
            bool(label_names),
            max_length,
            kwargs,
            overrides,
            trust_remote_code=trust_remote_code,
            world_size=world_size,
        )

    def apply_recipe(self, model: Any, settings: Mapping[str, Any]) -> None:
        """`mini_batch_size`: the cached multi-vector loss (byoc.tasks.multi_vector.model)."""
        from byoc.tasks.multi_vector.model import cache_negatives  # (as training_model)

        if settings.get("mini_batch_size"):
            cache_negatives(model, settings["mini_batch_size"])

    def collator(self, tokenizer: Any, pad_to_multiple_of: int | None) -> Any:
        return rows.RowCollator(tokenizer, pad_to_multiple_of)


class MultiVectorEvaluation(EmbeddingEvaluation):
    """The evaluation of a multi-vector (ColBERT) model."""

    metrics = ("mrr_at_10", "ndcg_at_10", "recall_at_1", "recall_at_10")
    metric_notes = {
        "mrr_at_10": "each eval row's query ranks every row's document by MaxSim; its own is the relevant one"
    }
    ranks_corpus = True  # a BEIR set: MultiVectorInformationRetrievalEvaluator (MaxSim)

    def corpus_evaluator(self) -> Any:
        from sentence_transformers.multi_vector_encoder.evaluation import (  # (training's; 6.2 on, as the model)
            MultiVectorInformationRetrievalEvaluator,
        )

        return MultiVectorInformationRetrievalEvaluator

    def evaluate(
        self, logits: np.ndarray, labels: np.ndarray, names: list[str], cut: float | np.ndarray
    ) -> tuple[dict[str, float], dict[str, Any]]:
        """`logits`: each row's packed query and document token vectors (byoc.tasks.multi_vector.model)."""
        return rows.maxsim_metrics(logits, labels), {}

    def predictions(
        self, logits: np.ndarray, labels: np.ndarray, names: list[str], cuts: np.ndarray
    ) -> list[dict[str, Any]]:
        """Each test row's MaxSim between its query and its document."""
        return [{"maxsim": round(float(score), 6)} for score in rows.own_scores(logits, labels)]


class MultiVector(Embedding):
    """Trained as the embedding model is (its rows, batches, mined negatives and metrics), each row as a query
    and its documents; served as MultiVectorEncoder encodes."""

    name = NAME
    aliases = ("colbert", "multi_vector_embedding", "multivector", "late_interaction")
    described = "a multi-vector (ColBERT) model"
    auto_class = "AutoModel"
    output_axes = {0: "batch", 1: "length"}  # a vector per token
    sentence_model_type = MODEL_TYPE
    head_class = MultiVectorHead
    rows_class = MultiVectorRows
    recipe_class = MultiVectorRecipe
    evaluation_class = MultiVectorEvaluation

    def output_module(self, model: Any, model_dir: Path) -> Any:
        """Each token's state through the folder's Dense projections, then normalised where it ends in Normalize."""
        import torch  # serving's torch path and the export: the slim image never calls this

        dense, normalize = projection(Path(model_dir))
        layers = dense_stack(dense)

        class TokenVectors(torch.nn.Module):
            def __init__(self) -> None:
                super().__init__()
                self.model = model
                self.projection = layers
                self.config = model.config

            def forward(
                self, input_ids: torch.Tensor, attention_mask: torch.Tensor, **rest: torch.Tensor
            ) -> torch.Tensor:
                states = self.model(input_ids=input_ids, attention_mask=attention_mask, **rest).last_hidden_state
                vectors = self.projection(states)
                return torch.nn.functional.normalize(vectors, p=2, dim=-1) if normalize else vectors

        return TokenVectors().eval()
