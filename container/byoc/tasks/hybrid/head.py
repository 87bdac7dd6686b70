"""A hybrid model's serving head: each text's dense vector, term weights and token vectors cut out of the one
output row per token the model gives (byoc.tasks.hybrid.Hybrid.output_module), and a pair's scores, as
FlagEmbedding's BGEM3FlagModel computes them.

The model's output, per text, a row per token (`OFFSET` + dense width + ColBERT width wide):
- column 0: the token's term weight (ReLU of the sparse head), every position;
- row 0 (the first token, [CLS] or <s>): the dense vector (normalised) in the dense columns;
- rows 1 on: the token's ColBERT vector (normalised) in the ColBERT columns, the others 0.

A text's term weights become `[{"index", "value"}]` (TEI's embed_sparse form): each vocabulary id's largest
weight over the text's tokens, above 0, leaving out the tokenizer's [CLS]/<s>, end, padding and unknown tokens
(what BGEM3FlagModel leaves out). A pair's scores: the dense vectors' dot product, the term weights' dot product
(the shared terms'), and MaxSim averaged over the query's token vectors; `weights` combine them as
`compute_score`'s `weights_for_different_modes` do: a weighted mean.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import numpy as np

from byoc.tasks.base import BadParameter
from byoc.tasks.limits import check_answer
from byoc.tasks.multi_vector.head import TokenEncoder, maxsim
from byoc.tasks.sparse_embedding import vocabulary_of

OFFSET = 1  # the term weight's column
MODES = ("dense", "sparse", "colbert")  # FlagEmbedding's order (`weights_for_different_modes`)
DEFAULT_OUTPUT = "dense"  # what Text Embeddings Inference answers for bge-m3: its dense vectors
# Other names a client may know an output by: FlagEmbedding's result keys and byoc's other families'.
SYNONYMS = {
    "dense_vecs": "dense",
    "sentence_embedding": "dense",
    "lexical_weights": "sparse",
    "colbert_vecs": "colbert",
    "token_embeddings": "colbert",
}


def outputs_of(value: Any) -> tuple[list[str], bool]:
    """The outputs a request asks for (`"output"`: one name, or a list of them) and whether it named a list
    (each text then answers an object, an entry an output)."""
    if value is None:
        return [DEFAULT_OUTPUT], False
    names = value if isinstance(value, list) else [value]
    if not names or not all(isinstance(name, str) and SYNONYMS.get(name, name) in MODES for name in names):
        raise BadParameter(
            f'"output" is one of {", ".join(MODES)}, or a list of them (a text then answers each); got {value!r}'
        )
    return list(dict.fromkeys(SYNONYMS.get(str(name), str(name)) for name in names)), isinstance(value, list)


def weights_of(value: Any) -> dict[str, float]:
    """A pair score's weights: `{"dense": w, "sparse": w, "colbert": w}` (a mode left out weighs 0) or
    FlagEmbedding's `[dense, sparse, colbert]`; each mode 1 where the request gives none, as compute_score. Returned
    as fractions of their sum (a weighted mean's), computed so that no weight's size changes the mean: [5e-324, 0, 0]
    weighs as [1, 0, 0], and a number too large for a float is refused, never a 500."""
    if value is None:
        return dict.fromkeys(MODES, 1.0 / len(MODES))
    if isinstance(value, list) and len(value) == len(MODES):
        value = dict(zip(MODES, value))
    weights = _numbers(value) if isinstance(value, dict) and set(value) <= set(MODES) else None
    if weights is not None and all(math.isfinite(w) and w >= 0 for w in weights.values()) and any(weights.values()):
        largest = max(weights.values())
        scaled = {mode: weights.get(mode, 0.0) / largest for mode in MODES}  # (1 at most: the sum cannot overflow)
        total = sum(scaled.values())
        return {mode: w / total for mode, w in scaled.items()}
    raise BadParameter(
        '"weights" weighs a pair\'s dense, sparse and colbert scores: {"dense": 0.4, "sparse": 0.2, "colbert": 0.4} '
        f"or [0.4, 0.2, 0.4], finite numbers of at least 0, not all 0; got {_shown(value)}"
    )


def _numbers(value: dict[str, Any]) -> dict[str, float] | None:
    """The weights as floats; None where one is no number or too large for a float (a 401-digit integer)."""
    if not all(isinstance(w, (int, float)) and not isinstance(w, bool) for w in value.values()):
        return None
    try:
        return {mode: float(w) for mode, w in value.items()}
    except OverflowError:
        return None


def _shown(value: Any) -> str:
    """The value in the message, cut short (a 401-digit number is not repeated whole)."""
    text = repr(value)
    return text if len(text) <= 120 else text[:117] + "..."


class Text:
    """One text's outputs, cut from its rows (a row per token) and its token ids."""

    def __init__(self, rows: np.ndarray, ids: list[int], facts: Mapping[str, Any]) -> None:
        width = int(facts["dense_width"])
        self.dense = rows[0, OFFSET : OFFSET + width]
        self.colbert = rows[1:, OFFSET + width :]
        unused = set(facts["unused_ids"])
        terms: dict[int, float] = {}
        for token, weight in zip(ids, rows[:, 0].tolist()):
            if weight > 0 and token not in unused and weight > terms.get(token, 0.0):
                terms[token] = weight
        self.terms = dict(sorted(terms.items()))

    def values(self, output: str) -> int:
        """The numbers `answer(output)` holds (a term: its index and value)."""
        if output == "dense":
            return int(self.dense.size)
        if output == "colbert":
            return int(self.colbert.size)
        return 2 * len(self.terms)

    def answer(self, output: str, vocabulary: Mapping[int, str] | None) -> Any:
        if output == "dense":
            return self.dense.astype(np.float32).tolist()
        if output == "colbert":
            return self.colbert.astype(np.float32).tolist()
        terms: list[dict[str, Any]] = []
        for index, value in self.terms.items():
            term: dict[str, Any] = {"index": index, "value": float(np.float32(value))}
            if vocabulary is not None:
                term["token"] = vocabulary.get(index, "")
            terms.append(term)
        return terms


def scores(query: Text, text: Text) -> dict[str, float]:
    """A pair's three scores, as BGEM3FlagModel's compute_score gives them (its colbert over the query's real
    tokens: a batch's padding scores nothing)."""
    sparse = sum(weight * text.terms[token] for token, weight in query.terms.items() if token in text.terms)
    return {
        "dense": float(query.dense.astype(np.float32) @ text.dense.astype(np.float32)),
        "sparse": float(sparse),
        "colbert": maxsim(query.colbert, text.colbert, mean=True),
    }


class HybridRequest:
    """One request: `encode()` tokenizes its texts (each distinct text once), the serving room runs `feeds`
    through the model, and `answers(rows)` gives each input's answer: a text's outputs, or a pair's score."""

    def __init__(self, inputs: list[Any], parameters: Mapping[str, Any], model: Mapping[str, Any]) -> None:
        self.facts: Mapping[str, Any] = model["hybrid"]
        self.encoder: TokenEncoder = model["windows"]
        self.model = model
        self.outputs, self.several = outputs_of(parameters.get("output"))
        self.return_tokens = bool(parameters.get("return_tokens"))
        self.weights = weights_of(parameters.get("weights"))
        if any(not isinstance(item, str) for item in inputs):
            self.pairs: list[tuple[str, str]] | None = [_pair(index, item) for index, item in enumerate(inputs)]
            self.texts = list(dict.fromkeys(text for pair in self.pairs for text in pair))
        else:
            self.pairs, self.texts = None, list(inputs)
        self.feeds: list[dict[str, list[int]]] = []

    def encode(self) -> None:
        names = self.encoder.names
        for encoding in self.encoder.encode(self.texts, self.encoder.limit):
            columns = {"input_ids": encoding.ids, "attention_mask": encoding.attention_mask}
            self.feeds.append({name: list(columns.get(name, encoding.type_ids)) for name in names})

    def answers(self, rows: list[np.ndarray]) -> list[Any]:
        texts = {
            text: Text(row, feed["input_ids"], self.facts) for text, row, feed in zip(self.texts, rows, self.feeds)
        }
        if self.pairs is not None:
            return [self.score(texts[query], texts[text]) for query, text in self.pairs]
        check_answer(
            sum(texts[text].values(name) for text in self.texts for name in self.outputs),
            self.model,
            f"{', '.join(self.outputs)} for each text",
            'fewer or shorter texts, or fewer outputs ("output": "dense" answers one vector a text)',
        )
        vocabulary = vocabulary_of(self.model) if self.return_tokens else None
        if not self.several:
            return [texts[text].answer(self.outputs[0], vocabulary) for text in self.texts]
        return [{name: texts[text].answer(name, vocabulary) for name in self.outputs} for text in self.texts]

    def score(self, query: Text, text: Text) -> float:
        """The pair's scores weighted as `weights` says: their weighted mean."""
        found = scores(query, text)
        return sum(self.weights[mode] * found[mode] for mode in MODES)  # (the weights sum to 1)


def _pair(index: int, item: Any) -> tuple[str, str]:
    if isinstance(item, (list, tuple)) and len(item) == 2 and all(isinstance(text, str) for text in item):
        return item[0], item[1]
    raise BadParameter(f"input {index}: a hybrid model scores (query, text) pairs or encodes texts; send one kind")
