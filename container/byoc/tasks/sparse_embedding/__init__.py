"""A weight per vocabulary term (SPLADE): a sentence-transformers `SparseEncoder` folder (its `MLMTransformer`
and `SpladePooling` modules), served as Text Embeddings Inference's `embed_sparse` answers it: each text's
active terms as `[{"index", "value"}]`, in vocabulary order (with `"token"`, the term itself, where the request
sets `return_tokens`). The pooling (log(1 + ReLU) of the masked-language-model logits, the max or the sum over
the text's tokens) runs in the model, inside model.onnx or on torch, so its answers equal `SparseEncoder.encode`'s.
The inference-free kind (a Router: byoc.tasks.sparse_embedding.folder) encodes documents so, and queries
(`"prompt_name": "query"`) with no model: each of the query's tokens weighs its term's weight in the folder's table.
Trained (`task=sparse_embedding`, byoc.tasks.sparse_embedding.model) on an embedding model's rows, with SPLADE's
loss; evaluated as the embedding model is, plus `active_dims`: the active terms of an evaluated text, on average.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from byoc import model_folder, sentence_folder
from byoc.tasks.base import BadParameter, kept_rows
from byoc.tasks.common import Identity
from byoc.tasks.embedding import Embedding, EmbeddingEvaluation, EmbeddingHead, EmbeddingRecipe, EmbeddingRows
from byoc.tasks.head import Head
from byoc.tasks.kinds import Kind
from byoc.tasks.settings import RecipeSetting
from byoc.tasks.sparse_embedding.folder import QUERY, query_table, splade_settings

NAME = "sparse_embedding"
MODEL_TYPE = "SparseEncoder"  # config_sentence_transformers.json's model_type for one


INFERENCE_FREE = RecipeSetting(
    "inference_free", bool, False, "Sparse models: queries weighed by a trained table, no model run at query time."
)


class SparseEmbeddingHead(EmbeddingHead):
    """The serving head of a sparse embedding model."""

    output_names = ("sparse", "sparse_embedding", "lexical_weights")
    kinds: Mapping[Kind, Mapping[str, Any]] = {Kind.SPARSE_TERMS: {}}
    parameters = ("return_tokens", "prompt_name", "output")

    def check_shape(self, shape: str | None) -> None:
        Head.check_shape(self, shape)  # no OpenAI embeddings body: its vectors are dense

    def check_values(self, parameters: Mapping[str, Any]) -> None:
        super().check_values(parameters)  # ("output": its own)
        if parameters.get("return_tokens") is not None and not isinstance(parameters["return_tokens"], bool):
            raise BadParameter('"return_tokens" must be true or false')

    def serving_facts(self, model_dir: Path, config: dict[str, Any]) -> dict[str, Any]:
        """The pooling the folder's SpladePooling module applies, the length its MLMTransformer reads, its
        prompts, and an inference-free model's query side (byoc.tasks.sparse_embedding.folder)."""
        model_dir = Path(model_dir)
        settings = splade_settings(model_dir)  # (first: it checks a Router's modules before its table is read)
        table = query_table(model_dir)
        return {
            **settings,
            **sentence_folder.prompts_of(model_dir),
            "max_seq_length": sentence_folder.max_seq_length_of(model_folder.weights_dir(model_dir)),
            "queries": StaticQueries.encoder(table) if table is not None else None,
        }

    def prepare(self, inputs: list[Any], parameters: Mapping[str, Any], model: Mapping) -> list[Any]:
        """The texts, each after the request's prompt (`prompt_name`) or the folder's default one."""
        if any(not isinstance(text, str) for text in inputs):
            raise BadParameter("a sparse embedding model embeds single texts: send texts, not pairs")
        return super().prepare(inputs, parameters, model)

    def windows(self, inputs: list[Any], parameters: Mapping[str, Any], model: Mapping) -> Any:
        """An inference-free model's queries (`"prompt_name": "query"`): no model runs, each token weighs its
        term's weight in the query side's table. Anything else runs the model (None)."""
        if parameters.get("prompt_name") != QUERY or model.get("queries") is None:
            return None
        if any(not isinstance(text, str) for text in inputs):
            raise BadParameter("a sparse embedding model embeds single texts: send texts, not pairs")
        prompt = (model.get("prompts") or {}).get(QUERY, "")  # (the route is the query's, prompt or not)
        return StaticQueries([prompt + text for text in inputs], parameters, model, self.task)

    def answer(
        self, scores: list[np.ndarray], id2label: Mapping[int, str], parameters: Mapping[str, Any], model: Mapping
    ) -> list[Any]:
        """Each text's active terms, `{"index", "value"}` in vocabulary order (`"token"` too with return_tokens)."""
        vocabulary = vocabulary_of(model) if parameters.get("return_tokens") else None
        out = []
        for row in scores:
            terms: list[dict[str, Any]] = []
            for i in np.flatnonzero(row):
                term: dict[str, Any] = {"index": int(i), "value": float(row[i])}
                if vocabulary is not None:
                    term["token"] = vocabulary.get(int(i), "")
                terms.append(term)
            out.append(terms)
        return out


