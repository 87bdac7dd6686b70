"""The requests of clients that do not speak SageMaker's `/invocations`, each rewritten as the `/invocations`
body that asks the same, and the answer reshaped as the client reads it (byoc.serving.http.client_routes serves
them over the same path: slots, timeouts, batching, errors):

- Text Embeddings Inference's `/embed` (dense vectors), `/embed_sparse` (`[{"index", "value"}]`), `/embed_all`
  (token vectors: a multi-vector model's), `/rerank` and `/predict` (every label's score, best first, as TEI
  answers), and `/info`;
- OpenAI's `/v1/embeddings`: texts, or token arrays (the model's own token ids, as TEI reads them), answered
  as OpenAI's embeddings object; `/v1/models`;
- Cohere's rerank (`/v1/rerank`, which Jina's clients call too, and `/v2/rerank`): `{"query", "documents",
  "top_n"}`, answered as `{"id", "results": [{"index", "relevance_score"(, "document")}], "meta"}`.

The answers are written by byoc.serving.protocol.outputs, beside every other writer.

Which routes a model answers follows from the kinds of answer its task gives (`Head.kinds`) and the kinds each
route answers (byoc.tasks.kinds.ROUTE_KINDS; any task that reranks answers a rerank): a route the model does not
answer is a 400 naming those it does, never another kind of answer. A model loaded by its own code (no byoc
task) takes every route, its code deciding what to answer.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from byoc import tasks
from byoc.serving.protocol import outputs
from byoc.serving.protocol.bodies import valid_unicode
from byoc.serving.protocol.request_errors import InputError
from byoc.tasks.kinds import ROUTE_KINDS, Kind

RERANK = "rerank"
# Each TEI route's fields beside "inputs" (its request's parameters); TEI's "truncate" needs nothing (byoc
# truncates at the model's length), "truncation_direction" is checked with every request's parameters.
TEI_FIELDS = {
    "embed": ("normalize", "truncate", "truncation_direction", "prompt_name", "dimensions"),
    "embed_sparse": ("truncate", "truncation_direction", "prompt_name"),
    "embed_all": ("truncate", "truncation_direction", "prompt_name"),
    "predict": ("truncate", "truncation_direction", "raw_scores"),
    RERANK: ("query", "texts", "truncate", "truncation_direction", "raw_scores", "return_text"),
}
OPENAI_FIELDS = ("input", "model", "encoding_format", "dimensions", "user")
COHERE_FIELDS = {
    1: ("model", "query", "documents", "top_n", "return_documents", "rank_fields"),
    2: ("model", "query", "documents", "top_n", "priority"),  # (priority: a scheduling hint, nothing to apply)
}


@dataclass(frozen=True)
class Rewrite:
    """A client's request as `/invocations` reads it (`body`), and how to give its answer back (`reshape`: the
    `/invocations` answer, parsed, to the client's; None: as it is)."""

    body: Any
    reshape: Callable[[Any], Any] | None = field(default=None)


def task_of(model: Any) -> tasks.Task | None:
    """The loaded model's task; None for a model of the user's own code (or none loaded yet: the request then
    meets the model server's 503)."""
    name = model.get("task") if isinstance(model, Mapping) else None
    return tasks.TASKS.get(name) if isinstance(name, str) else None  # (a user's model dict may name its own)


def tei(route: str, payload: Any, model: Any) -> Rewrite:
    """A Text Embeddings Inference request to `/<route>`."""
    payload = _object(payload, route)
    _known(payload, ("inputs", *TEI_FIELDS[route]), f"/{route}")
    if route == RERANK:
        return Rewrite(payload)  # /invocations reads TEI's rerank body as it is
    task = task_of(model)
    added = _route_parameters(task, route, model)
    if "inputs" not in payload:
        raise InputError(f'/{route} takes {{"inputs": "a text"}} or a list of texts; the body has no "inputs"')
    parameters = {**added, **{key: payload[key] for key in TEI_FIELDS[route] if key in payload}}
    if route != "predict":
        inputs = payload["inputs"]
        return Rewrite({"inputs": [inputs] if isinstance(inputs, str) else inputs, "parameters": parameters})
    return _predict(payload["inputs"], parameters, task, model)


def _route_parameters(task: tasks.Task | None, route: str, model: Any, asked: str | None = None) -> Mapping[str, Any]:
    """The parameters that ask `task` for the kind `route` answers (ROUTE_KINDS, in order); InputError, naming the
    route the client called (`asked`, by default `/<route>`) and those the model answers, where it gives none."""
    if task is None:
        return {}
    kind = next((kind for kind in ROUTE_KINDS[route] if kind in task.head.kinds), None)
    if kind is None:
        raise InputError(f"{asked or '/' + route} is not answered by {task.described}: {_routes_of(task, model)}")
    return task.head.kinds[kind]


