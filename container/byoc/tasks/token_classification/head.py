"""A token classifier's serving head (NER answers): a text as overlapping windows of tokens (a text longer than
the model's window is covered whole, never cut), each token's tag scores from the window where it sits
furthest from an edge, and the entities the transformers token-classification pipeline would give,
in its shapes and with its `aggregation_strategy` values:

- none: every token not tagged O, `{"entity", "score", "index", "word", "start", "end"}`;
- simple: consecutive tokens of one type (a B- starts a new one) as `{"entity_group", "score" (their
  mean), "word", "start", "end"}`;
- first, average, max: each word tagged first (by its first sub-token's tag, by its sub-tokens'
  averaged scores, by its highest-scoring sub-token), then grouped as in simple.

A request that names no strategy gets its model's default: where config.json says how the model was
trained on a word's sub-tokens (byoc_word_tags), the words training saw, each whitespace-separated word
of the text as sent (the pipeline's words split `U.S.` and `Lloyd-Webber` at their punctuation, where
training never tagged), tagged by its first sub-token ("first") or its sub-tokens' averaged scores
("all": every sub-token trained), then grouped as in simple; else simple, the pipeline's default.

`start` and `end` are character offsets into the text as sent, and `word` is the text between them
(the pipeline joins the sub-tokens instead, which loses case and spacing in uncased models).
"""

from __future__ import annotations

import bisect
import re
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np
from tokenizers import Tokenizer

from byoc.tasks.base import BadParameter

STRATEGIES = (
    "none",
    "simple",
    "first",
    "average",
    "max",
)  # a request's (the pipeline's)
DEFAULT_STRATEGY = "simple"  # a model that does not say how it was trained: the pipeline's default
# The default of a model trained on whitespace-separated words (by byoc_word_tags): the same words
# here, each tagged as it was trained. Not a request's value: a request's strategy is the pipeline's.
WHITESPACE = "whitespace-words:"
TRAINED = {"first": WHITESPACE + "first", "all": WHITESPACE + "average"}


def default_strategy(word_tags: str | None) -> str:
    """A token classifier's strategy for requests that name none, from how its words were trained
    (byoc.model_folder.word_tags_of)."""
    return DEFAULT_STRATEGY if word_tags is None else TRAINED[word_tags]


class Windowed:
    """One request's texts, each read whole as the windows the loaded model's window encoder makes
    (`model["windows"]`, `window_encoder`): `encode()` makes them, the serving room runs `feeds` (every
    window's model inputs, in order) through the model in passes of its choosing, at once or a few at a time
    between other requests' batches, and `answers(scores)` (each window's tag scores, `feeds`' order) gives
    each text's entities."""

    def __init__(self, inputs: list[Any], parameters: Mapping[str, Any], model: Mapping[str, Any]) -> None:
        self.strategy = checked(inputs, parameters, model.get("aggregation", DEFAULT_STRATEGY))
        self.texts: list[str] = inputs
        self.model = model
        self.windows: list[list[dict]] = []

    def encode(self) -> None:
        """The texts' windows (the tokenizer's work)."""
        self.windows = self.model["windows"](self.texts)

    @property
    def feeds(self) -> list[dict[str, list[int]]]:
        return [window["feeds"] for windows in self.windows for window in windows]

    def answers(self, scores: list[np.ndarray]) -> list[list[dict[str, Any]]]:
        """Each text's entities, from each window's tag scores (a row per token)."""
        per_text = merged(self.windows, scores)
        return [
            answer(text, tokens, self.model["id2label"], self.strategy) for text, tokens in zip(self.texts, per_text)
        ]


def check_strategy(strategy: Any) -> None:
    if strategy is not None and strategy not in STRATEGIES:
        raise BadParameter(f'"aggregation_strategy" must be one of {", ".join(STRATEGIES)}, got {strategy!r}')


def checked(inputs: list[Any], parameters: Mapping[str, Any], default: str = DEFAULT_STRATEGY) -> str:
    """The request's aggregation strategy (the model's `default` where it names none), once its texts are
    known to be texts (its parameters are checked against the task's by the serving room, before)."""
    asked = parameters.get("aggregation_strategy") or None  # null (or "") counts as not sent
    check_strategy(asked)
    strategy = asked or default
    for index, text in enumerate(inputs):
        if not isinstance(text, str):
            raise BadParameter(
                f"input {index}: a token classifier takes one text per input, not a pair: send a text with "
                'commas as one JSON string, a line of text/plain, or a quoted CSV field ("a, b")'
            )
        if not text.strip():
            raise BadParameter(f"input {index} is empty: a token classifier needs a text to find entities in")
    return strategy


def merged(per_text: list[list[dict]], scores: list[np.ndarray]) -> list[list[dict]]:
    """Each text's tokens (`merge`), from the scores of all texts' windows in order."""
    results: list[list[dict]] = []
    at = 0
    for windows in per_text:
        results.append(merge(windows, scores[at : at + len(windows)]))
        at += len(windows)
    return results


