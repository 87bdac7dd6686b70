"""A reranker trained as sentence-transformers' CrossEncoder trainer trains one: a (query, document) pair in, one
relevance logit out, binary cross-entropy against a 0/1 label (its `BinaryCrossEntropyLoss`).

Trained from an embedding model's data: (query, positive[, negative]) rows, each row giving a positive pair
(label 1) and, per negative, a negative pair (label 0); the negatives given, or mined before training with an
embedding model (`mine_hard_negatives=true`: byoc.training.negatives); or from pairs with a 0..1 relevance
(`query, document, label`). Evaluated as sentence-transformers' CrossEncoderClassificationEvaluator scores
binary pairs: accuracy and F1 at a probability of 0.5, and average precision over every pair.

Saved as a transformers sequence classifier with one output: sentence-transformers' `CrossEncoder` loads the
folder as it is (a sigmoid over the logit, its default for one output) and `byoc serve` serves it as it serves
any one-output cross-encoder (byoc.tasks.regression: the rerank body, pairs).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from byoc import sentence_folder
from byoc.tasks.base import BadParameter, kept_rows
from byoc.tasks.regression import Regression, RegressionEvaluation, RegressionHead, RegressionRecipe, RegressionRows

NAME = "reranker"


class RerankerHead(RegressionHead):
    """The serving head of a reranker (cross-encoder)."""

    def check_rerank(self, model: Mapping) -> None:
        """One output: a model of more (a two-label pair classifier, served with BYOC_TASK naming this task) is
        refused rather than scored by its first logit."""
        outputs = len(model.get("id2label") or {}) or 1
        if outputs != 1:
            raise BadParameter(
                f"{self.task.described} has one output (a relevance logit); this model has {outputs}: serve it without "
                "BYOC_TASK (a two-label pair classifier reranks by its second label's probability)"
            )
        super().check_rerank(model)


class RerankerRows(RegressionRows):
    """The training rows of a reranker (cross-encoder)."""

    row_unit = "(query, document) pairs"
    evaluates_negatives = True  # an eval row's negative is an irrelevant pair
    several_negatives = True  # each becomes a pair of its own (num_negatives)
    mined_by = "embedding"  # an embedding model mines its negatives (a cross-encoder cannot index a corpus)

    def takes_mined_negatives(self, columns: list[str], labelled: bool) -> bool:
        return not labelled and "text_negative" not in columns

    def pairs_of_rows(self, table: Any, split: str) -> Any:
        """An embedding model's rows as this task's pairs: (text, text_pair, label) with label 1 for each positive
        and 0 for each negative; scored pairs keep their score, which must be a relevance in 0..1."""
        import datasets  # training's (as row_loss)

        scores = np.asarray(table["label"], dtype=np.float64)
        scored = np.isfinite(scores)
        if scored.any():
            if (scores[scored] < 0).any() or (scores[scored] > 1).any():
                raise BadParameter(
                    f"the {split} pairs' scores run {scores[scored].min():g}..{scores[scored].max():g}, and a "
                    "reranker learns a relevance from 0 to 1 (binary cross-entropy): scale them to 0..1, or train "
                    "task=regression"
                )
            return table
        texts, others, labels = [], [], []
        # text_negative, then text_negative_2... (num_negatives mined a row: byoc.training.negatives), None past a
        # row's own
        columns = sorted((c for c in table.column_names if c.startswith("text_negative")), key=lambda c: (len(c), c))
        negatives = list(zip(*(table[c] for c in columns))) if columns else [()] * len(table)
        for query, positive, own in zip(table["text"], table["text_pair"], negatives):
            for document, label in ((positive, 1.0), *((negative, 0.0) for negative in own)):
                if document is not None:
                    texts.append(query)
                    others.append(document)
                    labels.append(label)
        if split == "train" and min(labels, default=1.0) == 1.0:
            raise BadParameter(
                "the train rows have no negative, and a reranker learns from negatives: set mine_hard_negatives=true "
                "(an embedding model mines one for each row), or add a negative column"
            )
        features = datasets.Features(
            text=datasets.Value("string"), text_pair=datasets.Value("string"), label=datasets.Value("float32")
        )
        return datasets.Dataset.from_dict({"text": texts, "text_pair": others, "label": labels}, features=features)

    def label_summary(self, labels: np.ndarray) -> str:
        values = np.asarray(labels, dtype=np.float64).reshape(-1)
        return f"{int((values >= 0.5).sum())} relevant and {int((values < 0.5).sum())} irrelevant pairs"


class RerankerRecipe(RegressionRecipe):
    """The training recipe of a reranker (cross-encoder)."""

    def head_summary(self, num_labels: int) -> str:
        return "one relevance logit (binary cross-entropy)"

    def row_loss(self, logits: Any, labels: Any) -> Any:
        """sentence-transformers' BinaryCrossEntropyLoss for a cross-encoder, a loss a row."""
        import torch  # training's: serving imports tasks without torch on the slim image

        rows = labels.shape[0]
        return torch.nn.functional.binary_cross_entropy_with_logits(
            logits.float().reshape(rows), labels.float().reshape(rows).clamp(0, 1), reduction="none"
        )

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
        """A sequence classifier's; a generative reranker's folder is refused (a fresh classification head would
        replace the yes/no logits it was trained to give)."""
        if sentence_folder.LOGIT_SCORE in sentence_folder.module_kinds(Path(path)):
            raise BadParameter(
                f"{path} is a generative reranker (a decoder scored by its {sentence_folder.LOGIT_SCORE}): train it "
                "with task=generative_reranker, which keeps its yes/no head (lora_r for adapters)"
            )
        return super().training_model(path, label_names, kwargs, overrides, trust_remote_code, max_length, world_size)