class SparseEmbeddingRows(EmbeddingRows):
    """The training rows of a sparse embedding model."""

    mined_by = None  # (its own: sentence-transformers' miner takes dense models, so mine_negatives refuses)
    mines_negatives = False

    def mine_negatives(
        self,
        model: Any,
        anchors: list[str],
        positives: list[str],
        range_min: int,
        range_max: int,
        margin: float,
        count: int = 1,
    ) -> list[list[str]]:
        raise BadParameter(
            "mine_hard_negatives=true mines with a dense embedding model (sentence-transformers' util."
            "mine_hard_negatives does not take a SparseEncoder): mine the negatives beforehand (with a dense "
            "model, or a sparse one's index) and give them as a negative column"
        )


class SparseEmbeddingRecipe(EmbeddingRecipe):
    """The training recipe of a sparse embedding model."""

    recipe_settings = (INFERENCE_FREE,)  # (no Matryoshka: a sparse vector's dimensions are the vocabulary's terms)

    def head_summary(self, num_labels: int) -> str:
        return "sparse embeddings, " + ("scored pairs" if num_labels else "(anchor, positive) rows")

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
        """A SparseEncoder and SPLADE's loss (byoc.tasks.sparse_embedding.model)."""
        from byoc.tasks.sparse_embedding import model  # sentence-transformers and torch: only a sparse job imports them

        return model.build(
            path,
            bool(label_names),
            max_length,
            kwargs,
            overrides,
            trust_remote_code=trust_remote_code,
            world_size=world_size,
        )

    def encoder_of(self, model: Any) -> Any:
        from byoc.tasks.sparse_embedding.model import encoder_of  # (as training_model)

        return encoder_of(model)

    def apply_recipe(self, model: Any, settings: Mapping[str, Any]) -> None:
        """`inference_free`: queries weighed by a table, documents by the model (byoc.tasks.sparse_embedding.model)."""
        from byoc.tasks.sparse_embedding.model import make_inference_free  # (as training_model)

        if settings.get("inference_free"):
            make_inference_free(model)


class SparseEmbeddingEvaluation(EmbeddingEvaluation):
    """The evaluation of a sparse embedding model."""

    metrics = (*EmbeddingEvaluation.metrics, "active_dims")
    ranks_corpus = True

    def corpus_evaluator(self) -> Any:
        from sentence_transformers.sparse_encoder.evaluation import SparseInformationRetrievalEvaluator  # (training's)

        return SparseInformationRetrievalEvaluator

    def evaluate(
        self, logits: np.ndarray, labels: np.ndarray, names: list[str], cut: float | np.ndarray
    ) -> tuple[dict[str, float], dict[str, Any]]:
        """The embedding model's metrics (cosine), and the active terms of a text on average."""
        metrics, details = super().evaluate(logits, labels, names, cut)
        kept, _ = kept_rows(np.asarray(logits, dtype=np.float32), np.asarray(labels))
        metrics["active_dims"] = float(np.count_nonzero(kept, axis=1).mean() / 2) if len(kept) else 0.0
        return metrics, details


