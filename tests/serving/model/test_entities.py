"""byoc.serving.model.entities: windows that cover a long text whole, and the pipeline's aggregation."""

from __future__ import annotations

import numpy as np
import pytest
from tokenizers import Tokenizer

from byoc.serving.model import entities

ID2LABEL = {0: "O", 1: "B-PER", 2: "I-PER", 3: "B-LOC", 4: "I-LOC"}


@pytest.fixture(scope="module")
def tokenizer(tiny_model_dir) -> Tokenizer:
    return Tokenizer.from_file(str(tiny_model_dir / "tokenizer.json"))


def test_windows_cover_a_long_text_whole(tokenizer):
    text = " ".join(f"word{i} is here" for i in range(60))  # several hundred tokens
    encode = entities.window_encoder(tokenizer, 32, ["input_ids", "attention_mask"])
    (windows,) = encode([text])
    assert len(windows) > 5 and all(len(w["feeds"]["input_ids"]) <= 32 for w in windows)
    scores = [np.tile(np.eye(5)[0], (len(w["feeds"]["input_ids"]), 1)) for w in windows]
    tokens = entities.merge(windows, scores)
    full = Tokenizer.from_str(tokenizer.to_str())
    full.no_truncation()
    whole = full.encode(text)
    expected = [o for o, special in zip(whole.offsets, whole.special_tokens_mask) if not special]
    assert [(t["start"], t["end"]) for t in tokens] == expected  # every token once, in order
    assert tokens[-1]["end"] == len(text)


def token(start: int, end: int, word: int, scores: list[float]) -> dict:
    return {"start": start, "end": end, "word_id": word, "scores": np.array(scores), "index": 0}


def test_the_aggregation_strategies():
    text = "Jo Smith in Lagos"
    # "Jo" B-PER, "Smith" split in two sub-tokens (I-PER, then LOC-ish), "in" O, "Lagos" B-LOC.
    tokens = [
        token(0, 2, 0, [0.1, 0.8, 0.05, 0.03, 0.02]),
        token(3, 6, 1, [0.1, 0.05, 0.7, 0.1, 0.05]),
        token(6, 8, 1, [0.1, 0.05, 0.2, 0.05, 0.6]),
        token(9, 11, 2, [0.9, 0.02, 0.02, 0.03, 0.03]),
        token(12, 17, 3, [0.05, 0.05, 0.05, 0.8, 0.05]),
    ]
    for i, t in enumerate(tokens, 1):
        t["index"] = i
    none = entities.answer(text, tokens, ID2LABEL, "none")
    assert [(e["entity"], e["word"]) for e in none] == [
        ("B-PER", "Jo"),
        ("I-PER", "Smi"),
        ("I-LOC", "th"),
        ("B-LOC", "Lagos"),
    ]
    simple = entities.answer(text, tokens, ID2LABEL, "simple")
    assert [(e["entity_group"], e["word"], e["start"], e["end"]) for e in simple] == [
        ("PER", "Jo Smi", 0, 6),
        ("LOC", "th", 6, 8),
        ("LOC", "Lagos", 12, 17),
    ]
    assert simple[0]["score"] == pytest.approx((0.8 + 0.7) / 2)
    first = entities.answer(text, tokens, ID2LABEL, "first")  # Smith takes its first sub-token's I-PER
    assert [(e["entity_group"], e["word"]) for e in first] == [("PER", "Jo Smith"), ("LOC", "Lagos")]
    best = entities.answer(text, tokens, ID2LABEL, "max")  # Smith's best sub-token is I-PER (0.7)
    assert [(e["entity_group"], e["word"]) for e in best] == [("PER", "Jo Smith"), ("LOC", "Lagos")]
    average = entities.answer(text, tokens, ID2LABEL, "average")  # I-PER 0.45 against I-LOC 0.325
    assert [(e["entity_group"], e["word"]) for e in average] == [("PER", "Jo Smith"), ("LOC", "Lagos")]
    assert average[0]["score"] == pytest.approx((0.8 + 0.45) / 2)
