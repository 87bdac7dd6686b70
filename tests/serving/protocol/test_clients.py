"""byoc.serving.protocol.clients: each client's request as the /invocations body asking the same, and its answer
reshaped as the client reads it; a route a model does not answer is a 400 naming those it does."""

from __future__ import annotations

import pytest

from byoc.serving.protocol import clients
from byoc.serving.protocol.request_errors import InputError


class Vocabulary:
    """A tokenizer's decode, as the loaded model's `tokenizer` (tokenizers.Tokenizer) offers it."""

    words = ["[PAD]", "[CLS]", "[SEP]", "hello", "world"]

    def get_vocab_size(self) -> int:
        return len(self.words)

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        return " ".join(self.words[i] for i in ids if not (skip_special_tokens and self.words[i].startswith("[")))


EMBEDDER = {"task": "embedding", "tokenizer": Vocabulary()}
CLASSIFIER = {"task": "single_label_classification", "id2label": {0: "sad", 1: "happy", 2: "calm"}}


def test_tei_embed_asks_for_a_list_and_keeps_teis_fields_as_parameters():
    rewrite = clients.tei("embed", {"inputs": "a text", "normalize": False, "dimensions": 8}, EMBEDDER)
    assert rewrite.body == {"inputs": ["a text"], "parameters": {"normalize": False, "dimensions": 8}}
    assert rewrite.reshape is None


@pytest.mark.parametrize(
    "route, parameters",
    [("embed", {"output": "dense"}), ("embed_sparse", {"output": "sparse"}), ("embed_all", {"output": "colbert"})],
)
def test_a_hybrid_models_tei_routes_ask_for_their_output(route, parameters):
    assert clients.tei(route, {"inputs": ["a"]}, {"task": "hybrid"}).body == {"inputs": ["a"], "parameters": parameters}


@pytest.mark.parametrize(
    "route, model, answered",
    [
        ("embed_sparse", EMBEDDER, "an embedding model: its routes are /embed"),
        ("embed", {"task": "sparse_embedding"}, "a sparse embedding model: its routes are /embed_sparse"),
        ("embed", CLASSIFIER, "a single-label classifier: its routes are /predict"),
        ("predict", EMBEDDER, "an embedding model: its routes are /embed"),
    ],
)
def test_a_route_the_model_does_not_answer_is_refused_naming_those_it_does(route, model, answered):
    with pytest.raises(InputError, match=f"/{route} is not answered by {answered}"):
        clients.tei(route, {"inputs": ["a"]}, model)


def test_a_model_of_the_users_own_code_takes_every_route_as_it_is():
    assert clients.tei("embed_sparse", {"inputs": "a"}, object()).body == {"inputs": ["a"], "parameters": {}}


def test_unknown_fields_are_refused_by_name_not_ignored():
    with pytest.raises(InputError, match="/embed does not read 'top_k': its fields are inputs, normalize"):
        clients.tei("embed", {"inputs": "a", "top_k": 2}, EMBEDDER)
    with pytest.raises(InputError, match="/v1/embeddings does not read 'foo'"):
        clients.openai_embeddings({"input": "a", "foo": 1}, EMBEDDER)


@pytest.mark.parametrize(
    "inputs, batch, single",
    [
        ("a text", ["a text"], True),
        (["a text", "its pair"], [["a text", "its pair"]], True),  # two texts: one pair, as TEI reads them
        (["a", "b", "c"], ["a", "b", "c"], False),
        ([["a", "b"], ["c", "d"]], [["a", "b"], ["c", "d"]], False),
        ([["a"], ["b"]], ["a", "b"], False),
    ],
)
def test_predict_reads_inputs_as_tei_does_and_answers_every_label_best_first(inputs, batch, single):
    rewrite = clients.tei("predict", {"inputs": inputs}, CLASSIFIER)
    assert rewrite.body == {"inputs": batch, "parameters": {"top_k": 3}}
    answers = [[{"label": "happy", "score": 0.7}, {"label": "sad", "score": 0.2}]] * len(batch)
    assert rewrite.reshape is not None
    assert rewrite.reshape(answers) == (answers[0] if single else answers)


