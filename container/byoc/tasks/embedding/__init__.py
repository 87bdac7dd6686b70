"""A vector per text: a sentence-embedding model (a sentence-transformers folder, or any encoder asked to
embed with BYOC_TASK=embedding), served as Text Embeddings Inference serves one.

The folder's modules (byoc.sentence_folder) turn the transformer's token states into the vector: its
pooling and Dense layers run in the model (inside model.onnx, or on torch: `Pooled`); normalization,
Matryoshka `dimensions` and prompts are the request's (`normalize`, default true as in TEI;
`dimensions`, the first N components, normalized again; `prompt_name`, one of the folder's prompts,
else its default prompt), so they cost nothing in the graph and a request may turn them off.

Trained (byoc.tasks.embedding.model) on scored pairs or on (anchor, positive[, negative]) rows; an evaluation
gets each row's two vectors side by side and reports the Spearman (and Pearson) correlation of their
cosine with the scores, or (rows without scores) how well each anchor finds its own positive among every
row's: MRR@10, NDCG@10, recall@1 and @10, as sentence-transformers' evaluators compute them.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from byoc import compat, sentence_folder
from byoc.tasks.base import BadParameter, Task, kept_rows
from byoc.tasks.embedding.collator import TEXT_GROUPS, GroupCollator
from byoc.tasks.embedding.ranking import rank_metrics, retrieval_metrics  # noqa: F401  (rank_metrics: the families')
from byoc.tasks.evaluation import Evaluation
from byoc.tasks.head import Head
from byoc.tasks.kinds import Kind
from byoc.tasks.recipe import Recipe
from byoc.tasks.regression import regression_metrics
from byoc.tasks.rows import Rows
from byoc.tasks.settings import COUNT, LORA_R, RecipeSetting, sizes

NAME = "embedding"
NORM_EPS = 1e-12  # as torch.nn.functional.normalize (sentence-transformers' Normalize)
ROWS_DEFAULTS = {"learning_rate": 5e-5, "dropout": None}  # (anchor, positive) rows: Embedding.training_defaults


MATRYOSHKA_DIMS = RecipeSetting(
    "matryoshka_dims", str, "", "Embedding models: also train these leading dimensions alone (768,256,64).", value=sizes
)
MINI_BATCH_SIZE = RecipeSetting(
    "mini_batch_size",
    int | None,
    None,
    "In-batch negatives: embed N rows a pass, gradients cached.",
    bound=COUNT,
    eager="the cached loss (mini_batch_size) runs the model itself, which is not compiled",
    one_process="mini_batch_size (cached in-batch negatives) trains in one process on a CPU or a GPU for now",
)


class EmbeddingHead(Head):
    """The serving head of an embedding model."""

    output_names: tuple[str, ...] = ("dense", "sentence_embedding", "dense_vecs")  # what "output" may name
    kinds: Mapping[Kind, Mapping[str, Any]] = {Kind.VECTOR: {}}
    parameters: tuple[str, ...] = ("normalize", "dimensions", "prompt_name", "output")

    def check_values(self, parameters: Mapping[str, Any]) -> None:
        output = parameters.get("output")
        if output is not None and output not in self.output_names:
            raise BadParameter(
                f'"output": {self.task.described} answers one output, "{self.output_names[0]}" (or '
                f"{', '.join(repr(name) for name in self.output_names[1:])}); got {output!r}"
            )

    def check_shape(self, shape: str | None) -> None:
        """Every body's form: an OpenAI embeddings body too (a rerank body: `check_rerank`)."""

    def serving_facts(self, model_dir: Path, config: dict[str, Any]) -> dict[str, Any]:
        folder = sentence_folder.read(model_dir)
        return {
            "prompts": folder.prompts,
            "default_prompt_name": folder.default_prompt_name,
            "max_seq_length": folder.max_seq_length,
        }

    def prepare(self, inputs: list[Any], parameters: Mapping[str, Any], model: Mapping) -> list[Any]:
        """The texts, each after the request's prompt (`prompt_name`) or the folder's default one."""
        if any(not isinstance(text, str) for text in inputs):
            raise BadParameter("an embedding model embeds single texts: send texts, not pairs")
        prompts = model.get("prompts") or {}
        name = parameters.get("prompt_name") or model.get("default_prompt_name")
        if name is None:
            return inputs
        if name not in prompts:
            known = ", ".join(sorted(prompts)) if prompts else "none"
            raise BadParameter(f'"prompt_name" {name!r} is not one of the model\'s prompts ({known})')
        return [prompts[name] + text for text in inputs]

    def answer(
        self, scores: list[np.ndarray], id2label: Mapping[int, str], parameters: Mapping[str, Any], model: Mapping
    ) -> list[Any]:
        """Each text's vector: its first `dimensions` components, unit length unless `normalize` is false."""
        dimensions, normalize = parameters.get("dimensions"), parameters.get("normalize", True)
        width = len(scores[0]) if scores else 0
        if dimensions is not None and dimensions > width:
            raise BadParameter(f'"dimensions" is {dimensions}, more than the model\'s {width}')
        out = []
        for row in scores:
            vector = row[:dimensions] if dimensions else row
            if normalize:
                vector = vector / max(float(np.linalg.norm(vector)), NORM_EPS)
            out.append(vector.astype(np.float32).tolist())
        return out


