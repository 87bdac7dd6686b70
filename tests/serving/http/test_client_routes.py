"""The client routes off SageMaker, called by the real client libraries from PyPI (the openai SDK, huggingface_hub's
InferenceClient, cohere's v1 and v2 clients) and by TEI's bodies, against `byoc serve` over folders the real
`byoc train` wrote: each answers what /invocations answers for the same texts, in the client's shape."""

from __future__ import annotations

import base64
import shutil
from pathlib import Path

import numpy as np
import pytest
from serve_helpers import Server

from helpers import Job, run_train_process, topic_rows, write_jsonl

pytestmark = pytest.mark.integration  # jobs and servers in processes

QUICK = {"max_steps": "4", "logging_steps": "2", "per_device_train_batch_size": "8"}
TEXTS = ["how to bake bread", "the team won the final", "rain is expected tomorrow"]


def trained(tmp_path_factory, tiny_model_dir: Path, name: str, hyperparameters: dict, rows: list[dict]) -> Path:
    """A folder written by the real `byoc train` (its own process), code/ and all."""
    root = tmp_path_factory.mktemp(name) / "opt-ml"
    job = Job(root).resources()
    job.hyperparameters({**QUICK, **hyperparameters})
    job.model_channel(tiny_model_dir)
    write_jsonl(job.channel("train") / "train.jsonl", rows)
    done = run_train_process(root)
    assert done.returncode == 0, (done.stdout + done.stderr)[-3000:]
    return job.model_dir


def served(folder: Path, tmp_path_factory, name: str):
    target = tmp_path_factory.mktemp(f"{name}-served") / "model"
    shutil.copytree(folder, target)
    server = Server(target, env={"BYOC_INFERENCE_BACKEND": "onnxruntime", "BYOC_INFERENCE_PRECISION": "fp32"})
    server.wait_ready()
    server.model_dir = target  # (its tokenizer, for the token arrays)
    return server


@pytest.fixture(scope="module")
def embedder(tmp_path_factory, tiny_model_dir):
    folder = trained(tmp_path_factory, tiny_model_dir, "embedder", {"task": "embedding"}, topic_rows(32))
    server = served(folder, tmp_path_factory, "embedder")
    yield server
    server.stop()


@pytest.fixture(scope="module")
def reranker(tmp_path_factory, tiny_model_dir):
    rows = topic_rows(32, negatives=True)
    server = served(
        trained(tmp_path_factory, tiny_model_dir, "reranker", {"task": "reranker"}, rows), tmp_path_factory, "reranker"
    )
    yield server
    server.stop()


@pytest.fixture(scope="module")
def classifier(tmp_path_factory, tiny_model_dir):
    rows = [{"text": f"{word} text {i}", "label": word} for i in range(12) for word in ("red", "blue", "green")]
    server = served(trained(tmp_path_factory, tiny_model_dir, "classifier", {}, rows), tmp_path_factory, "classifier")
    yield server
    server.stop()


def invoked(server: Server, body: dict):
    answer = server.invoke(body)
    assert answer.status_code == 200, answer.text
    return answer.json()


def test_the_openai_sdk_embeds_as_invocations_does_in_floats_base64_dimensions_and_token_arrays(embedder):
    from openai import OpenAI
    from transformers import AutoTokenizer

    expected = np.asarray(invoked(embedder, {"inputs": TEXTS}))
    client = OpenAI(base_url=f"{embedder.url}/v1", api_key="unused")
    for encoding in ({}, {"encoding_format": "float"}):  # (unasked, the SDK asks for base64 and decodes it)
        answer = client.embeddings.create(input=TEXTS, model="my-model", **encoding)
        np.testing.assert_allclose([item.embedding for item in answer.data], expected, rtol=1e-5, atol=1e-6)
        assert answer.model == "my-model" and answer.usage.prompt_tokens > len(TEXTS)
    packed = client.embeddings.create(input=TEXTS, model="m", encoding_format="base64")  # (asked: left to the caller)
    vectors = [np.frombuffer(base64.b64decode(item.embedding), dtype="<f4") for item in packed.data]
    np.testing.assert_allclose(vectors, expected, rtol=1e-5, atol=1e-6)
    cut = client.embeddings.create(input=TEXTS[0], model="m", dimensions=8).data[0].embedding
    np.testing.assert_allclose(cut, expected[0, :8] / np.linalg.norm(expected[0, :8]), rtol=1e-5, atol=1e-6)

    tokenizer = AutoTokenizer.from_pretrained(str(embedder.model_dir))
    ids = [tokenizer(text, add_special_tokens=False)["input_ids"] for text in TEXTS]
    by_ids = client.embeddings.create(input=ids, model="m", encoding_format="float")
    np.testing.assert_allclose([item.embedding for item in by_ids.data], expected, rtol=1e-5, atol=1e-6)
    assert [model.id for model in client.models.list()] == ["model"]


