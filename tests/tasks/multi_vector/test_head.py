"""byoc.tasks.multi_vector.head: texts tokenized as queries or documents (prompts, lengths, query expansion, the
skiplist) and MaxSim, on the bundled MiniLM's tokenizer."""

from __future__ import annotations

import numpy as np
import pytest
from tokenizers import Tokenizer

from byoc.tasks.base import BadParameter
from byoc.tasks.multi_vector.head import TokenEncoder, encode_side, maxsim, skip_ids
from byoc.training.model import bundled_model_dir

SETTINGS = {
    "prompts": {"query": "query: "},
    "query_length": None,
    "document_length": 6,
    "query_expansion": {"strategy": "min", "attend": False, "token": None, "length": 8},
    "skiplist_words": [",", "no-such-token"],
    "skiplist_tasks": ["document"],
    "similarity": "maxsim",
}


@pytest.fixture(scope="module")
def encoder() -> TokenEncoder:
    tokenizer = Tokenizer.from_file(str(bundled_model_dir() / "tokenizer.json"))
    return TokenEncoder(tokenizer, 512, ["input_ids", "attention_mask"])


def test_a_short_query_is_expanded_with_masks_the_model_does_not_attend_to_and_a_long_one_kept_whole(encoder):
    (short, keep), (long, _) = encode_side(encoder, SETTINGS, ["hi", "a b c d e f g h i j"], "query")
    mask = encoder.token_id("[MASK]")
    assert short["input_ids"][:3] == [encoder.token_id(t) for t in ("[CLS]", "query", ":")]  # the prompt first
    assert len(short["input_ids"]) == 8 and short["input_ids"][-3:] == [mask] * 3
    assert short["attention_mask"] == [1] * 5 + [0] * 3 and keep.all()  # the expansion is scored
    assert len(long["input_ids"]) == 14 and long["attention_mask"] == [1] * 14  # "min": a floor, never a cut


def test_a_document_is_cut_at_its_length_and_its_skiplist_tokens_are_not_scored(encoder):
    [(document, keep)] = encode_side(encoder, SETTINGS, ["red, green, blue, white"], "document")
    assert len(document["input_ids"]) == 6 and "token_type_ids" not in document
    comma = encoder.token_id(",")
    assert [bool(k) for k in keep] == [token != comma for token in document["input_ids"]] and not keep.all()
    assert skip_ids(encoder, SETTINGS) == {comma}  # a word that is no token is left out of the skiplist


def test_maxsim_sums_each_query_vectors_best_match_and_meanmaxsim_averages_them():
    query = np.array([[1.0, 0.0], [0.0, 1.0]])
    text = np.array([[0.5, 0.5], [0.9, 0.1], [0.0, 0.2]])
    assert maxsim(query, text) == pytest.approx(0.9 + 0.5)
    assert maxsim(query, text, mean=True) == pytest.approx((0.9 + 0.5) / 2)
    assert maxsim(query, text[:0]) == 0.0


def test_an_expansion_token_the_tokenizer_lacks_is_refused_by_name(encoder):
    with pytest.raises(BadParameter, match="<nothing-here>"):
        encoder.expansion_id("<nothing-here>")