class EmbeddingRows(Rows):
    """The training rows of an embedding model."""

    mines_negatives = True
    mined_by: str | None = NAME  # by the model the job trains, as loaded

    def encoder(
        self, tokenizer: Any, max_length: int, padding: Any, label_names: list[str], label_all_tokens: bool, train: bool
    ) -> Any:
        """A row's texts (a text, its pair, a negative) -> each text's token ids under its group's prefix
        (TEXT_GROUPS: byoc.tasks.embedding.model runs each group on its own), the row's length (its longest
        text's) and its score."""

        def encode(batch: dict[str, list]) -> dict[str, list]:
            out: dict[str, list] = {}
            for column, prefix in TEXT_GROUPS.items():
                if column in batch:
                    enc = tokenizer(batch[column], truncation=True, max_length=max_length, padding=padding)
                    out.update({prefix + key: values for key, values in enc.items()})
            masks = [out[prefix + "attention_mask"] for column, prefix in TEXT_GROUPS.items() if column in batch]
            out["length"] = [max(sum(mask) for mask in row) for row in zip(*masks)]
            out["labels"] = batch["label"]
            return out

        return encode

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
        """Each row's hard negatives (`count` at most, hardest first) among the rows' positives, mined with `model`
        (the training model, as loaded): sentence-transformers' util.mine_hard_negatives; none where none is in
        range and margin."""
        from byoc.tasks.embedding.model import mine_negatives  # (as training_model)

        return mine_negatives(model, anchors, positives, range_min, range_max, margin, count)

    def in_batch_negatives(self, columns: list[str], labelled: bool) -> bool:
        """(anchor, positive) rows without a negative column: an anchor's negatives are the other positives of
        its batch (every rank's, gathered). Scored pairs (CoSENT) and rows with their own negative do not."""
        return not labelled and "text_negative" not in columns

    def label_summary(self, labels: np.ndarray) -> str:
        scores = np.asarray(labels, dtype=np.float64)
        if not np.isfinite(scores).any():
            return "rows without scores (the other rows' positives are each anchor's negatives)"
        return f"pair scores {np.nanmin(scores):g}..{np.nanmax(scores):g}"


class EmbeddingRecipe(Recipe):
    """The training recipe of an embedding model."""

    recipe_settings: tuple[RecipeSetting, ...] = (MATRYOSHKA_DIMS, MINI_BATCH_SIZE, LORA_R)
    small_batches = True  # in-batch negatives and CoSENT's pairs of pairs: batch 16, sentence-transformers' default

    def training_defaults(self, num_labels: int) -> Mapping[str, Any]:
        """Measured on SICK against sentence-transformers' own training (docs/benchmarks.md). Rows (in-batch
        negatives) train at its recipe, its learning rate and the model's own dropout: byoc's classifier
        defaults (1e-4, dropout 0) ended 0.032 Spearman below it. Scored pairs (CoSENT, a score per pair as
        in regression) keep the classifier defaults: 0.0037 above it on average over four seeds (never more than
        0.0003 below), where its recipe was 0.006 below.
        The embeddings and bottom layer stay frozen as for every task: training them too gained 0.003 on
        scored pairs at 0.70x the speed."""
        return {} if num_labels else ROWS_DEFAULTS

    def model_kwargs(self) -> dict[str, Any]:
        return {}

    def head_summary(self, num_labels: int) -> str:
        return "sentence embeddings, " + ("scored pairs" if num_labels else "(anchor, positive) rows")

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
        """A sentence-transformers model and its loss: CoSENT for scored pairs (`label_names` names the score),
        else in-batch negatives (byoc.tasks.embedding.model)."""
        from byoc.tasks.embedding import model  # sentence-transformers and torch: only an embedding job imports them

        return model.build(
            path,
            bool(label_names),
            max_length,
            kwargs,
            overrides,
            trust_remote_code=trust_remote_code,
            world_size=world_size,
        )

    def describe(self, model: Any, args: Any, pairs: bool | None) -> None:
        """Nothing: the folder written is a sentence-transformers folder, which says what it is."""

    def encoder_of(self, model: Any) -> Any:
        from byoc.tasks.embedding.model import encoder_of  # (as training_model)

        return encoder_of(model)

    def apply_recipe(self, model: Any, settings: Mapping[str, Any]) -> None:
        """Matryoshka (the loss also over each of `matryoshka_dims` leading dimensions) and cached in-batch negatives
        (`mini_batch_size`): byoc.tasks.embedding.model."""
        from byoc.tasks.embedding import model as recipe  # (as training_model)

        if settings.get("lora_r"):
            recipe.train_low_rank(model, settings["lora_r"])
        if settings.get("matryoshka_dims"):
            recipe.train_leading_dimensions(model, settings["matryoshka_dims"])
        if settings.get("mini_batch_size"):
            recipe.cache_negatives(model, settings["mini_batch_size"])

    def collator(self, tokenizer: Any, pad_to_multiple_of: int | None) -> Any:
        return GroupCollator(tokenizer, pad_to_multiple_of)


