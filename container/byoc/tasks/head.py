"""A task's serving head: what byoc serve computes from the backend's outputs for it, NumPy only (the request
parameters it takes, the kinds of answer it gives, long texts in windows, the answer itself). byoc.serving reads
a task's head through these members alone (tests/test_architecture.py)."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from byoc.tasks.common import BadParameter, Part
from byoc.tasks.kinds import Kind


class Head(Part):
    """The serving head of a `Task` (byoc.tasks.base), with a whole-text classifier's defaults."""

    parameters: tuple[str, ...] = ()  # the request parameters byoc's predict_fn takes for it
    rerank_parameters: tuple[str, ...] = ()  # those of them a rerank body may carry (in its "parameters")
    # Reads every token of a text, a long one in windows (`windows`), never cut at max_length: a request's
    # characters are its work (serving's text limit and long-text steps apply).
    whole_texts = False
    # The kinds of answer it gives (byoc.tasks.kinds: what the wire writes and the client routes answer, by kind),
    # each with the request parameters that ask for it (a hybrid model's "output"); the first is its default.
    kinds: Mapping[Kind, Mapping[str, Any]] = {Kind.LABELS: {}}

    def kind_of(self, parameters: Mapping[str, Any]) -> Kind:
        """The kind of each input's answer to a request with these (checked) `parameters`."""
        return next(iter(self.kinds))

    def serving_facts(self, model_dir: Path, config: dict[str, Any]) -> dict[str, Any]:
        """What serving keeps beside the model from its folder (`config`: its config.json, read once), for
        `prepare`, `answer` and `relevance`."""
        return {}

    def relevance(self, row: np.ndarray, raw: bool, model: Mapping) -> float:
        """A (query, text) pair's relevance for a rerank request, from its `scores` row (`raw`: before the
        activation that makes it a probability)."""
        raise BadParameter(f"{self.task.described} does not rerank: a reranker has one output or two labels")

    def check_rerank(self, model: Mapping) -> None:
        """BadParameter where the loaded `model` answers no rerank request (checked before it runs)."""
        raise BadParameter(
            f'{self.task.described} does not rerank: a rerank request ({{"query", "texts"}}) needs a cross-encoder '
            "(a pair classifier with one output or two labels)"
        )

    def check_shape(self, shape: str | None) -> None:
        """BadParameter where the task answers no body of this form (byoc.serving.protocol.bodies: "rerank" is
        checked against the loaded model by `check_rerank`; "openai", an OpenAI embeddings body, needs vectors)."""
        if shape == "openai":
            raise BadParameter(f"an OpenAI embeddings request needs an embedding model; this is {self.task.described}")

    def check_values(self, parameters: Mapping[str, Any]) -> None:
        """BadParameter for a value of one of the task's `parameters` that no model of it takes (checked when
        the body is read, before the model is known)."""

    def window_encoder(self, tokenizer: Any, limit: int, names: list[str]) -> Any:
        """texts -> each text's windows of at most `limit` tokens, for a task that reads a text whole (every
        window of a long one: `windows`); None for one that cuts each text at `limit`. `tokenizer`: a
        `tokenizers.Tokenizer`; `names`: the model's inputs."""
        return None

    def windows(self, inputs: list[Any], parameters: Mapping[str, Any], model: Mapping) -> Any:
        """A request the task reads whole, window by window: an object with `encode()`, `feeds` (each window's
        model inputs, after encode) and `answers(scores)` (scores: each window's `scores`, a row per token).
        None: the task's answers come from one pass of each text, cut at max_length (`prepare`, `answer`)."""
        return None

    def prepare(self, inputs: list[Any], parameters: Mapping[str, Any], model: Mapping) -> list[Any]:
        """The inputs as the model reads them (an embedding model's prompt before each text)."""
        return inputs

    def encoded(
        self, encoded: list[dict[str, list[int]]], parameters: Mapping[str, Any], model: Mapping
    ) -> list[dict[str, list[int]]]:
        """The prepared inputs' encodings (the model's `encode`), as the model reads them (a template's tail written
        back where a text was cut)."""
        return encoded

    def answer(
        self, scores: list[np.ndarray], id2label: Mapping[int, str], parameters: Mapping[str, Any], model: Mapping
    ) -> list[Any]:
        """Each input's answer from its `scores`, given the request's `parameters` (checked) and the loaded
        `model` (the default model_fn's dict: what config.json saved beside the weights)."""
        raise NotImplementedError
