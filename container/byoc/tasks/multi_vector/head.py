"""A multi-vector model's serving head: each text tokenized as a query or a document the way sentence-
transformers' Transformer and MultiVectorMask modules do it, and the answers from the model's token vectors.

- The side's prompt (the folder's "query" or "document" prompt) goes before the text, which is cut at the
  side's length (`query_length`, `document_length`; else the model's).
- Query expansion (queries only): a query shorter than the expansion length is padded up to it with the
  expansion token (the folder's, else [MASK] or <mask>, else an end-of-sequence token, as sentence-
  transformers falls back), attended to only where the folder says `attend`; "fixed" cuts a query at that
  length, "min" only pads. Those positions are scored: MaxSim reads their vectors.
- The skiplist (documents by default): tokens of the folder's `skiplist_words` are left out of the answer and
  of the scoring.

A request's texts answer their vectors, `[[float, ...], ...]` each; a request of (query, text) pairs (a rerank
body) answers each pair's MaxSim: for each query vector its largest dot product with the text's vectors, summed
(divided by the number of query vectors for `meanmaxsim`). Each distinct text is encoded once.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from typing import Any

import numpy as np
from tokenizers import Tokenizer

from byoc.tasks.base import BadParameter
from byoc.tasks.limits import check_answer

SIDES = ("query", "document")
DEFAULT_SIDE = "document"  # what an index is built from; a query asks with "prompt_name": "query"
EXPANSION_TOKENS = ("[MASK]", "<mask>")  # the tokenizer's mask token, found by name
END_TOKENS = ("</s>", "<|endoftext|>", "<eos>", "[SEP]")  # else its end of sequence (decoders have no mask)


class TokenEncoder:
    """The loaded model's tokenizer, cutting at a length a call names (a copy for each length, made once):
    `encode(texts, max_length)`, and the token ids the head looks up."""

    def __init__(self, tokenizer: Tokenizer, limit: int, names: list[str]) -> None:
        self.base = Tokenizer.from_str(tokenizer.to_str())  # a copy: truncation is the tokenizer's state
        self.base.no_padding()
        self.base.no_truncation()
        self.limit, self.names = limit, names
        self._cut: dict[int, Tokenizer] = {}
        self._lock = threading.Lock()

    def encode(self, texts: list[str], max_length: int) -> list[Any]:
        with self._lock:
            if max_length not in self._cut:
                cut = Tokenizer.from_str(self.base.to_str())
                cut.enable_truncation(max_length)
                self._cut[max_length] = cut
            tokenizer = self._cut[max_length]
        return tokenizer.encode_batch(texts)

    def token_id(self, token: str) -> int | None:
        return self.base.token_to_id(token)

    def expansion_id(self, token: str | None) -> int:
        """The id of the expansion token: the folder's, else the mask token, else an end token."""
        candidates = (token,) if token else (*EXPANSION_TOKENS, *END_TOKENS)
        for name in candidates:
            found = self.token_id(name)
            if found is not None:
                return found
        raise BadParameter(f"the tokenizer has none of the query expansion tokens {', '.join(candidates)}")


