"""A tag per token (NER): words in, entities out. Trained on each word's first sub-token (or all of them:
`label_all_tokens`, saved as config.json's `byoc_word_tags`, which picks serving's default grouping),
scored by entity (seqeval's rules), answered as the transformers pipeline's entities
(byoc.tasks.token_classification.head)."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from byoc import model_folder
from byoc.tasks.base import IGNORE_LABEL, Task
from byoc.tasks.evaluation import Evaluation
from byoc.tasks.head import Head
from byoc.tasks.kinds import Kind
from byoc.tasks.recipe import Recipe
from byoc.tasks.rows import Rows
from byoc.tasks.token_classification import head
from byoc.tasks.token_classification.head import DEFAULT_STRATEGY, default_strategy  # noqa: F401

NAME = "token_classification"


class TokenClassificationHead(Head):
    """The serving head of a token classifier."""

    kinds: Mapping[Kind, Mapping[str, Any]] = {Kind.ENTITIES: {}}  # (no client route answers entities)
    parameters = ("aggregation_strategy",)
    whole_texts = True

    def serving_facts(self, model_dir: Path, config: dict[str, Any]) -> dict[str, Any]:
        """The entities' grouping where a request names none, from how training tagged words' sub-tokens."""
        return {"aggregation": default_strategy(model_folder.word_tags_of(config))}

    def check_values(self, parameters: Mapping[str, Any]) -> None:
        head.check_strategy(parameters.get("aggregation_strategy"))

    def window_encoder(self, tokenizer: Any, limit: int, names: list[str]) -> Any:
        return head.window_encoder(tokenizer, limit, names)

    def windows(self, inputs: list[Any], parameters: Mapping[str, Any], model: Mapping) -> Any:
        """Every window of every text: a long text is covered whole, never cut (.entities)."""
        return head.Windowed(inputs, parameters, model)


class TokenClassificationRows(Rows):
    """The training rows of a token classifier."""

    row_unit = "sentences"

    def encoder(
        self, tokenizer: Any, max_length: int, padding: Any, label_names: list[str], label_all_tokens: bool, train: bool
    ) -> Any:
        """Words -> tags on their sub-tokens. Training covers a long sentence in windows (no word goes unlearned);
        evaluation cuts it, as the predictions are one row per sentence, and says how much was cut."""
        from byoc.tasks.token_classification.tagging import tag_encoder  # (kept apart: training's alone)

        return tag_encoder(tokenizer, max_length, padding, label_names, label_all_tokens, windows=train)


class TokenClassificationRecipe(Recipe):
    """The training recipe of a token classifier."""

    small_batches = True  # wnut17, 1 epoch: entity F1 0.014 at batch 32, 0.271 at 16

    def model_kwargs(self) -> dict[str, Any]:
        return {}  # transformers' problem_type names sequence tasks only; a token classifier is its own class

    def configure(self, config: Any, args: Any) -> None:
        """Which sub-tokens learned a word's tag: serving groups words the same way."""
        setattr(config, model_folder.WORD_TAGS_KEY, "all" if args.label_all_tokens else "first")

    def collator(self, tokenizer: Any, pad_to_multiple_of: int | None) -> Any:
        from transformers import DataCollatorForTokenClassification  # training's: serving has no transformers

        return DataCollatorForTokenClassification(tokenizer, pad_to_multiple_of=pad_to_multiple_of)  # labels: -100


class TokenClassificationEvaluation(Evaluation):
    """The evaluation of a token classifier."""

    metrics = ("precision", "recall", "f1", "accuracy")  # over entities (accuracy: over tokens)

    def evaluate(
        self, logits: np.ndarray, labels: np.ndarray, names: list[str], cut: float | np.ndarray
    ) -> tuple[dict[str, float], dict[str, Any]]:
        # A label per token: padding, special tokens and filler rows hold IGNORE_LABEL.
        metrics, per_type = token_metrics(*tag_sequences(logits, labels, names))
        return metrics, {"f1_per_type": per_type}

    def predictions(
        self, logits: np.ndarray, labels: np.ndarray, names: list[str], cuts: np.ndarray
    ) -> list[dict[str, Any]]:
        """Each sentence's tags and predicted tags, one per word (as far as max_length reached)."""
        true, predicted = tag_sequences(np.asarray(logits), np.asarray(labels), names)
        return [{"tags": t, "predicted": p} for t, p in zip(true, predicted)]


class TokenClassification(Task):
    name = NAME
    aliases = ("token", "ner")
    described = "a token classifier"
    auto_class = "AutoModelForTokenClassification"
    output_axes = {0: "batch", 1: "length"}  # a row of tag logits per token
    head_class = TokenClassificationHead
    rows_class = TokenClassificationRows
    recipe_class = TokenClassificationRecipe
    evaluation_class = TokenClassificationEvaluation

    def tokenizer_problem(self, fast: bool) -> str | None:
        if fast:
            return None
        return "a token classifier needs a fast tokenizer (tokenizer.json) to put each word's tag on its sub-tokens"


def entities(tags: list[str]) -> set[tuple[str, int, int]]:
    """The (type, first, last) entity chunks of an IOB tag sequence, as seqeval's default mode (the
    conlleval script's rules) reads them: a chunk ends at O, at a B-, or where the type changes; an
    I- after O or after another type starts one."""
    found, kind, start = set(), None, 0
    for i, tag in enumerate([*tags, "O"]):
        bi, this = (tag[0], tag[2:]) if tag != "O" else ("O", None)
        if kind is not None and (bi in ("O", "B") or this != kind):
            found.add((kind, start, i - 1))
            kind = None
        if bi != "O" and (bi == "B" or kind is None):
            kind, start = this, i
    return found


def token_metrics(true: list[list[str]], predicted: list[list[str]]) -> tuple[dict[str, float], dict[str, float]]:
    """(metrics, per-type F1) of tag sequences: entity-level precision, recall and F1 pooled over
    every entity (seqeval's micro average), and token accuracy."""
    gold = {(row, *e) for row, tags in enumerate(true) for e in entities(tags)}
    guess = {(row, *e) for row, tags in enumerate(predicted) for e in entities(tags)}
    hit = gold & guess
    kinds = sorted({e[1] for e in gold | guess})
    per_type = {}
    for kind in kinds:
        g, p, h = (sum(e[1] == kind for e in group) for group in (gold, guess, hit))
        per_type[kind] = round(2 * h / (g + p), 6) if g + p else 0.0
    precision = len(hit) / len(guess) if guess else 0.0
    recall = len(hit) / len(gold) if gold else 0.0
    tokens = sum(len(t) for t in true)
    metrics = {
        "precision": precision,
        "recall": recall,
        "f1": 2 * precision * recall / (precision + recall) if precision + recall else 0.0,
        "accuracy": sum(a == b for t, p in zip(true, predicted) for a, b in zip(t, p)) / tokens if tokens else 0.0,
    }
    return metrics, per_type


def tag_sequences(logits: np.ndarray, labels: np.ndarray, names: list[str]) -> tuple[list[list[str]], list[list[str]]]:
    """(true, predicted) tag names of each row, at the positions that carry a label (a word's first
    sub-token; never padding or special tokens, which hold IGNORE_LABEL)."""
    predicted_ids = np.asarray(logits).argmax(axis=-1)
    true, predicted = [], []
    for row, ids in zip(labels, predicted_ids):
        keep = np.flatnonzero(row != IGNORE_LABEL)
        true.append([names[int(row[k])] for k in keep])
        predicted.append([names[int(ids[k])] for k in keep])
    return true, predicted