def test_predict_lists_a_regression_models_one_answer_and_refuses_raw_scores_for_probabilities():
    regression = {"task": "regression", "id2label": {0: "x"}, "stated_regression": True}
    rewrite = clients.tei("predict", {"inputs": ["a", "b", "c"]}, regression)
    assert rewrite.body["parameters"] == {}  # (no top_k: a regression model takes none)
    assert rewrite.reshape is not None and rewrite.reshape([{"score": 1.0}] * 3) == [[{"score": 1.0}]] * 3
    with pytest.raises(InputError, match='"raw_scores" on /predict is served for a one-output cross-encoder'):
        clients.tei("predict", {"inputs": "a", "raw_scores": True}, CLASSIFIER)


def test_predict_on_a_one_output_cross_encoder_answers_its_activated_score_or_the_logit_when_raw():
    """A byoc-trained reranker answered its raw logit (3.4204) on /predict where /rerank and CrossEncoder.predict
    give 0.9683, and "raw_scores" was refused: TEI's /predict applies the activation and takes raw_scores."""
    import math

    reranker = {"task": "reranker", "id2label": {0: "relevance"}, "activation": "Sigmoid"}
    answer = [{"label": "relevance", "score": 3.4204}]
    activated = clients.tei("predict", {"inputs": ["q", "d"]}, reranker)
    assert activated.reshape is not None
    assert activated.reshape(answer)[0]["score"] == pytest.approx(1 / (1 + math.exp(-3.4204)))
    raw = clients.tei("predict", {"inputs": ["q", "d"], "raw_scores": True}, reranker)
    assert raw.reshape is not None and raw.reshape(answer) == answer
    assert "raw_scores" not in raw.body["parameters"]


def test_openai_token_arrays_are_the_models_own_ids_decoded_to_text():
    rewrite = clients.openai_embeddings({"input": [[1, 3, 4, 2], "as text"], "model": "m"}, EMBEDDER)
    assert rewrite.body == {"input": ["hello world", "as text"], "model": "m"}
    assert clients.openai_embeddings({"input": [3, 4]}, EMBEDDER).body == {"input": "hello world"}
    with pytest.raises(InputError, match="token id 100257 is outside .* check_embedding_ctx_length=False"):
        clients.openai_embeddings({"input": [[100257, 3]]}, EMBEDDER)


def test_a_token_array_is_cut_at_the_models_length_before_it_is_decoded():
    """2.9 M ids took 2.8 s to decode, /ping waiting, where the model reads 128 tokens: the ids past the model's
    max_length are cut first (the model would cut the text there anyway)."""

    class Counting(Vocabulary):
        decoded = 0

        def decode(self, ids, skip_special_tokens=True):
            Counting.decoded += len(ids)
            return super().decode(ids, skip_special_tokens)

    model = {"task": "embedding", "tokenizer": Counting(), "max_length": 4}
    rewrite = clients.openai_embeddings({"input": [3, 4] * 1_000_000}, model)
    assert rewrite.body == {"input": "hello world hello world"} and Counting.decoded == 4


def test_openai_embeddings_need_a_dense_vector_model():
    """The refusal names the route the client called (it said "/embed is not answered")."""
    with pytest.raises(InputError, match="^/v1/embeddings is not answered by a sparse embedding model: its routes"):
        clients.openai_embeddings({"input": "a"}, {"task": "sparse_embedding"})


def test_cohere_rerank_refusals_name_what_the_client_sent():
    """/v1/rerank to an embedder was refused citing {"query","texts"}, /invocations' body; a lone surrogate in a
    /v2/rerank document was named "texts"[0]. Both are named as the client sent them."""
    with pytest.raises(InputError, match="^/v1/rerank is not answered by an embedding model: it does not rerank"):
        clients.cohere_rerank(1, {"query": "q", "documents": ["a"]}, EMBEDDER)
    with pytest.raises(InputError, match=r'^"documents"\[1\] is not valid Unicode'):
        clients.cohere_rerank(2, {"query": "q", "documents": ["a", "b\ud800"]}, {"task": "reranker"})
    with pytest.raises(InputError, match=r'^"documents"\[0\] is not valid Unicode'):
        clients.cohere_rerank(1, {"query": "q", "documents": [{"text": "\udc00"}]})


def test_a_refusal_lists_every_route_the_model_answers_rerank_ones_included():
    """A multi-vector model was said to answer only /embed_all: it reranks too (MaxSim)."""
    with pytest.raises(InputError, match="its routes are /embed_all, /rerank, /v1/rerank, /v2/rerank"):
        clients.tei("embed", {"inputs": ["a"]}, {"task": "multi_vector"})
    with pytest.raises(InputError, match="its routes are /embed, /v1/embeddings \\(and /invocations\\)"):
        clients.tei("predict", {"inputs": ["a"]}, EMBEDDER)