class LateInteraction:
    """One request: `encode()` tokenizes its texts, the serving room runs `feeds` through the model, and
    `answers(scores)` (each feed's token vectors, `feeds`' order) gives each input's answer."""

    def __init__(self, inputs: list[Any], parameters: Mapping[str, Any], model: Mapping[str, Any]) -> None:
        self.settings: dict[str, Any] = model["multi_vector"]
        self.model = model
        self.encoder: TokenEncoder = model["windows"]
        self.pairs = [_pair(index, item) for index, item in enumerate(inputs)] if _any_pair(inputs) else None
        if self.pairs is not None:
            self.texts = list(
                dict.fromkeys([(q, "query") for q, _ in self.pairs] + [(d, DEFAULT_SIDE) for _, d in self.pairs])
            )
        else:
            side = parameters.get("prompt_name") or DEFAULT_SIDE
            for index, text in enumerate(inputs):
                if not isinstance(text, str):
                    raise BadParameter(
                        f"input {index}: a multi-vector model encodes texts, or scores (query, text) pairs"
                    )
            self.texts = [(text, side) for text in inputs]
        self.encoded: list[tuple[dict[str, list[int]], np.ndarray]] = []

    def encode(self) -> None:
        by_text: dict[tuple[str, str], tuple[dict[str, list[int]], np.ndarray]] = {}
        for side in SIDES:
            texts = [text for text, s in self.texts if s == side]
            if texts:
                by_text.update(zip([(t, side) for t in texts], encode_side(self.encoder, self.settings, texts, side)))
        self.encoded = [by_text[key] for key in self.texts]

    @property
    def feeds(self) -> list[dict[str, list[int]]]:
        return [feeds for feeds, _ in self.encoded]

    def answers(self, scores: list[np.ndarray]) -> list[Any]:
        if self.pairs is None and scores:  # token vectors: counted before any is made (324 MB of JSON in one answer)
            width = int(scores[0].shape[-1])
            check_answer(
                sum(int(keep.sum()) for _, keep in self.encoded) * width,
                self.model,
                f"a {width}-wide vector a token",
                'fewer or shorter texts (or "truncate" them to fewer tokens)',
            )
        vectors = {key: rows[keep] for key, rows, (_, keep) in zip(self.texts, scores, self.encoded)}
        if self.pairs is None:
            return [vectors[key].tolist() for key in self.texts]
        mean = self.settings["similarity"] == "meanmaxsim"
        return [maxsim(vectors[(q, "query")], vectors[(d, DEFAULT_SIDE)], mean) for q, d in self.pairs]


def encode_side(
    encoder: TokenEncoder, settings: Mapping[str, Any], texts: list[str], side: str
) -> list[tuple[dict[str, list[int]], np.ndarray]]:
    """Each text's model inputs (`encoder.names`) as a `side` ("query" or "document"), and which of its
    positions are scored (its vectors in the answer)."""
    expansion = settings["query_expansion"] if side == "query" else None
    length = settings[f"{side}_length"]
    cut = length or encoder.limit
    if expansion is not None:
        cut = (
            expansion["length"]
            if expansion["strategy"] == "fixed"
            else max(length or encoder.limit, expansion["length"])
        )
    cut = min(cut, encoder.limit)
    prompt = settings["prompts"].get(side, "")
    skipped = skip_ids(encoder, settings) if side in settings["skiplist_tasks"] else set()
    out = []
    for encoding in encoder.encode([prompt + text for text in texts], cut):
        ids, attention, types = list(encoding.ids), list(encoding.attention_mask), list(encoding.type_ids)
        if expansion is not None and len(ids) < expansion["length"]:
            extra = expansion["length"] - len(ids)
            ids += [encoder.expansion_id(expansion["token"])] * extra
            attention += [1 if expansion["attend"] else 0] * extra
            types += [0] * extra
        keep = np.array([token not in skipped for token in ids], dtype=bool)
        columns = {"input_ids": ids, "attention_mask": attention, "token_type_ids": types}
        out.append(({name: columns[name] for name in encoder.names}, keep))
    return out


def skip_ids(encoder: TokenEncoder, settings: Mapping[str, Any]) -> set[int]:
    """The skiplist's token ids; a word that is no single token of the vocabulary is left out (sentence-
    transformers drops it rather than skip every unknown token)."""
    found = (encoder.token_id(word) for word in settings["skiplist_words"])
    return {token for token in found if token is not None}


def maxsim(query: np.ndarray, text: np.ndarray, mean: bool = False) -> float:
    """Late interaction: each query vector's best dot product with the text's vectors, summed (or averaged)."""
    if len(query) == 0 or len(text) == 0:
        return 0.0
    best = (query.astype(np.float32) @ text.astype(np.float32).T).max(axis=1)
    return float(best.mean() if mean else best.sum())


def _any_pair(inputs: list[Any]) -> bool:
    return any(not isinstance(item, str) for item in inputs)


def _pair(index: int, item: Any) -> tuple[str, str]:
    if isinstance(item, (list, tuple)) and len(item) == 2 and all(isinstance(text, str) for text in item):
        return item[0], item[1]
    raise BadParameter(
        f"input {index}: a multi-vector model scores (query, text) pairs or encodes texts; send all of one kind"
    )