def test_huggingface_hubs_inference_client_and_teis_routes_embed_as_invocations_does(embedder):
    from huggingface_hub import InferenceClient

    expected = np.asarray(invoked(embedder, {"inputs": TEXTS}))
    hub = InferenceClient(model=embedder.url)  # (a URL model: the client posts to the root)
    np.testing.assert_allclose(hub.feature_extraction(TEXTS), expected, rtol=1e-5, atol=1e-6)
    answer = embedder.client.post("/embed", json={"inputs": TEXTS[0], "normalize": True})
    assert answer.status_code == 200, answer.text
    np.testing.assert_allclose(answer.json(), expected[:1], rtol=1e-5, atol=1e-6)
    info = embedder.client.get("/info").json()
    assert info["model_type"] == {"embedding": {"pooling": "mean"}} and info["byoc_task"] == "embedding"

    long = "cats sleep on the sofa " * 60 + "the stock market fell sharply today " * 20  # (past max_length)
    left = hub.feature_extraction(long, truncation_direction="left")
    tei = embedder.client.post("/embed", json={"inputs": long, "truncation_direction": "Left"}).json()
    np.testing.assert_allclose(left, tei, rtol=1e-5, atol=1e-6)
    assert not np.allclose(left, invoked(embedder, {"inputs": [long]}), atol=1e-3)  # the end kept, not the start


def test_routes_a_model_does_not_answer_and_unknown_routes_are_json_errors_naming_what_there_is(embedder):
    wrong = embedder.client.post("/embed_sparse", json={"inputs": TEXTS})
    assert wrong.status_code == 400
    assert (
        wrong.json()["error"]
        == "/embed_sparse is not answered by an embedding model: its routes are /embed, /v1/embeddings "
        "(and /invocations)"
    )
    for method, path, status in (("GET", "/v2/embed", 404), ("GET", "/embed", 405)):
        answer = embedder.client.request(method, path)
        assert answer.status_code == status and answer.headers["content-type"] == "application/json"
        assert answer.json()["status"] == status and "/v1/embeddings" in answer.json()["error"]
    assert embedder.client.get("/embed").headers["allow"] == "POST"
    for body in (b"\xff\xfe not UTF-8", b"[" * 100_000 + b"]" * 100_000, b"{"):  # 400s, never a plain-text 500
        answer = embedder.client.post("/v1/embeddings", content=body, headers={"content-type": "application/json"})
        assert answer.status_code == 400 and "is not valid JSON" in answer.json()["error"], answer.text


def test_cohere_v1_and_v2_clients_rerank_as_teis_rerank_body_does(reranker):
    import cohere

    documents = [row["positive"] for row in topic_rows(4, seed=2)]
    query = topic_rows(1, seed=2)[0]["anchor"]
    expected = invoked(reranker, {"query": query, "texts": documents})
    tei = reranker.client.post("/rerank", json={"query": query, "texts": documents})
    assert tei.status_code == 200 and tei.json() == expected

    v2 = cohere.ClientV2(api_key="unused", base_url=reranker.url).rerank(
        model="m", query=query, documents=documents, top_n=3
    )
    assert [(r.index, r.relevance_score) for r in v2.results] == [(e["index"], e["score"]) for e in expected[:3]]
    v1 = cohere.Client(api_key="unused", base_url=reranker.url).rerank(
        model="m", query=query, documents=documents, return_documents=True
    )
    assert [(r.index, r.document.text) for r in v1.results] == [(e["index"], documents[e["index"]]) for e in expected]
    assert reranker.client.get("/info").json()["model_type"].keys() == {"reranker"}