def window_encoder(tokenizer: Tokenizer, limit: int, names: list[str]) -> Callable[[list[str]], list[list[dict]]]:
    """texts -> each text's windows: `limit` tokens at most, special tokens included, overlapping by a
    quarter window (at most 64 tokens). Each window: its model inputs (`names`) under "feeds", and the
    offsets, word ids and special-token mask of its tokens."""
    windows = Tokenizer.from_str(tokenizer.to_str())  # a copy: truncation is the tokenizer's state
    windows.no_padding()
    windows.no_truncation()
    content, stride = limit - windows.num_special_tokens_to_add(False), min(64, limit // 4)
    fields = {"input_ids": "ids", "attention_mask": "attention_mask", "token_type_ids": "type_ids"}

    def encode(texts: list[str]) -> list[list[dict]]:
        out = []
        for encoding in windows.encode_batch(texts, add_special_tokens=False):
            # Cut here, then the special tokens added to each window: what truncation with a stride does inside
            # encode, except that tokenizers 0.23.1 and 0.23.2 stop tokenizing a text at the limit there, so that
            # its overflowing windows miss most of a long text (huggingface/tokenizers#2091).
            encoding.truncate(content, stride=stride)
            encoding = windows.post_process(encoding)
            out.append(
                [
                    {
                        "feeds": {name: getattr(w, fields[name]) for name in names},
                        "offsets": w.offsets,
                        "words": w.word_ids,
                        "special": w.special_tokens_mask,
                    }
                    for w in (encoding, *encoding.overflowing)
                ]
            )
        return out

    return encode


def merge(windows: list[dict], scores: list[np.ndarray]) -> list[dict]:
    """A text's tokens in order, each with its scores from the window where it is furthest from an edge
    (attention sees the most context there): `{"scores", "start", "end", "word_id", "index"}`."""
    best: dict[tuple[int, int], tuple[int, dict]] = {}
    for window, rows in zip(windows, scores):
        content = [i for i, special in enumerate(window["special"]) if not special]
        for n, i in enumerate(content):
            start, end = window["offsets"][i]
            margin = min(n, len(content) - 1 - n)
            if (start, end) not in best or margin > best[(start, end)][0]:
                best[(start, end)] = (
                    margin,
                    {"scores": rows[i], "start": start, "end": end, "word_id": window["words"][i]},
                )
    tokens = [token for _, token in sorted(best.values(), key=lambda item: (item[1]["start"], item[1]["end"]))]
    for index, token in enumerate(tokens, 1):  # 1-based, as the pipeline counts past [CLS]
        token["index"] = index
    return tokens


def answer(text: str, tokens: list[dict], id2label: dict[int, str], strategy: str) -> list[dict[str, Any]]:
    """The entities of one text (see the module's docstring)."""
    if strategy in ("none", "simple"):
        tagged = []
        for token in tokens:
            best = int(np.argmax(token["scores"]))
            tagged.append(
                {
                    "entity": id2label[best],
                    "score": float(token["scores"][best]),
                    "index": token["index"],
                    "word": text[token["start"] : token["end"]],
                    "start": token["start"],
                    "end": token["end"],
                }
            )
        if strategy == "none":
            return [t for t in tagged if t["entity"] != "O"]
    elif strategy.startswith(WHITESPACE):
        tagged = [_word(text, group, id2label, strategy.removeprefix(WHITESPACE)) for group in _spaced(text, tokens)]
    else:
        tagged = [_word(text, group, id2label, strategy) for group in _words(tokens)]
    return [g for g in _groups(text, tagged) if g["entity_group"] != "O"]


def _words(tokens: list[dict]) -> list[list[dict]]:
    groups: list[list[dict]] = []
    for token in tokens:
        if groups and token["word_id"] is not None and groups[-1][-1]["word_id"] == token["word_id"]:
            groups[-1].append(token)
        else:
            groups.append([token])
    return groups


def _spaced(text: str, tokens: list[dict]) -> list[list[dict]]:
    """The tokens grouped by the whitespace-separated word that holds each one: the words of training's
    data (a CoNLL line's token), which punctuation inside a word does not split."""
    starts = [match.start() for match in re.finditer(r"\S+", text)]
    groups: list[list[dict]] = []
    last = -1
    for token in tokens:
        # its last character: its start's word, but for a byte-level BPE token that holds the space before it
        word = bisect.bisect_right(starts, max(token["start"], token["end"] - 1))
        if groups and word == last:
            groups[-1].append(token)
        else:
            groups.append([token])
        last = word
    return groups


def _word(text: str, group: list[dict], id2label: dict[int, str], strategy: str) -> dict[str, Any]:
    if strategy == "first":
        scores = group[0]["scores"]
    elif strategy == "max":
        scores = max(group, key=lambda t: float(np.max(t["scores"])))["scores"]
    else:  # average
        scores = np.mean([t["scores"] for t in group], axis=0)
    best = int(np.argmax(scores))
    start, end = group[0]["start"], group[-1]["end"]
    return {"entity": id2label[best], "score": float(scores[best]), "word": text[start:end], "start": start, "end": end}


def _groups(text: str, tagged: list[dict]) -> list[dict[str, Any]]:
    """Consecutive entities of one type, a B- starting a new group (the pipeline's group_entities)."""
    groups: list[list[dict]] = []
    for entity in tagged:
        bi, kind = _tag(entity["entity"])
        if groups and bi != "B" and _tag(groups[-1][-1]["entity"])[1] == kind:
            groups[-1].append(entity)
        else:
            groups.append([entity])
    return [
        {
            "entity_group": _tag(group[0]["entity"])[1],
            "score": sum(e["score"] for e in group) / len(group),
            "word": text[group[0]["start"] : group[-1]["end"]],
            "start": group[0]["start"],
            "end": group[-1]["end"],
        }
        for group in groups
    ]


def _tag(name: str) -> tuple[str, str]:
    """("B" or "I", the entity type); a tag without a B-/I- prefix counts as I (the pipeline's rule)."""
    if name.startswith(("B-", "I-")):
        return name[0], name[2:]
    return "I", name