class SparseEmbedding(Embedding):
    """Trained as the embedding model is (its rows, batches and metrics); served as TEI serves SPLADE."""

    name = NAME
    aliases = ("sparse", "splade", "sparse_embeddings", "sparse_encoder")
    described = "a sparse embedding model"
    auto_class = "AutoModelForMaskedLM"
    sentence_model_type = MODEL_TYPE
    head_class = SparseEmbeddingHead
    rows_class = SparseEmbeddingRows
    recipe_class = SparseEmbeddingRecipe
    evaluation_class = SparseEmbeddingEvaluation

    def load_torch(self, model_dir: Path, **kwargs: Any) -> tuple[Any, list[str]]:
        """The masked language model; a pooler its checkpoint lacks is not missing (SPLADE never uses it)."""
        model, missing = super().load_torch(model_dir, **kwargs)
        return model, [key for key in missing if not key.startswith("pooler.")]

    def output_module(self, model: Any, model_dir: Path) -> Any:
        """The MLM logits pooled as SpladePooling pools them: one weight per vocabulary term a text."""
        import torch  # (as load_torch: serving's torch path and the export)

        settings = splade_settings(Path(model_dir))  # (a Router folder's document route)

        class Splade(torch.nn.Module):
            def __init__(self) -> None:
                super().__init__()
                self.model = model
                self.config = model.config

            def forward(
                self, input_ids: torch.Tensor, attention_mask: torch.Tensor, **rest: torch.Tensor
            ) -> torch.Tensor:
                logits = self.model(input_ids=input_ids, attention_mask=attention_mask, **rest).logits
                if settings["pooling"] == "max":
                    # log(1 + ReLU) never decreases, so the max of the activations is the activation of the
                    # max: the largest real token's logit a term, then the activation on (batch, terms) alone;
                    # two passes over the (batch, length, terms) logits where the activation first takes five.
                    padding = (attention_mask == 0).unsqueeze(-1)
                    return activation(logits.masked_fill(padding, float("-inf")).amax(dim=1))
                return activation(logits * attention_mask.unsqueeze(-1).to(logits.dtype)).sum(dim=1)

        def activation(logits: torch.Tensor) -> torch.Tensor:
            weights = torch.log1p(torch.relu(logits))
            return torch.log1p(weights) if settings["activation"] == "log1p_relu" else weights

        return Splade().eval()

    def scores(self, logits: np.ndarray) -> np.ndarray:
        return np.asarray(logits, dtype=np.float32)


class StaticQueries:
    """An inference-free model's queries, as its SparseStaticEmbedding encodes them: the query's tokens (no
    special tokens, cut at the table's length), each distinct token's weight, the zero ones left out."""

    def __init__(self, texts: list[str], parameters: Mapping[str, Any], model: Mapping, task: Identity) -> None:
        self.texts, self.parameters, self.model, self.task = texts, parameters, model, task
        self.rows: list[np.ndarray] = []
        self.feeds: list[dict[str, list[int]]] = []  # (no model runs)

    @staticmethod
    def encoder(table: Mapping[str, Any]) -> dict[str, Any]:
        """The query side's tokenizer (no padding; cut at its length) and its weights."""
        from tokenizers import Tokenizer  # (serving's: training never serves queries)

        tokenizer = Tokenizer.from_file(table["tokenizer"])
        tokenizer.no_padding()
        tokenizer.enable_truncation(table["max_length"])
        return {"tokenizer": tokenizer, "weights": table["weights"]}

    def encode(self) -> None:
        queries = self.model["queries"]
        weights = queries["weights"]
        for encoding in queries["tokenizer"].encode_batch(self.texts, add_special_tokens=False):
            row = np.zeros_like(weights)
            ids = np.unique(np.asarray(encoding.ids, dtype=np.int64))
            row[ids] = weights[ids]
            self.rows.append(row)

    def answers(self, scores: list[np.ndarray]) -> list[Any]:
        return self.task.head.answer(self.rows, {}, self.parameters, self.model)


def vocabulary_of(model: Mapping) -> dict[int, str]:
    """Each term's token: the loaded model's tokenizer (a `tokenizers.Tokenizer` or a transformers one)."""
    tokenizer = model.get("tokenizer")
    vocabulary = tokenizer.get_vocab() if tokenizer is not None else {}
    return {index: token for token, index in vocabulary.items()}
