"""byoc.tasks.token_classification.head: windows that cover a long text whole, and the pipeline's aggregation."""

from __future__ import annotations

import numpy as np
import pytest
from tokenizers import Tokenizer

from byoc import model_folder
from byoc.tasks.token_classification import head as entities

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


def tokens_of(text: str, pieces: list[tuple[str, int, list[float]]]) -> list[dict]:
    """Tokens at each piece's place in `text` (found in order), with the tokenizer's word id and scores."""
    tokens, at = [], 0
    for n, (piece, word, scores) in enumerate(pieces, 1):
        start = text.index(piece.removeprefix("##"), at)
        at = start + len(piece.removeprefix("##"))
        tokens.append({**token(start, at, word, scores), "index": n})
    return tokens


OUT, B_PER, I_PER, B_LOC = (
    [0.9, 0.025, 0.025, 0.025, 0.025],
    [0.1, 0.8, 0.05, 0.03, 0.02],
    [0.1, 0.05, 0.8, 0.03, 0.02],
    [0.1, 0.05, 0.03, 0.8, 0.02],
)


def test_the_trained_default_keeps_a_word_with_inner_punctuation_one_entity():
    """Training tagged each whitespace-separated word on its first sub-token only: the tags of `-Webber`
    and `.S.` were never trained, and the pipeline's words (split at punctuation) let them split or drop
    the entity (issue 40: entity F1 0.64 served against 0.81 measured by the job)."""
    text = "Andrew Lloyd-Webber met U.S. officials"
    pieces = [
        ("Andrew", 0, B_PER),
        ("Lloyd", 1, I_PER),
        ("-", 2, OUT),  # the pipeline's words: "-" and "Webber" are words of their own
        ("Web", 3, B_LOC),
        ("##ber", 3, OUT),
        ("met", 4, OUT),
        ("U", 5, B_LOC),
        (".", 6, OUT),
        ("S", 7, B_PER),
        (".", 8, OUT),
        ("officials", 9, OUT),
    ]
    tokens = tokens_of(text, pieces)
    trained = entities.answer(text, tokens, ID2LABEL, entities.default_strategy("first"))
    assert [(e["entity_group"], e["word"], e["start"], e["end"]) for e in trained] == [
        ("PER", "Andrew Lloyd-Webber", 0, 19),
        ("LOC", "U.S.", 24, 28),
    ]
    assert trained[0]["score"] == pytest.approx(0.8)
    # Named explicitly, "first" stays the pipeline's: its words split both entities.
    first = entities.answer(text, tokens, ID2LABEL, "first")
    assert [(e["entity_group"], e["word"]) for e in first] == [
        ("PER", "Andrew Lloyd"),
        ("LOC", "Webber"),
        ("LOC", "U"),
        ("PER", "S"),
    ]


def test_a_model_trained_on_every_sub_token_averages_its_whitespace_words():
    text = "Lloyd-Webber sang"
    tokens = tokens_of(text, [("Lloyd", 0, B_PER), ("-", 1, I_PER), ("Webber", 2, B_LOC), ("sang", 3, OUT)])
    answer = entities.answer(text, tokens, ID2LABEL, entities.default_strategy("all"))
    # B-PER 0.30 against I-PER 0.29 and B-LOC 0.29: the word's averaged scores
    assert [(e["entity_group"], e["word"]) for e in answer] == [("PER", "Lloyd-Webber")]
    assert answer[0]["score"] == pytest.approx((0.8 + 0.05 + 0.05) / 3)


def predict(texts: list[str], parameters: dict, model: dict) -> list:
    """The entities `Windowed` gives, its windows' tokens as `merged` (patched) makes them."""
    request = entities.Windowed(texts, parameters, {**model, "windows": lambda texts: [[] for _ in texts]})
    request.encode()
    return request.answers([])


def test_a_request_without_a_strategy_gets_the_models_default(monkeypatch):
    """The default comes from the model (its config.json's byoc_word_tags, read by the runtimes); a
    model that does not say, and a request that names a strategy, get the pipeline's."""
    text = "Andrew Lloyd-Webber"
    tokens = tokens_of(text, [("Andrew", 0, B_PER), ("Lloyd", 1, I_PER), ("-", 2, OUT), ("Webber", 3, B_LOC)])
    monkeypatch.setattr(entities, "merged", lambda windows, scores: [tokens for _ in windows])
    words = {
        "id2label": ID2LABEL,
        "aggregation": entities.default_strategy(model_folder.word_tags_of({"byoc_word_tags": "first"})),
    }
    answer = predict([text], {}, words)[0]
    assert [(e["entity_group"], e["word"]) for e in answer] == [("PER", "Andrew Lloyd-Webber")]
    assert predict([text], {"aggregation_strategy": None}, words)[0] == answer
    pipeline_simple = [("PER", "Andrew Lloyd"), ("LOC", "Webber")]
    unknown = {"byoc_word_tags": "every"}  # a value this byoc does not know: the pipeline's default
    for model, parameters in (
        ({"id2label": ID2LABEL, "aggregation": entities.default_strategy(model_folder.word_tags_of({}))}, {}),
        ({"id2label": ID2LABEL, "aggregation": entities.default_strategy(model_folder.word_tags_of(unknown))}, {}),
        ({"id2label": ID2LABEL}, {}),  # a model dict of a code/inference.py's own model_fn
        (words, {"aggregation_strategy": "simple"}),
    ):
        answer = predict([text], parameters, model)[0]
        assert [(e["entity_group"], e["word"]) for e in answer] == pipeline_simple


def test_a_token_that_holds_the_space_before_it_is_its_words():
    """A byte-level BPE token (RoBERTa's `ĠLloyd`) whose offsets keep its leading space belongs to the
    word after the space, not the one before."""
    text = "Jo Lloyd-Webber"
    tokens = [token(0, 2, 0, B_PER), token(2, 8, 1, B_LOC), token(8, 9, 2, OUT), token(9, 15, 3, OUT)]
    answer = entities.answer(text, tokens, ID2LABEL, entities.default_strategy("first"))
    # offsets stay the tokens' (the pipeline's too): the entity starts at the space its first token holds
    assert [(e["entity_group"], e["start"], e["end"]) for e in answer] == [("PER", 0, 2), ("LOC", 2, 15)]