RANKED = [{"index": 1, "score": 0.9, "text": "b"}, {"index": 0, "score": 0.1, "text": "a"}]


def test_cohere_v1_rerank_answers_cohere_results_with_the_documents_text():
    payload = {"model": "m", "query": "q", "documents": ["a", {"text": "b"}], "top_n": 2}
    rewrite = clients.cohere_rerank(1, payload)
    assert rewrite.body == {"query": "q", "texts": ["a", "b"], "return_text": True, "top_n": 2}
    assert rewrite.reshape is not None
    answer = rewrite.reshape(RANKED)
    assert answer["results"] == [
        {"index": 1, "relevance_score": 0.9, "document": {"text": "b"}},
        {"index": 0, "relevance_score": 0.1, "document": {"text": "a"}},
    ]
    assert answer["meta"]["api_version"] == {"version": "1"} and answer["id"] and answer["model"] == "m"


def test_cohere_v2_rerank_answers_indices_and_scores_alone():
    rewrite = clients.cohere_rerank(2, {"model": "m", "query": "q", "documents": ["a", "b"]})
    assert rewrite.body == {"query": "q", "texts": ["a", "b"], "return_text": False}
    assert rewrite.reshape is not None
    assert rewrite.reshape(RANKED)["results"] == [
        {"index": 1, "relevance_score": 0.9},
        {"index": 0, "relevance_score": 0.1},
    ]


@pytest.mark.parametrize(
    "version, payload, message",
    [
        (1, {"query": "q", "documents": []}, "with documents"),
        (1, {"query": "q", "documents": ["a"], "rank_fields": ["title"]}, '"rank_fields" may only be'),
        (1, {"query": "q", "documents": [3]}, r'"documents"\[0\] must be a text'),
        (2, {"query": "q", "documents": ["a"], "max_tokens_per_doc": 512}, "does not read 'max_tokens_per_doc'"),
    ],
)
def test_cohere_rerank_bodies_byoc_cannot_answer_as_asked_are_refused(version, payload, message):
    with pytest.raises(InputError, match=message):
        clients.cohere_rerank(version, payload)


def test_info_says_what_kind_of_model_it_is():
    class Settings:
        max_concurrency, max_batch, max_inputs = 8, 32, 64

    embedder = clients.info({**EMBEDDER, "max_length": 256, "precision": "fp32"}, "model", Settings())
    assert embedder["model_type"] == {"embedding": {"pooling": "mean"}} and embedder["max_input_length"] == 256
    classifier = clients.info(CLASSIFIER, "model", Settings())
    assert classifier["model_type"] == {
        "classifier": {
            "id2label": {"0": "sad", "1": "happy", "2": "calm"},
            "label2id": {"sad": 0, "happy": 1, "calm": 2},
        }
    }
    assert classifier["max_client_batch_size"] == 64 and classifier["byoc_task"] == "single_label_classification"


def test_null_fields_are_not_sent_and_a_user_models_own_task_name_takes_every_route():
    """Cohere's SDK sends an argument passed as None as null; a model dict of the user's own code may name a task
    byoc does not have."""
    rewrite = clients.cohere_rerank(
        2, {"model": "m", "query": "q", "documents": ["a"], "top_n": None, "priority": None}
    )
    assert rewrite.body == {"query": "q", "texts": ["a"], "return_text": False}
    assert clients.tei("embed", {"inputs": "a", "normalize": None}, EMBEDDER).body["parameters"] == {}
    assert clients.tei("predict", {"inputs": "a"}, {"task": "my-own-task"}).body == {"inputs": ["a"], "parameters": {}}


def test_a_token_classifier_answers_entities_on_invocations_only():
    with pytest.raises(InputError, match="/predict is not answered by a token classifier: it answers /invocations"):
        clients.tei("predict", {"inputs": "John lives in Paris"}, {"task": "token_classification"})


def test_token_arrays_wait_for_the_model_while_it_loads():
    """No model yet: the body goes on as it is, to the model server's 503 (not a 400 about the tokenizer)."""
    assert clients.openai_embeddings({"input": [[1, 2]]}, None).body == {"input": [[1, 2]]}