class EmbeddingEvaluation(Evaluation):
    """The evaluation of an embedding model."""

    in_metric_definitions = False  # retrieval metrics: metric_definitions("embedding") gives them
    ranks_corpus = True
    metrics: tuple[str, ...] = (
        "spearman_cosine",
        "pearson_cosine",
        "mrr_at_10",
        "ndcg_at_10",
        "recall_at_1",
        "recall_at_10",
    )
    metric_notes = {
        "mrr_at_10": "each eval row's anchor ranks every row's positive by cosine; its own is the one relevant; "
        "equal scores rank in the order the rows are evaluated (shortest anchor first), as "
        "sentence-transformers' InformationRetrievalEvaluator ranks them by corpus id",
    }

    def corpus_evaluator(self) -> Any:
        return compat.dense_retrieval_evaluator()  # (its import path moved in sentence-transformers 6)

    def retriever_of(self, model: Any) -> Any:
        return model.model  # byoc.tasks.embedding.model.EmbeddingModel's SentenceTransformer (or SparseEncoder)

    def evaluate(
        self, logits: np.ndarray, labels: np.ndarray, names: list[str], cut: float | np.ndarray
    ) -> tuple[dict[str, float], dict[str, Any]]:
        """`logits`: each row's first and second vector side by side; `labels`: its score, NaN for none."""
        logits, labels = kept_rows(np.asarray(logits, dtype=np.float32), np.asarray(labels))
        scores = np.asarray(labels, dtype=np.float64).reshape(-1)
        if len(scores) and np.isfinite(scores).all():
            first, second = _halves(logits)
            correlation = regression_metrics((first * second).sum(axis=1), scores)
            return {"spearman_cosine": correlation["spearmanr"], "pearson_cosine": correlation["pearson"]}, {}
        width = logits.shape[1] // 2  # each row's two vectors as the model gave them: normalized as the evaluator does
        return retrieval_metrics(logits[:, :width], logits[:, width:]), {}

    def predictions(
        self, logits: np.ndarray, labels: np.ndarray, names: list[str], cuts: np.ndarray
    ) -> list[dict[str, Any]]:
        """Each test row's cosine between its two texts (and its score, where it has one)."""
        logits, labels = kept_rows(np.asarray(logits, dtype=np.float32), np.asarray(labels))
        first, second = _halves(logits)
        lines = []
        for cosine, label in zip((first * second).sum(axis=1), np.asarray(labels, dtype=np.float64).reshape(-1)):
            line = {"cosine": round(float(cosine), 6)}
            lines.append({"label": round(float(label), 6), **line} if np.isfinite(label) else line)
        return lines