def _routes_of(task: tasks.Task, model: Any) -> str:
    """The client routes the loaded model answers, for a message: those of the kinds it gives, and the rerank
    routes where it reranks (a cross-encoder, a multi-vector model's MaxSim...)."""
    answered = [f"/{route}" for route, kinds in ROUTE_KINDS.items() if set(kinds) & set(task.head.kinds)]
    if _reranks(task, model):
        answered += ["/rerank", "/v1/rerank", "/v2/rerank"]
    return f"its routes are {', '.join(answered)} (and /invocations)" if answered else "it answers /invocations"


def _predict(inputs: Any, parameters: dict[str, Any], task: tasks.Task | None, model: Any) -> Rewrite:
    """TEI's /predict: a text, a pair (two texts in a list, as TEI reads them), or a list of either; each input
    answered with every label's score, best first (TEI's answer), a single input's as one list."""
    raw = bool(parameters.pop("raw_scores", None))
    relevance = task is not None and _one_relevance(task, model)
    if raw and not relevance:
        raise InputError(
            '"raw_scores" on /predict is served for a one-output cross-encoder (its logit as it is); this model\'s '
            "scores are its labels' probabilities"
        )
    single = isinstance(inputs, str) or (
        isinstance(inputs, list) and len(inputs) == 2 and all(isinstance(text, str) for text in inputs)
    )
    batch = [inputs] if single else inputs
    if not isinstance(batch, list) or not batch:
        raise InputError('/predict takes "inputs": a text, a pair ["text", "text pair"], or a list of them')
    batch = [item[0] if isinstance(item, list) and len(item) == 1 else item for item in batch]  # (TEI's [["a"]])
    labels = len(model.get("id2label") or {}) if isinstance(model, Mapping) else 0
    if task is not None and "top_k" in task.head.parameters and labels:
        parameters["top_k"] = labels  # every label, best first

    def reshape(answers: Any) -> Any:
        if relevance and not raw:  # the logit through the model's activation, as TEI's /predict and /rerank give it
            assert task is not None
            answers = [{**a, "score": task.head.relevance(np.asarray([a["score"]]), False, model)} for a in answers]
        return outputs.tei_predict(answers, single)

    return Rewrite({"inputs": batch, "parameters": parameters}, reshape)


def _one_relevance(task: tasks.Task, model: Any) -> bool:
    """Whether the model's one output is a pair's relevance logit (a cross-encoder, not a stated regression)."""
    one = isinstance(model, Mapping) and len(model.get("id2label") or {}) <= 1 and not model.get("stated_regression")
    return one and _reranks(task, model)


def openai_embeddings(payload: Any, model: Any) -> Rewrite:
    """OpenAI's embeddings request: texts as they are; token arrays (a list of ids, or a list of such lists)
    decoded with the model's own tokenizer (TEI's reading of them: ids of the model's vocabulary)."""
    payload = _object(payload, "/v1/embeddings")
    _known(payload, OPENAI_FIELDS, "/v1/embeddings")
    if "input" not in payload:
        raise InputError('/v1/embeddings takes {"input": "a text"} or a list of texts; the body has no "input"')
    _route_parameters(task_of(model), "v1/embeddings", model)
    if model is None:  # (still loading: the request meets the model server's 503 as it is)
        return Rewrite(payload)
    return Rewrite({**payload, "input": _texts_of_tokens(payload["input"], model)})


def _texts_of_tokens(value: Any, model: Any) -> Any:
    """`value` with each token array (a non-empty list of ints) as the text its ids decode to."""
    if _is_tokens(value):
        return _decode(value, model)
    if isinstance(value, list) and any(_is_tokens(item) for item in value):
        return [_decode(item, model) if _is_tokens(item) else item for item in value]
    return value


def _is_tokens(value: Any) -> bool:
    return isinstance(value, list) and bool(value) and all(type(item) is int for item in value)


def _decode(ids: list[int], model: Any) -> str:
    tokenizer = model.get("tokenizer") if isinstance(model, Mapping) else None
    if tokenizer is None:
        raise InputError("token arrays are read with the model's own tokenizer, which this model does not expose")
    # The model reads at most max_length tokens of it: the ids past it are cut before decoding (three clients'
    # 2.9 M ids took 2.8 s each to decode, /ping waiting, where the model read 128).
    limit = model.get("max_length") if isinstance(model, Mapping) else None
    if isinstance(limit, int) and limit > 0:
        ids = ids[:limit]
    size = tokenizer.get_vocab_size() if hasattr(tokenizer, "get_vocab_size") else len(tokenizer)
    wrong = next((token for token in ids if not 0 <= token < size), None)
    if wrong is not None:
        raise InputError(
            f"token id {wrong} is outside the model's vocabulary (0 to {size - 1}): a token array holds ids of "
            "the model's own tokenizer, and an OpenAI tokenizer's are not (LangChain's OpenAIEmbeddings sends "
            "those unless check_embedding_ctx_length=False): send the texts themselves"
        )
    return str(tokenizer.decode(ids, skip_special_tokens=True))