def test_teis_predict_on_a_trained_reranker_answers_the_rerank_score_or_its_logit_when_raw(reranker):
    """A byoc-trained reranker answered its raw logit on /predict where /rerank (and CrossEncoder.predict) give the
    sigmoid of it; "raw_scores" was refused. Now /predict answers /rerank's score, and the logit when raw."""
    import math

    query, document = "something about cooking", topic_rows(1, seed=3)[0]["positive"]
    ranked = invoked(reranker, {"query": query, "texts": [document]})[0]["score"]
    answer = reranker.client.post("/predict", json={"inputs": [query, document]})
    assert answer.status_code == 200, answer.text
    assert answer.json()[0]["score"] == pytest.approx(ranked, abs=1e-6)
    raw = reranker.client.post("/predict", json={"inputs": [query, document], "raw_scores": True}).json()[0]["score"]
    assert 1 / (1 + math.exp(-raw)) == pytest.approx(ranked, abs=1e-6)
    assert invoked(reranker, {"query": query, "texts": [document], "raw_scores": True})[0]["score"] == pytest.approx(
        raw, abs=1e-6
    )


def test_cohere_rerank_to_an_embedder_and_openai_embeddings_to_a_reranker_are_refused_naming_the_route(
    embedder, reranker
):
    """Refusals name the route the client called and the routes the model answers (round six)."""
    refused = embedder.client.post("/v1/rerank", json={"query": "q", "documents": ["a"]})
    assert refused.status_code == 400, refused.text
    assert refused.json()["error"].startswith("/v1/rerank is not answered by an embedding model"), refused.text
    refused = reranker.client.post("/v1/embeddings", json={"input": "a", "model": "m"})
    assert refused.status_code == 400 and "/v1/embeddings is not answered by a reranker" in refused.json()["error"]
    assert "/rerank, /v1/rerank, /v2/rerank" in refused.json()["error"]


def test_teis_predict_answers_every_label_best_first_as_tei_does(classifier):
    single = classifier.client.post("/predict", json={"inputs": "red text"})
    assert single.status_code == 200, single.text
    labels = single.json()
    assert sorted(entry["label"] for entry in labels) == ["blue", "green", "red"]
    assert [entry["score"] for entry in labels] == sorted((entry["score"] for entry in labels), reverse=True)
    assert labels[0] == invoked(classifier, {"inputs": ["red text"]})[0]  # /invocations' best label
    batch = classifier.client.post("/predict", json={"inputs": ["red text", "blue text", "green text"]}).json()
    assert len(batch) == 3 and batch[0] == labels
    info = classifier.client.get("/info").json()
    assert sorted(info["model_type"]["classifier"]["label2id"]) == ["blue", "green", "red"]


def test_a_large_answer_is_reshaped_for_the_client_off_the_event_loop():
    """800 texts to a 1,000-class classifier through TEI's /predict: 45 MB re-read and re-written on the event loop
    held /ping 2.2 s. A large answer (as a large body) is reshaped on a thread; a small one stays inline."""
    import asyncio
    import json
    import threading

    from starlette.responses import JSONResponse

    from byoc.serving.http import client_routes
    from byoc.serving.protocol.clients import Rewrite

    threads: list[bool] = []

    def reshape(answer):
        threads.append(threading.current_thread() is threading.main_thread())
        return [sorted(labels, key=lambda label: -label["score"]) for labels in answer]

    class Answering:
        def __init__(self, answer) -> None:
            self.answer_body = answer

        async def answer(self, request, body, server):
            return JSONResponse(self.answer_body)

    def rewrite(payload, model):
        return Rewrite({"inputs": payload["inputs"]}, reshape)

    class Server:
        model = None

    server = Server()
    large = [[{"label": str(i), "score": i / 1000} for i in range(1000)]] * 100  # about 3 MB
    for answer in ([[{"label": "a", "score": 0.5}]], large):
        response = asyncio.run(
            client_routes._rewritten(None, json.dumps({"inputs": ["x"]}).encode(), rewrite, Answering(answer), server)
        )
        assert response.status_code == 200 and json.loads(response.body)[0][0]["score"] == max(
            label["score"] for label in answer[0]
        )
    assert threads == [True, False]  # the small answer inline (on the loop's thread), the large one on a thread
