"""The routes of clients off SageMaker (`docker run` on ECS, EKS or a laptop), on a single-model endpoint, beside
`/invocations` and over the same path (byoc.serving.http.invocations: bounded bodies, slots, timeouts, batching
with every other request, JSON errors): Text Embeddings Inference's (`/embed`, `/embed_sparse`, `/embed_all`,
`/rerank`, `/predict`, `GET /info`, and `POST /`, where huggingface_hub's InferenceClient sends a URL model's
requests: `/invocations` itself), OpenAI's (`/v1/embeddings`, `GET /v1/models`) and Cohere's and Jina's rerank
(`/v1/rerank`, `/v2/rerank`). Each body is rewritten as the `/invocations` body asking the same, and a 200's
answer reshaped as the client reads it (byoc.serving.protocol.clients).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from byoc.serving.execution.model_server import ModelServer
from byoc.serving.http.invocations import Invocations, error
from byoc.serving.protocol import clients
from byoc.serving.protocol.request_errors import InputError
from byoc.serving.settings import ServeSettings

Rewriter = Callable[[Any, Any], clients.Rewrite]  # (the client's parsed body, the loaded model) -> the rewrite


def routes(settings: ServeSettings, invocations: Invocations, server: ModelServer) -> list[Route]:
    """The client routes of the one model `server` serves."""
    model_id = settings.model_dir.name

    def post(path: str, rewrite: Rewriter) -> Route:
        async def handle(request: Request) -> Response:
            return await invocations.handle_with(
                request, lambda body, run: _rewritten(request, body, rewrite, invocations, server)
            )

        return Route(path, handle, methods=["POST"])

    def get(path: str, answer: Callable[[], Any]) -> Route:
        async def handle(request: Request) -> Response:
            if not server.ready.is_set() or server.model is None:
                return error(503, "the model is still loading; retry when /ping answers 200", {"Retry-After": "1"})
            return JSONResponse(answer())

        return Route(path, handle, methods=["GET"])

    def tei(route: str) -> Rewriter:
        return lambda payload, model: clients.tei(route, payload, model)

    async def invoke(request: Request) -> Response:
        return await invocations.handle(request, server)

    return [
        Route("/", invoke, methods=["POST"]),
        *(post(f"/{route}", tei(route)) for route in clients.TEI_FIELDS),
        post("/v1/embeddings", clients.openai_embeddings),
        post("/v1/rerank", lambda payload, model: clients.cohere_rerank(1, payload, model)),
        post("/v2/rerank", lambda payload, model: clients.cohere_rerank(2, payload, model)),
        get("/info", lambda: clients.info(server.model, model_id, settings)),
        get("/v1/models", lambda: clients.openai_models(model_id)),
    ]


async def _rewritten(
    request: Request, body: bytes, rewrite: Rewriter, invocations: Invocations, server: ModelServer
) -> Response:
    """The client's request answered through `/invocations`' path, its 200 reshaped for the client. A large body
    or answer (a 1 GB asynchronous body, a long token array, 45 MB of a 1,000-class model's labels) is read and
    written off the event loop: /ping would wait on it."""
    try:
        rewritten, rewritten_body = await _off_loop_if(len(body) > INLINE, _parse, body, rewrite, server)
    except InputError as err:
        invocations.metrics.error("bad_input")
        return error(err.status, str(err))
    response = await invocations.answer(request, rewritten_body, server)
    if rewritten.reshape is None or response.status_code != 200 or "json" not in (response.media_type or ""):
        return response  # (an error, or the answer in another type the client's Accept asked for: as it is)
    return await _off_loop_if(len(response.body) > INLINE, _reshaped, response, rewritten.reshape)


async def _off_loop_if(large: bool, fn: Callable[..., Any], *args: Any) -> Any:
    return await asyncio.to_thread(fn, *args) if large else fn(*args)


def _reshaped(response: Response, reshape: Callable[[Any], Any]) -> Response:
    """The `/invocations` answer as the client reads it (a model's own output_fn's shape: as it is)."""
    try:
        return JSONResponse(reshape(json.loads(bytes(response.body))))
    except (ValueError, KeyError, TypeError, AttributeError):  # a model's own output_fn, in a shape of its own
        return response


INLINE = 64 * 1024  # bytes of body parsed on the event loop; above, on a thread


def _parse(body: bytes, rewrite: Rewriter, server: ModelServer) -> tuple[clients.Rewrite, bytes]:
    """The client's body as `/invocations` reads it, and that body written: InputError (a 400) for what is not
    JSON, or too deep."""
    try:
        payload = json.loads(body)
    except (ValueError, RecursionError) as err:  # (invalid JSON or UTF-8; nesting past Python's depth)
        raise InputError(f"the body is not valid JSON: {type(err).__name__}: {str(err)[:200]}") from None
    rewritten = rewrite(payload, server.model)
    return rewritten, json.dumps(rewritten.body).encode()


def not_found(paths: Callable[[], list[str]]) -> Callable[[Request, Exception], Awaitable[Response]]:
    """The app's answer to a route it does not have (404) or a method a route does not take (405): JSON, as
    every other error, naming the routes there are."""

    async def handle(request: Request, exc: Exception) -> Response:
        status = getattr(exc, "status_code", 404)
        what = "route" if status == 404 else f"{request.method} on this route"
        message = f"no {what}: {request.method} {request.url.path}; the routes are {', '.join(paths())}"
        return error(status, message, dict(getattr(exc, "headers", None) or {}))  # (a 405's Allow)

    return handle