def openai_models(model_id: str) -> dict[str, Any]:
    """OpenAI's model list: the one model this endpoint serves."""
    return {"object": "list", "data": [{"id": model_id, "object": "model", "created": 0, "owned_by": "byoc"}]}


def cohere_rerank(version: int, payload: Any, model: Any = None) -> Rewrite:
    """Cohere's rerank request (version 1, which Jina's clients send too, or 2) as TEI's rerank body, and its
    answer as Cohere's: each document's index and relevance score, best first (`top_n` of them), with the
    document's text where a version-1 request asks for it (`return_documents`, true by default as Jina's).
    What is refused is named as the client sent it (its route, "documents")."""
    route = f"/v{version}/rerank"
    payload = _object(payload, route)
    _known(payload, COHERE_FIELDS[version], route)
    task = task_of(model)
    if task is not None and not _reranks(task, model):
        raise InputError(f"{route} is not answered by {task.described}: it does not rerank; {_routes_of(task, model)}")
    documents = payload.get("documents")
    if not isinstance(payload.get("query"), str) or not isinstance(documents, list) or not documents:
        raise InputError(f'{route} takes {{"query": "a text", "documents": ["a text", ...]}}, with documents')
    fields = payload.get("rank_fields")
    if fields not in (None, ["text"]):
        raise InputError(f'"rank_fields" may only be ["text"]: a document is ranked by its text; got {fields!r}')
    texts = [_document_text(document, index) for index, document in enumerate(documents)]
    returned = version == 1 and payload.get("return_documents", True) is not False
    body: dict[str, Any] = {"query": payload["query"], "texts": texts, "return_text": returned}
    if payload.get("top_n") is not None:
        body["top_n"] = payload["top_n"]

    return Rewrite(body, lambda ranked: outputs.cohere(ranked, version, returned, payload.get("model")))


def _document_text(document: Any, index: int) -> str:
    """A document's text: the document itself, or a version-1 document object's "text"."""
    if isinstance(document, dict) and isinstance(document.get("text"), str):
        document = document["text"]
    if not isinstance(document, str):
        raise InputError(f'"documents"[{index}] must be a text, or an object with a "text"')
    if not valid_unicode(document):
        raise InputError(f'"documents"[{index}] is not valid Unicode text (a lone surrogate such as \\ud800)')
    return document


def info(model: Any, model_id: str, settings: Any) -> dict[str, Any]:
    """TEI's /info: the model, what kind it is (with its labels where it has any) and the server's limits."""
    task = task_of(model)
    labels = {str(index): label for index, label in sorted((model.get("id2label") or {}).items())} if task else {}
    kind = "custom" if task is None else task.name
    gives = set(task.head.kinds) if task is not None else set()
    if Kind.VECTOR in gives:
        model_type: dict[str, Any] = {"embedding": {"pooling": str(model.get("pooling") or "mean")}}
    elif gives & {Kind.SPARSE_TERMS, Kind.TOKEN_VECTORS}:
        model_type = {"embedding": {"pooling": kind}}
    else:
        kind = "reranker" if task is not None and _reranks(task, model) else "classifier" if task else kind
        model_type = {kind: {"id2label": labels, "label2id": {label: int(i) for i, label in labels.items()}}}
    return {
        "model_id": model_id,
        "model_sha": None,
        "model_dtype": str(model.get("precision") or "float32") if isinstance(model, Mapping) else "unknown",
        "model_type": model_type,
        "byoc_task": None if task is None else task.name,
        "max_concurrent_requests": settings.max_concurrency,
        "max_input_length": int(model.get("max_length") or 0) if isinstance(model, Mapping) else 0,
        "max_batch_tokens": None,
        "max_batch_requests": settings.max_batch,
        "max_client_batch_size": settings.max_inputs,
        "auto_truncate": True,
        "tokenization_workers": 1,
        "version": _version(),
        "sha": None,
        "docker_label": None,
    }


def _reranks(task: tasks.Task, model: Any) -> bool:
    try:
        task.head.check_rerank(model)
    except tasks.BadParameter:
        return False
    return True


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version  # (only /info asks)

    try:
        return version("byoc")
    except PackageNotFoundError:
        return "unknown"


def _object(payload: Any, route: str) -> dict[str, Any]:
    if not isinstance(payload, dict):
        raise InputError(f"{route} takes a JSON object; the body is {type(payload).__name__}")
    return {key: value for key, value in payload.items() if value is not None}  # (null: not sent)


def _known(payload: dict[str, Any], fields: tuple[str, ...], route: str) -> None:
    """A 400 naming a field the route does not read: sent, it would otherwise be ignored without a word."""
    unknown = [key for key in payload if key not in fields]  # (null fields are dropped first: _object)
    if unknown:
        raise InputError(
            f"{route} does not read {', '.join(repr(key) for key in unknown[:5])}: its fields are {', '.join(fields)}"
        )