class Embedding(Task):
    name = NAME
    aliases = ("embeddings", "sentence_embedding", "sentence_embeddings", "feature_extraction")
    described = "an embedding model"
    # The names a request's "output" may give the one output the model answers (a client naming it gets it):
    # byoc's, sentence-transformers' output_value and FlagEmbedding's result key.
    auto_class = "AutoModel"
    sentence_model_type = "SentenceTransformer"  # (also where an older folder's config leaves model_type out)
    head_class = EmbeddingHead
    rows_class = EmbeddingRows
    recipe_class = EmbeddingRecipe
    evaluation_class = EmbeddingEvaluation

    def load_torch(self, model_dir: Path, **kwargs: Any) -> tuple[Any, list[str]]:
        """The encoder; a pooler its checkpoint lacks is not missing (embeddings never use it)."""
        model, missing = super().load_torch(model_dir, **kwargs)
        return model, [key for key in missing if not key.startswith("pooler.")]

    def output_module(self, model: Any, model_dir: Path) -> Any:
        return pooled(model, sentence_folder.read(model_dir))

    def scores(self, logits: np.ndarray) -> np.ndarray:
        return np.asarray(logits, dtype=np.float32)


def _halves(logits: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The two unit vectors of each row (the training model gives both texts' vectors side by side)."""
    width = logits.shape[1] // 2
    return _unit(logits[:, :width]), _unit(logits[:, width:])


def _unit(vectors: np.ndarray) -> np.ndarray:
    return vectors / np.maximum(np.linalg.norm(vectors, axis=1, keepdims=True), NORM_EPS)


def dense_stack(specs: tuple[sentence_folder.Dense, ...]) -> Any:
    """The folder's Dense modules as one torch module (each a linear layer with its weights, then its activation),
    applied to the last axis: a text's vector here, each token's vector in a multi-vector model."""
    # Imported here: training's and the full image's (the slim serving image runs the exported graph).
    import torch

    activations = {
        "Identity": torch.nn.Identity,
        "Tanh": torch.nn.Tanh,
        "ReLU": torch.nn.ReLU,
        "GELU": torch.nn.GELU,
        "Sigmoid": torch.nn.Sigmoid,
    }

    def dense(spec: sentence_folder.Dense) -> torch.nn.Module:
        linear = torch.nn.Linear(spec.in_features, spec.out_features, bias=spec.bias)
        linear.load_state_dict({k.removeprefix("linear."): v for k, v in _dense_weights(spec.path).items()})
        return torch.nn.Sequential(linear, activations[spec.activation]())

    return torch.nn.Sequential(*(dense(spec) for spec in specs))


def pooled(model: Any, folder: sentence_folder.SentenceFolder) -> Any:
    """`model` (a transformers encoder) with the folder's pooling and Dense layers: token ids in, one
    vector per text out (not normalized). A torch module: exported into model.onnx, or served on torch."""
    import torch  # (as dense_stack)

    class Pooled(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.model = model
            self.dense = dense_stack(folder.dense)
            self.config = model.config

        def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, **rest: torch.Tensor) -> torch.Tensor:
            states = self.model(input_ids=input_ids, attention_mask=attention_mask, **rest).last_hidden_state
            vectors = torch.cat([pool(states, attention_mask, mode) for mode in folder.pooling], dim=-1)
            return self.dense(vectors)

    return Pooled().eval()


def pool(states: Any, mask: Any, mode: str) -> Any:
    """One pooling of (batch, length, width) token states over the tokens `mask` keeps, as
    sentence-transformers' Pooling computes it (right-padded batches)."""
    import torch  # (as `pooled`)

    keep = mask.unsqueeze(-1).to(states.dtype)
    if mode == "cls":
        return states[:, 0]
    if mode == "max":
        return torch.where(keep > 0, states, torch.full_like(states, -1e9)).max(dim=1).values
    if mode == "lasttoken":
        last = (mask.sum(dim=1) - 1).clamp(min=0)
        return states[torch.arange(states.shape[0]), last]
    if mode == "weightedmean":
        keep = keep * torch.arange(1, states.shape[1] + 1, dtype=states.dtype).view(1, -1, 1)
    total = (states * keep).sum(dim=1)
    count = keep.sum(dim=1).clamp(min=1e-9)
    return total / count.sqrt() if mode == "mean_sqrt_len" else total / count


def _dense_weights(folder: Path) -> dict[str, Any]:
    import torch  # (as `pooled`)

    if (folder / "model.safetensors").is_file():
        from safetensors.torch import load_file  # (as `pooled`)

        return load_file(str(folder / "model.safetensors"))
    if (folder / "pytorch_model.bin").is_file():
        return torch.load(str(folder / "pytorch_model.bin"), map_location="cpu", weights_only=True)
    raise sentence_folder.FolderError(f"{folder}: a Dense module without its weights (model.safetensors)")