class RerankerEvaluation(RegressionEvaluation):
    """The evaluation of a reranker (cross-encoder)."""

    in_metric_definitions = False  # metric_definitions("reranker") gives them
    metrics: tuple[str, ...] = ("accuracy", "f1", "average_precision")
    ranks_corpus = True  # an embedding model's top 100 (byoc.training.corpus_evaluation: corpus_evaluator is None)

    def corpus_evaluator(self) -> Any:
        return None  # it reorders an embedding model's top documents (byoc.training.corpus_evaluation)

    def retriever_of(self, model: Any) -> Any:
        return model  # the cross-encoder itself: it scores the pairs an embedding model retrieved

    def evaluate(
        self, logits: np.ndarray, labels: np.ndarray, names: list[str], cut: float | np.ndarray
    ) -> tuple[dict[str, float], dict[str, Any]]:
        """Binary metrics of the pairs, as CrossEncoderClassificationEvaluator computes them (a label of 0.5 or
        more is relevant)."""
        from sklearn.metrics import average_precision_score  # (as row_loss; sentence-transformers' dependency)

        logits, labels = kept_rows(np.asarray(logits, dtype=np.float64), np.asarray(labels))
        scores = logits.reshape(-1)
        relevant = np.asarray(labels, dtype=np.float64).reshape(-1) >= 0.5
        predicted = scores >= 0.0  # a probability of 0.5
        hits = int((predicted & relevant).sum())
        wrong = int((predicted != relevant).sum())
        return {
            "accuracy": float((predicted == relevant).mean()) if len(scores) else 0.0,
            "f1": 2 * hits / (2 * hits + wrong) if hits else 0.0,
            "average_precision": float(average_precision_score(relevant, scores)) if relevant.any() else 0.0,
        }, {}

    def prediction(self, row: np.ndarray, label: np.ndarray, names: list[str], cuts: np.ndarray) -> dict[str, Any]:
        logit = float(row.reshape(-1)[0])
        return {"label": round(float(label.reshape(-1)[0]), 6), "score": round(float(1 / (1 + np.exp(-logit))), 6)}


class Reranker(Regression):
    name = NAME
    aliases: tuple[str, ...] = ("cross_encoder", "rerank", "reranking")
    described = "a reranker (cross-encoder)"
    head_class = RerankerHead
    rows_class = RerankerRows
    recipe_class = RerankerRecipe
    evaluation_class = RerankerEvaluation
